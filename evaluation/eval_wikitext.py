"""WikiText perplexity of a checkpoint, with a sliding window (docs/evaluation.md).

    python evaluation/eval_wikitext.py --checkpoint=out/ckpt.pt                      # HF wikitext-103-raw-v1 test
    python evaluation/eval_wikitext.py --checkpoint=out/ckpt.pt --data=test.txt --stride=256
    python evaluation/eval_wikitext.py --checkpoint=hf_llama_dir --data=wiki.parquet --window=512

The rows (a .txt file's lines, a .jsonl's or .parquet's `text`, or the HF test split) are
tokenized one by one and concatenated with no separator (`--join=rows`, the staged-training
convention) or joined with "\\n\\n" and tokenized once (`--join=text`, the HF guide's). Windows
of `--window` tokens (default: the model's max_seq_len) start every `--stride` tokens; each window
scores only the tokens no earlier window scored, so every token is scored exactly once, with up
to window - 1 tokens of context. With --bos (default; our models start documents with BOS) each
window is fed as [BOS] + its tokens and the first token of the stream is scored too;
--no-bos with stride = window is the plain non-overlapping block evaluation (the first token
of each block is context only).

Reported: token-level perplexity exp(sum NLL / scored tokens) (depends on the tokenizer) and
bits per UTF-8 byte of the text, sum NLL / (ln 2 * bytes) (comparable across tokenizers).
Last stdout line: {"ppl", "bpb", "tokens"}.

staged-training's commands work too, selected by a first argument `eval` or `train` (the
original's click subcommands, with its flags and their meaning; docs/evaluation.md, "The
staged-training repository's commands"):

    python evaluation/eval_wikitext.py eval --checkpoint-file out/ckpt.pt --dataset wikitext2 --block-size 512
    python evaluation/eval_wikitext.py eval --model-name gpt2 --dataset mmap --dataset-path val.bin
    python evaluation/eval_wikitext.py train train.bin val.bin logs/run1 --hidden-size 256 --num-layers 4
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinylab.core.config import Key, Schema
from tinylab.core.errors import UserError, cli_main
from tinylab.core.memory_budget import check_model_batch
from tinylab.eval.common import emit, load_for_args, load_hf_rows, read_rows
from tinylab.eval.perplexity import (
    batched,
    block_losses,
    group_texts_blocks,
    sliding_window_nll,
    token_stream,
    window_spans,
)
from tinylab.eval.staged_eval import (
    BOS_ID,
    CHECKPOINT_FILE,
    EOS_ID,
    MODEL_NAME,
    SKIP_LOADING_WEIGHTS,
    flag_argv,
    load_named_model,
    needs_tokenizer_for_ids,
    read_run_info,
    special_ids,
)
from tinylab.eval.token_files import TokenFile, check_special_ids, ordered_batches
from tinylab.interop import hub
from tinylab.schema import DEVICE, EVAL, TRAIN

SCHEMA = EVAL.derive("evaluation/eval_wikitext.py", sections=[("WikiText", [
    Key("data", "hf", "'hf' (wikitext-103-raw-v1 test via `datasets`) or a local text / .jsonl / .parquet file",
        nonempty=True, input=True),
    Key("stride", 0, "tokens between window starts; 0 = the window", range="[0, inf)"),
    Key("window", 0, "tokens per window; 0 = the model's max_seq_len", range="[0, inf)"),
    Key("join", "rows", "rows: tokenize rows one by one and concatenate | text: join with blank lines, tokenize once",
        choices=("rows", "text")),
    Key("bos", True, "prepend BOS to every window (--no-bos: the plain block evaluation)"),
    Key("max_rows", 0, "only the first N rows; 0 = all", range="[0, inf)"),
])])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "eval":
        return original_eval(argv[1:])
    if argv and argv[0] == "train":
        return original_train(argv[1:])
    return project_main(argv)


def project_main(argv):
    """The project's interface: --checkpoint, --data, the sliding window."""
    parser = SCHEMA.argparser(__doc__.split("\n\n")[0])
    parser.epilog = ("staged-training's interface: `eval_wikitext.py eval --help` (block evaluation of a checkpoint, "
                     "an HF model or token files) and `eval_wikitext.py train --help`")
    a = SCHEMA.parse_args(argv, parser)
    model, ckpt, tok = load_for_args(a)
    window = a.window or model.params.max_seq_len
    stride = a.stride or window
    if stride > window:
        raise UserError(f"--stride={stride} exceeds the window of {window} tokens (tokens would go unscored)")
    if window > model.params.max_seq_len:
        raise UserError(f"--window={window} exceeds the model's max_seq_len={model.params.max_seq_len}")
    rows = load_hf_rows("wikitext", "wikitext-103-raw-v1", "test") if a.data == "hf" else read_rows(a.data)
    if a.max_rows:
        rows = rows[:a.max_rows]
    ids, n_bytes = token_stream(rows, tok, a.join)
    if len(ids) < 2:
        raise UserError(f"{a.data} holds too little text to evaluate ({len(ids)} tokens)")
    spans = window_spans(len(ids), window, stride, a.bos)  # the first batch: the longest windows
    check_model_batch(model, min(a.batch_size, len(spans)), max(e - b for b, e, _ in spans), "--batch_size")
    nll, n = sliding_window_nll(model, ids, window, stride, tok.bos_id if a.bos else None, a.batch_size)
    ppl, bpb = math.exp(nll / n), nll / (math.log(2) * n_bytes)
    print(f"data {a.data}: {len(rows)} rows, {n_bytes:,} bytes, {len(ids):,} tokens ({a.join}); "
          f"window {window}, stride {stride}, bos {a.bos}")
    print(f"scored tokens {n:,}  mean NLL {nll / n:.4f} nats  perplexity {ppl:.3f}  bits/byte {bpb:.4f}")
    emit({"ppl": ppl, "bpb": bpb, "tokens": n}, a.out)


