"""`tinystories.py train_vocab`: a sentencepiece BPE tokenizer <data_cache_dir>/tok{V}.model
(+ .vocab) trained on the template text of the first raw shards, with the original's options.
The files appear only when training succeeded (trained in a temp folder, renamed)."""
import os
import shutil
import sys
import tempfile

from tinylab.core.errors import UserError
from tinylab.core.outputs import guard_file
from tinylab.core.progress import progress
from tinylab.data.records import MAX_VOCAB, STREAM_VOCAB_TEXT, load_raw_shard, raw_shards, shard_rng
from tinylab.data.template import make_text
from tinylab.data.workers import default_workers


def train_vocab(data_cache_dir: str, vocab_size: int, vocab_shards: int = 10, seed: int = 0,
                keep_text: bool = False, force: bool = False):
    """Train a sentencepiece BPE tokenizer <cache>/tok{V}.model on the template text of the first
    `vocab_shards` raw shards (the test shard included, as for the released tok8192). An existing
    tokenizer (perhaps the released one, copied in) is replaced only with `force`."""
    if vocab_size <= 0:
        raise UserError("train_vocab needs --vocab_size > 0 (0 means the Llama 2 tokenizer, which is not trained here)")
    if vocab_size > MAX_VOCAB:
        raise UserError(f"--vocab_size={vocab_size} does not fit the uint16 .bin format (at most {MAX_VOCAB})")
    if vocab_shards < 1:
        raise UserError(f"--vocab_shards must be >= 1, got {vocab_shards}")
    shards = raw_shards(data_cache_dir)[:vocab_shards]
    prefix = os.path.join(data_cache_dir, f"tok{vocab_size}")
    _check_outputs(data_cache_dir, prefix, keep_text, force)
    try:
        tmp = tempfile.mkdtemp(prefix=".tmp_vocab_", dir=data_cache_dir)
    except OSError as e:  # named by the tokenizer asked for, not by a temp name that never existed
        raise OSError(e.errno, e.strerror, prefix + ".model") from None
    try:
        text_file = os.path.join(tmp, "tiny.txt")
        _write_text(text_file, shards, seed)
        print(f"training a {vocab_size}-piece BPE vocabulary on {os.path.getsize(text_file) / 1e6:.1f} MB of text")
        _train(text_file, os.path.join(tmp, f"tok{vocab_size}"), vocab_size)
        os.replace(os.path.join(tmp, f"tok{vocab_size}.vocab"), prefix + ".vocab")
        os.replace(os.path.join(tmp, f"tok{vocab_size}.model"), prefix + ".model")
        if keep_text:
            os.replace(text_file, os.path.join(data_cache_dir, "tiny.txt"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"trained tokenizer is in {prefix}.model")
    return prefix + ".model"


def _check_outputs(data_cache_dir, prefix, keep_text, force):
    outputs = [(prefix + ".model", "sentencepiece"), (prefix + ".vocab", "sentencepiece")] + \
        ([(os.path.join(data_cache_dir, "tiny.txt"), "text")] if keep_text else [])
    existing = [p for p, _ in outputs if os.path.lexists(p)]
    if existing and not force:
        raise UserError(f"{existing[0]} already exists (datasets made with it would no longer match a new one); "
                        f"use --force to replace it")
    for path, kind in outputs:  # with --force: still never another kind of file, or a run's
        guard_file(path, kind, force, flag="train_vocab output")


def _write_text(text_file, shards, seed):
    """One template text per example, a line each (the RNG stream is the vocab text's own)."""
    with open(text_file, "w", encoding="utf-8") as out:
        for index, path in enumerate(progress(shards, desc="writing vocab text", unit="shard")):
            rng = shard_rng(seed, index, STREAM_VOCAB_TEXT)
            for example in load_raw_shard(path):
                out.write(make_text(example, rng) + "\n")


def _train(text_file, model_prefix, vocab_size):
    import sentencepiece as spm

    # the original's options (docs/data.md, "Tokenizers"); its self_test_sample_size=0 is the
    # default, and newer sentencepiece versions print a deprecation warning when it is passed,
    # so it is left out
    try:
        spm.SentencePieceTrainer.train(
            input=text_file, model_prefix=model_prefix, model_type="bpe",
            vocab_size=vocab_size, input_format="text", character_coverage=1.0,
            num_threads=default_workers(), split_digits=True, allow_whitespace_only_pieces=True,
            byte_fallback=True, unk_surface=r" \342\201\207 ", normalization_rule_name="identity",
            minloglevel=0 if sys.stderr.isatty() else 1)  # its log is the progress display
    except RuntimeError as e:  # e.g. a vocabulary too large for the text, or too small for its characters
        reason = str(e).strip().splitlines()[-1].split("] ")[-1]  # without the C++ source location
        raise UserError(f"sentencepiece could not train {vocab_size} pieces: {reason}") from None
