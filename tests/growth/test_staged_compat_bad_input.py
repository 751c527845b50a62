"""Bad input for staged training's compat=original flags and the Kaplan planner, in
tests/test_bad_input.py's style: one `error:` line, exit 2, nothing written or changed."""
import pytest
import torch
from conftest import run_main, tiny_model
from test_bad_input import assert_error, assert_nothing_lost, snapshot

from tinylab.core.checkpoint import model_args_dict
from tinylab.schema import TRAIN


@pytest.fixture
def small_ckpt(tmp_path):
    m = tiny_model(seed=0, vocab_size=37, max_seq_len=8)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": m.state_dict(), "model_args": model_args_dict(m), "iter_num": 0, "config": TRAIN.defaults(),
                "optimizer": None}, path)
    return str(path)


GROW_CASES = [
    (["--width_moments=diagonal"], "--width_moments"),
    (["--depth_id=zero"], "--depth_id"),
    (["--compat=staged"], "--compat"),
    (["--mode=exact", "--width_moments=original"], "width_moments=original"),
    (["--mode=exact", "--compat=original"], "no exact mode"),
]


@pytest.mark.parametrize("flags,fragment", GROW_CASES)
def test_grow_flags(tmp_path, small_ckpt, flags, fragment):
    before = snapshot(tmp_path)
    proc = run_main("grow.py", ["--doubling=weights", f"--resume={small_ckpt}", f"--out_dir={tmp_path / 'out'}", *flags])
    assert_error(proc, 2, fragment)
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


PLAN_CASES = [
    (["--plan", "--law=kaplan"], "--law=kaplan needs --budget"),
    (["--plan", "--law=kaplan", "--budget=1e20", "--target_loss=3"], "one of them"),
    (["--plan", "--law=chinchilla", "--budget=1e20"], "--law"),
    (["--plan", "--law=kaplan", "--budget=1e20", "--continue_at=loss"], "takes no --continue_at"),
    (["--plan", "--law=kaplan", "--budget=-1"], "--budget"),
    (["--law=kaplan"], "belongs to --plan"),
    (["--plan", "--budget=1e20"], "or --law=kaplan"),
]


@pytest.mark.parametrize("flags,fragment", PLAN_CASES)
def test_plan_flags(tmp_path, flags, fragment):
    out = tmp_path / "plan.json"
    before = snapshot(tmp_path)
    assert_error(run_main("grow.py", [*flags, f"--plan_out={out}"]), 2, fragment)
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


def test_plan_law_kaplan_takes_no_runs(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    before = snapshot(tmp_path)
    assert_error(run_main("grow.py", ["--plan", "--law=kaplan", "--budget=1e20", "--runs", str(run)]), 2,
                 "takes no --runs")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


def test_train_bias_correction_is_adamws(tmp_path):
    out = tmp_path / "run"
    before = snapshot(tmp_path)
    proc = run_main("train.py", [f"--out_dir={out}", "--optimizer=adafactor", "--adam_bias_correction=False"])
    assert_error(proc, 2, "adam_bias_correction=False is AdamW's")
    proc = run_main("train.py", [f"--out_dir={out}", "--grow_width_moments=half"])
    assert_error(proc, 2, "grow_width_moments")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)