# ---------------------------------------------------------------------- staged-training's `eval`

EVAL_HELP = """staged-training's `eval`: the mean loss over non-overlapping blocks (docs/evaluation.md).

Texts (wikitext2: wikitext-103-raw-v1's test split, as the original loaded under that name;
openwebtext: the 1% test split of `openwebtext` by train_test_split(seed=17)) are tokenized row by
row (the text's own tokens, no special tokens), concatenated and cut into blocks of --block-size
exactly as the original's datasets.map(group_texts) did (per 1000-row batch, remainder dropped);
a token file (mmap) gives blocks [BOS] + block_size - 2 tokens + [EOS]. Each block is scored alone
(block_size - 1 predictions); reported: "Final loss" = the mean over blocks of each block's mean
loss, ppl = exp(loss). Last stdout line: {"loss", "ppl", "blocks", "tokens"}."""

EVAL_SCHEMA = EVAL.derive(
    "evaluation/eval_wikitext.py eval", drop=["checkpoint"],
    keys=[EVAL.keys["batch_size"].replace(default=32, aliases=("batch-size",),
                                          help="blocks per batch (the original's default); --max-steps counts these")],
    sections=[("staged-training's eval", [
        MODEL_NAME, CHECKPOINT_FILE, SKIP_LOADING_WEIGHTS,
        Key("dataset", "wikitext2", "wikitext2 (wikitext-103-raw-v1 test, from the hub) | openwebtext (its 0.01 test "
            "split, from the hub) | mmap (a flat uint16 token file: --dataset-path)",
            choices=("wikitext2", "openwebtext", "mmap")),
        Key("dataset_path", "", "the token file (only with --dataset=mmap)", aliases=("dataset-path",), input=True),
        Key("block_size", 1024, "tokens per block (at most the model's context)", range="[2, inf)",
            aliases=("block-size",)),
        Key("max_steps", 0, "evaluate only the first N batches; 0 = all", range="[0, inf)", aliases=("max-steps",)),
        BOS_ID, EOS_ID,
    ])])

# the original's datasets (its tools/*_dataset.py): hub name, config, split, datasets.map num_proc
WIKITEXT2 = ("wikitext", "wikitext-103-raw-v1", "test", 1)
OPENWEBTEXT = ("openwebtext", None, "train", 8)
OPENWEBTEXT_TEST = dict(test_size=0.01, seed=17)  # train_test_split(shuffle=True, ...)["test"]
OFFLINE_FIX = ("offline, use --dataset=mmap --dataset-path=FILE (tokens), or the project's interface with a "
               "local text file (--data=PATH)")


