"""Bad input to train.py's document_mask / document_positions, against the project's standard
(tests/test_bad_input.py): one `error:` line, exit 2, nothing written, an existing run untouched."""
import os

import pytest
from conftest import run_main
from test_bad_input import assert_error, assert_nothing_lost, snapshot

from tinylab.core import memory_budget

VOCAB = 1024


def argv(corpus, out, **over):
    cfg = dict(data_cache_dir=corpus, vocab_size=VOCAB, out_dir=out, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
               multiple_of=16, max_seq_len=64, batch_size=4, max_iters=2, warmup_iters=1, eval_interval=2, eval_iters=1,
               max_new_tokens=0, device="cpu", dtype="float32")
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()]


@pytest.mark.parametrize("over, fragments", [
    (dict(document_positions=True), ["document_positions=True needs document_mask=True"]),
    (dict(document_mask="yes"), ["--document_mask:", "expects bool", "got str 'yes'"]),
    (dict(document_positions=2, document_mask=True), ["--document_positions:", "expects bool"]),
    (dict(document_mask=True, probes=True), ["probes=True trains heads", "document_mask does not apply"]),
    (dict(document_mask=True, lenses=True), ["lenses=True trains heads", "document_mask does not apply"]),
], ids=["positions-without-mask", "mask-not-a-bool", "positions-not-a-bool", "with-probes", "with-lenses"])
def test_refused_before_anything_is_written(lab_corpus, tmp_path, over, fragments):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = snapshot(tmp_path, lab_corpus.cache_dir)
    proc = run_main("train.py", argv(lab_corpus.cache_dir, str(out), **over), cwd=str(tmp_path))
    assert_error(proc, 2, *fragments)
    assert_nothing_lost(before, snapshot(tmp_path, lab_corpus.cache_dir), nothing_new=True)


def test_a_mask_that_does_not_fit_is_refused_with_its_size(lab_corpus, tmp_path, monkeypatch):
    # 64 windows of 1024 tokens: the dense additive mask alone is 64 x 1024^2 x 5 bytes = 320 MiB
    big = dict(batch_size=64, max_seq_len=1024)
    monkeypatch.setattr(memory_budget, "available_memory", lambda device: (200 * 2 ** 20, "this machine has 200.0 MiB"))
    before = snapshot(tmp_path, lab_corpus.cache_dir)
    proc = run_main("train.py", argv(lab_corpus.cache_dir, str(tmp_path / "run"), document_mask=True, **big),
                    cwd=str(tmp_path))
    assert_error(proc, 2, "training needs at least", "document attention mask 320.0 MiB", "batch_size=64")
    assert_nothing_lost(before, snapshot(tmp_path, lab_corpus.cache_dir), nothing_new=True)
    assert not os.path.exists(tmp_path / "run")
