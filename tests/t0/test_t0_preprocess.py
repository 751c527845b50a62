"""`finetune_t0.py --preprocess` as Megatron-DeepSpeed's tools/preprocess_data.py (t0loading):
Megatron's Encoder.encode re-implemented here on the Hugging Face tokenizer's own ids, the files
read back by Megatron's MMapIndexedDataset logic transcribed in test_megatron_data.py (meg_read:
magic, version, dtype code, sizes, pointers, doc_idx), one file pair per json key, the
recipe's two passes (inputs; then targets with --append-eod --prepend-space) into one prefix."""
import json
import os

import numpy as np
import pytest
from conftest import assert_one_line_error, run_main
from test_megatron_args import hf_tokenizer_folder
from test_megatron_data import meg_read

from tinylab.t0.mixture import Source
from tinylab.t0.sources.megatron import read_indexed

RECORDS = [{"inputs": "Is the sky blue? Answer:", "targets": "yes"},
           {"inputs": "Once upon a time, a dog", "targets": " ran home."},
           {"inputs": "blank target", "targets": "   "},  # skipped in every pass (the halves stay aligned)
           {"inputs": "Tom had a red ball. What colour was it?", "targets": "red"}]
KEPT = [RECORDS[i] for i in (0, 1, 3)]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """A local HF tokenizer folder (8192 tokens) and one with 57,400 more pieces in its vocabulary
    (65,592: int32); no merge makes them, so every text's ids are the small one's. (Pieces in the
    vocabulary, not add_tokens: 57,400 added tokens take seconds to load, each time.)"""
    root = tmp_path_factory.mktemp("hf")
    small = hf_tokenizer_folder(str(root / "tok"))
    hf_tokenizer_folder(str(root / "big"), [f"<x{i}>" for i in range(57_400)])
    data = root / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return {"small": small, "big": str(root / "big"), "data": str(data)}


def megatron_encode(tok, text, prepend_space=False, append_eod=False, append_bos=False):
    """tools/preprocess_data.py Encoder.encode for one key (IdentitySplitter: one sentence):
    tokenize = tokenizer.encode (tokenizer.py:350), skipped if empty, eod = eos_token_id."""
    if prepend_space:
        text = f" {text}"
    doc_ids = []
    for sentence in [text]:
        sentence_ids = tok.encode(sentence)
        if len(sentence_ids) > 0:
            doc_ids.append(sentence_ids)
    if len(doc_ids) > 0:
        if append_eod:
            doc_ids[-1].append(tok.eos_token_id)
        elif append_bos:
            doc_ids[-1].append(tok.bos_token_id)
    return doc_ids


def pass_argv(hf, prefix, key, *extra, tok="small"):
    """One run of the xP3 recipe (bigscience data/xp3/xp3_jsonl_to_meg.slurm:83-100), Megatron's spelling."""
    return ["--preprocess", "--input", hf["data"], "--output-prefix", prefix, "--dataset-impl", "mmap",
            "--json-key", key, "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", hf[tok],
            "--workers", "35", *extra]


def check_key_file(path, tok, texts, dtype, **flags):
    """The file as Megatron's reader sees it, against Megatron's encoding of each record."""
    got_dtype, sizes, pointers, doc_idx, items = meg_read(path)
    want = [ids for t in texts for ids in megatron_encode(tok, t, **flags)]  # one item per document
    assert got_dtype == dtype
    assert [x.tolist() for x in items] == want
    assert sizes.tolist() == [len(w) for w in want]
    assert pointers.tolist() == [sum(len(w) for w in want[:i]) * np.dtype(dtype).itemsize for i in range(len(want))]
    assert doc_idx.tolist() == list(range(len(want) + 1))


