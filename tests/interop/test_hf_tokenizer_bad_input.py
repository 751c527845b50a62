"""Bad input for the HF export's tokenizer (tests/test_bad_input.py's conventions): a sentencepiece
model the converter cannot reproduce exactly is one `error:` line from export.py, exit 2, before
anything is written; an earlier export in the output folder is left as it was."""
import os

import pytest
from conftest import TOK8192, run_main, save_tiny_checkpoint
from conftest import tiny_model as shared_tiny_model
from test_bad_input import assert_error, assert_nothing_lost, snapshot
from test_hf_tokenizer import EDGE_TEXTS

from tinylab.core.errors import UserError
from tinylab.interop import hf_tokenizer

STORY = ("Once upon a time, there was a little girl named Lily. She liked to play in the park with her dog. "
         "One day, the dog found a big red ball under a tree, and they played until the sun went down.")


def train_spm(folder, name, **options):
    import sentencepiece as spm
    text = folder / f"{name}.txt"
    text.write_text("\n".join([STORY] * 20 + [t for t in EDGE_TEXTS if t.strip()]), encoding="utf-8")
    settings = dict(model_type="bpe", vocab_size=400, hard_vocab_limit=False, character_coverage=1.0, byte_fallback=True,
                    normalization_rule_name="identity", minloglevel=2, num_threads=1)
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / name), **{**settings, **options})
    return str(folder / f"{name}.model")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Sentencepiece models the converter refuses, and a checkpoint to export with them."""
    root = tmp_path_factory.mktemp("hftok_bad")
    refused = {
        "unigram": (train_spm(root, "unigram", model_type="unigram"), "it is a unigram model"),
        "nfkc_cf": (train_spm(root, "nfkc_cf", normalization_rule_name="nfkc_cf"),
                    "its normalization rule is 'nfkc_cf' (converted: identity, nmt_nfkc)"),
        "user_defined": (train_spm(root, "user", user_defined_symbols=["<sep>"]), "it has user-defined symbols"),
    }
    ckpt = save_tiny_checkpoint(root / "ckpt.pt", shared_tiny_model(vocab_size=400))
    return refused, str(ckpt)


@pytest.mark.parametrize("case", ["unigram", "nfkc_cf", "user_defined"])
def test_unconvertible_tokenizer_is_refused_before_anything_is_written(tmp_path, models, case):
    refused, ckpt = models
    model_path, fragment = refused[case]
    out = tmp_path / "hf"
    proc = run_main("export.py", [str(out), "--version=-1", f"--checkpoint={ckpt}", f"--tokenizer={model_path}"])
    assert_error(proc, 2, f"cannot convert {model_path} to a Hugging Face tokenizer", fragment)
    assert not out.exists() and os.listdir(tmp_path) == []


def test_refused_tokenizer_leaves_an_earlier_export_as_it_was(tmp_path, models):
    refused, ckpt = models
    out = tmp_path / "hf"
    run_main("export.py", [str(out), "--version=-1", f"--checkpoint={ckpt}", f"--tokenizer={TOK8192}"], check=True)
    before = snapshot(tmp_path)
    proc = run_main("export.py", [str(out), "--version=-1", f"--checkpoint={ckpt}", "--force",
                                  f"--tokenizer={refused['unigram'][0]}"])
    assert_error(proc, 2, "it is a unigram model")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


def test_damaged_tokenizer_file(tmp_path, models):
    _, ckpt = models
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"\xff\x00 not a protobuf")
    with pytest.raises(UserError, match="not a sentencepiece model"):
        hf_tokenizer.tokenizer_files(str(garbage), 64)
    before = snapshot(tmp_path)
    proc = run_main("export.py", [str(tmp_path / "hf"), "--version=-1", f"--checkpoint={ckpt}", f"--tokenizer={garbage}"])
    assert_error(proc, 2, str(garbage), "not a sentencepiece model")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)