def hub_rows(dataset: str) -> list:
    name, config, split, _ = WIKITEXT2 if dataset == "wikitext2" else OPENWEBTEXT
    ds = hub.load_dataset(name, config, split, fix=OFFLINE_FIX)
    if dataset == "openwebtext":
        ds = ds.train_test_split(shuffle=True, **OPENWEBTEXT_TEST)["test"]
    if "text" not in ds.column_names:
        raise UserError(f"dataset {name} has no 'text' column")
    return list(ds["text"])


def original_eval(argv):
    a = EVAL_SCHEMA.parse_args(flag_argv(argv, EVAL_SCHEMA), EVAL_SCHEMA.argparser(EVAL_HELP))
    mmap = a.dataset == "mmap"
    if a.dataset_path and not mmap:  # the original's click.UsageError
        raise UserError(f"--dataset-path is only valid with --dataset=mmap (got --dataset={a.dataset})")
    if mmap and not a.dataset_path:
        raise UserError("--dataset=mmap needs --dataset-path=FILE (a flat uint16 token file)")
    tf = TokenFile(a.dataset_path, "--dataset-path") if mmap else None
    if tf is not None:
        tf.check_chunks(a.block_size)
    info = read_run_info(a.checkpoint_file) if a.checkpoint_file and os.path.exists(a.checkpoint_file) else None
    print("[1/3] Loading tokenizer and model...")
    loaded = load_named_model(a, need_tokenizer=not mmap or needs_tokenizer_for_ids(a, info))
    model, tok = loaded.model, loaded.tokenizer
    if a.block_size > model.params.max_seq_len:
        raise UserError(f"--block-size={a.block_size} exceeds the model's max_seq_len={model.params.max_seq_len}")
    print(f"model {loaded.name}")

    print("[2/3] Preprocessing data...")
    ignore_id = None
    if mmap:
        bos, eos = special_ids(a, loaded)
        check_special_ids(bos, eos, model.params.vocab_size, "--bos-id / --eos-id, staged_training.json or the tokenizer")
        n = tf.n_chunks(a.block_size)
        n_eval = min(n, a.max_steps * a.batch_size) if a.max_steps else n
        tf.check_ids(model.params.vocab_size, stop=n_eval * (a.block_size - 2))
        batches = ordered_batches(tf, a.block_size, a.batch_size, bos, eos, a.max_steps)
        # the original's DataCollatorForLanguageModeling: targets equal to the tokenizer's pad id are not scored
        ignore_id = getattr(tok, "pad_id", None) if loaded.kind != "ours" else None
        print(f"data {a.dataset_path}: {tf.n_tokens:,} tokens, {n:,} blocks of {a.block_size} "
              f"([BOS {bos}] + {a.block_size - 2} tokens + [EOS {eos}])")
    else:
        rows = hub_rows(a.dataset)
        num_proc = (WIKITEXT2 if a.dataset == "wikitext2" else OPENWEBTEXT)[3]
        blocks = group_texts_blocks(tok.encode_batch(rows, bos=False), a.block_size, num_proc)
        n_eval = min(len(blocks), a.max_steps * a.batch_size) if a.max_steps else len(blocks)
        batches = batched(blocks, a.batch_size, a.max_steps)
        print(f"data {a.dataset}: {len(rows):,} rows, {len(blocks):,} blocks of {a.block_size} tokens")

    print("[3/3] Evaluating model on data...")
    r = block_losses(model, batches, ignore_id=ignore_id, total=math.ceil(n_eval / a.batch_size))
    print(f"{r['blocks']:,} blocks, {r['tokens']:,} predictions scored" +
          (f"; the mean over batches (the original's figure with a short last batch) is {r['batch_mean_loss']:.4f}"
           if abs(r["batch_mean_loss"] - r["loss"]) > 1e-12 else ""))
    print(f"Done! Final loss: {r['loss']:.4f} (ppl = {r['ppl']:.4f})")
    emit({"loss": r["loss"], "ppl": r["ppl"], "blocks": r["blocks"], "tokens": r["tokens"]}, a.out)


# ---------------------------------------------------------------------- staged-training's `train`