@pytest.mark.slow
def test_two_pass_recipe_builds_one_prefix(hf, tmp_path):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(hf["small"])
    prefix = str(tmp_path / "xp3_en")
    first = run_main("finetune_t0.py", pass_argv(hf, prefix, "inputs"))
    assert first.returncode == 0, first.stderr
    assert sorted(os.listdir(tmp_path)) == ["xp3_en_inputs_document.bin", "xp3_en_inputs_document.idx"]
    second = run_main("finetune_t0.py", pass_argv(hf, prefix, "targets", "--append-eod", "--prepend-space"))
    assert second.returncode == 0, second.stderr  # the first pass's files are not this pass's outputs
    assert "wrote 3 examples (1 with empty inputs or targets skipped)" in second.stdout
    check_key_file(prefix + "_inputs_document", tok, [r["inputs"] for r in KEPT], np.uint16)
    check_key_file(prefix + "_targets_document", tok, [r["targets"] for r in KEPT], np.uint16,
                   prepend_space=True, append_eod=True)
    eos = tok.eos_token_id
    assert eos is not None and all(int(x[-1]) == eos for x in meg_read(prefix + "_targets_document")[4])
    # the prefix is a T0 source here: example i is item i of both halves
    pairs = read_indexed(Source(name="x", path=prefix), len(tok))
    assert [(list(a), list(b)) for a, b in pairs] == [
        (tok.encode(r["inputs"]), tok.encode(" " + r["targets"]) + [eos]) for r in KEPT]
    # each pass guards its own files: a repeated pass is refused, with --overwrite=True replaced
    before = {f: open(tmp_path / f, "rb").read() for f in os.listdir(tmp_path)}
    assert_one_line_error(run_main("finetune_t0.py", pass_argv(hf, prefix, "inputs")),
                          "xp3_en_inputs_document.bin", "already exists", "--overwrite=True")
    assert {f: open(tmp_path / f, "rb").read() for f in os.listdir(tmp_path)} == before
    again = run_main("finetune_t0.py", pass_argv(hf, prefix, "inputs", "--overwrite=True"))
    assert again.returncode == 0 and {f: open(tmp_path / f, "rb").read() for f in os.listdir(tmp_path)} == before


@pytest.mark.slow
@pytest.mark.parametrize("flags", [(), ("--append-eod",), ("--append-bos",), ("--append-eod", "--append-bos"),
                                   ("--prepend-space",)])
def test_eod_only_when_asked(hf, tmp_path, flags):
    """Megatron's Encoder: EOD with --append-eod, else BOS with --append-bos, else nothing."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(hf["small"])
    prefix = str(tmp_path / "p")
    proc = run_main("finetune_t0.py", pass_argv(hf, prefix, "targets", *flags))
    assert proc.returncode == 0, proc.stderr
    check_key_file(prefix + "_targets_document", tok, [r["targets"] for r in KEPT], np.uint16,
                   prepend_space="--prepend-space" in flags, append_eod="--append-eod" in flags,
                   append_bos="--append-bos" in flags)


@pytest.mark.slow
def test_dtype_follows_the_vocabulary(hf, tmp_path):
    """best_fitting_dtype(len(tokenizer)): uint16 below 65,500 tokens, int32 (code 4) from there."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(hf["big"])
    assert len(tok) >= 65_500
    prefix = str(tmp_path / "big")
    proc = run_main("finetune_t0.py", pass_argv(hf, prefix, "inputs", tok="big") + ["--json-keys", "inputs", "targets"])
    assert proc.returncode == 0, proc.stderr
    for key in ("inputs", "targets"):
        check_key_file(f"{prefix}_{key}_document", tok, [r[key] for r in KEPT], np.int32)
        assert open(f"{prefix}_{key}_document.idx", "rb").read()[17] == 4  # the dtype code byte


def test_checkpoint_tokenizer_passes_equal_one_pass(t0_setup, tmp_path):
    """With the checkpoint's tokenizer (training's tokenisation), --json-keys inputs then targets
    writes byte for byte the files of one pass over both."""
    mixture, base = t0_setup
    src = os.path.join(os.path.dirname(mixture), "hero_train.jsonl")
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    assert run_main("finetune_t0.py", ["--preprocess", f"--input={src}", f"--output_prefix={one}",
                                       f"--model_dir={base}"]).returncode == 0
    for key in ("inputs", "targets"):
        proc = run_main("finetune_t0.py", ["--preprocess", f"--input={src}", f"--output_prefix={two}",
                                           f"--model_dir={base}", f"--json_keys={key}"])
        assert proc.returncode == 0, proc.stderr
    for suffix in ("_inputs_document.bin", "_inputs_document.idx", "_targets_document.bin", "_targets_document.idx"):
        assert open(one + suffix, "rb").read() == open(two + suffix, "rb").read()
