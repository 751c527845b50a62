"""Bad input for train.py's study keys (same_batch_accumulation, warmup_formula, eval_batch_sizes,
generation_prompt_split) and compat: one `error:` line naming the key, exit 2, nothing written
(tests/test_bad_input.py's rules)."""
import os

import pytest
from conftest import run_main
from test_bad_input import assert_error, assert_nothing_lost, snapshot

CASES = [
    ("--same_batch_accumulation=maybe", ("same_batch_accumulation",)),
    ("--warmup_formula=llama2c", ("warmup_formula", "nanogpt", "original")),
    ("--eval_batch_sizes=0", ("eval_batch_sizes", "own", "batch_size")),
    ("--generation_prompt_split=valid", ("generation_prompt_split", "test", "train")),
    ("--compat=study", ("compat", "fixed", "original")),
]


@pytest.mark.parametrize("flag, fragments", CASES, ids=[c[0] for c in CASES])
def test_train_study_keys(lab_corpus, tmp_path, flag, fragments):
    out = str(tmp_path / "out")
    argv = [f"--data_cache_dir={lab_corpus.cache_dir}", "--vocab_size=1024", f"--out_dir={out}", "--dim=32",
            "--n_layers=1", "--n_heads=4", "--max_seq_len=32", "--batch_size=2", "--max_iters=1", "--device=cpu",
            "--compat=original", flag]
    before = snapshot(tmp_path, lab_corpus.cache_dir)
    proc = run_main("train.py", argv, cwd=str(tmp_path))
    assert_error(proc, 2, *fragments)
    assert not os.path.exists(out)
    assert_nothing_lost(before, snapshot(tmp_path, lab_corpus.cache_dir), nothing_new=True)