TRAIN_HELP = """staged-training's `train`: train our model on token files and validate, with the one
training loop (docs/evaluation.md; tinylab/eval/staged_train.py). Positional: TRAIN_DATASET_PATH
VALIDATION_DATASET_PATH LOG_DIR (the run folder: new or empty, or --recover)."""

COUNT, NONNEG, FRACTION = "[1, inf)", "[0, inf)", "[0, 1)"


def _k(name, default, help, **kw):
    """A key spelled as the original's flag (--grad-accum) and as the project's (--grad_accum)."""
    return Key(name, default, help, aliases=(name.replace("_", "-"),) if "_" in name else (), **kw)


TRAIN_SCHEMA = Schema("evaluation/eval_wikitext.py train", [("staged-training's train", [
    _k("block_size", 1024, "tokens per block ([BOS] + block_size - 2 tokens + [EOS]); also the model's context",
       range="[3, inf)"),
    _k("batch_size", 32, "blocks per micro-batch (training and validation)", range=COUNT),
    _k("grad_accum", 1, "micro-batches per optimizer step", range=COUNT),
    _k("num_heads", 4, "attention heads", range=COUNT),
    _k("num_layers", 4, "transformer blocks", range=COUNT),
    _k("hidden_size", 256, "model width", range=COUNT),
    _k("lr", None, "peak learning rate; default 0.003239 - 0.0001395 ln(N), N = non-embedding parameters",
       type=float, range="(0, inf)"),
    _k("adam_epsilon", 1e-6, "AdamW epsilon", range="(0, inf)"),
    _k("adam_beta1", 0.9, "AdamW beta1", range=FRACTION),
    _k("adam_beta2", 0.95, "AdamW beta2", range=FRACTION),
    _k("warmup_steps", 3000, "linear LR warmup steps (then linear decay to 0 at --train-steps)", range=NONNEG),
    _k("train_steps", 100000, "optimizer steps", range=COUNT),
    _k("validation_steps", 50, "validation batches (the first ones of the validation file)", range=COUNT),
    _k("validate_every", 100, "validate every N steps (and at the start and the end)", range=COUNT),
    _k("checkpoint_every", 100, "write LOG_DIR/ckpt.pt every N steps (and at the end)", range=COUNT),
    _k("wandb_entity", "", "W&B entity; any --wandb-* flag turns W&B logging on (metrics.jsonl is always written)"),
    _k("wandb_project", "", "W&B project ('' = staged-training when W&B is on)"),
    _k("amp", False, "fp16 mixed precision with a gradient scaler (CUDA)"),
    _k("recover", False, "continue the run in LOG_DIR exactly where its checkpoint left it"),
    _k("recover_from", "", "with --recover: copy this run folder into the empty LOG_DIR first"),
    _k("init_seed", 42, "seed of the initial weights", range=NONNEG),
    _k("data_seed", 42, "seed of the training data order (and dropout)", range=NONNEG),
    _k("wandb_tags", "", "comma-separated W&B tags"),
]), ("this project's additions", [
    _k("vocab_size", 0, "model vocabulary; 0 = the largest id in the two token files (and the BOS / EOS ids) + 1 "
       "(there is no GPT-2 tokenizer here)", range="[0, 65536]"),
    _k("bos_id", 1, "BOS id of the blocks (this project's tokenizers: 1; GPT-2-tokenized files: 50256)",
       range="[0, 65535]"),
    _k("eos_id", 2, "EOS id of the blocks (this project's tokenizers: 2; GPT-2-tokenized files: 50256)",
       range="[0, 65535]"),
    DEVICE,
])])


def original_train(argv):
    from tinylab.eval.staged_train import run_train  # the training stack only for this subcommand
    parser = TRAIN_SCHEMA.argparser(TRAIN_HELP)
    for name in ("train_dataset_path", "validation_dataset_path"):
        parser.add_input(name, metavar=name.upper())
    parser.add_output("log_dir", metavar="LOG_DIR", kind="run")  # a run folder: staged_train's RunDir
    run_train(TRAIN_SCHEMA.parse_args(flag_argv(argv, TRAIN_SCHEMA), parser), TRAIN)  # the run is a train.py run


if __name__ == "__main__":
    cli_main(main)
