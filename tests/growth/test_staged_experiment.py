"""experiments/staged_training.py end to end at toy size: the equal-compute protocol (every grown
run spends the target's FLOPs, within one iteration), function-preserving growth, the aligned
variant's schedule position, the tables and plots, and --reuse / --report reading back the same
numbers without retraining."""
import glob
import json
import math
import os

import pytest
from conftest import assert_one_line_error, run_main

pytestmark = pytest.mark.slow


def run(*argv, check=True):
    """experiments/staged_training.py's command line, in this process (conftest.run_main)."""
    return run_main("experiments/staged_training.py", list(argv), check=check)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    root = tmp_path_factory.mktemp("staged")
    data = str(root / "data")
    for stage in (["synthesize", "--num_shards=3", "--stories_per_shard=300", "--seed=0"],
                  ["train_vocab", "--vocab_size=512"], ["pretokenize", "--vocab_size=512", "--dataset_name=pretrain-all"]):
        run_main("tinystories.py", [*stage, f"--data_cache_dir={data}"], check=True)
    argv = ["--threads=1", f"--data_cache_dir={data}", f"--out_dir={root / 'out'}", f"--plots={root / 'plot'}",
            "--max_iters=40", "--eval_interval=20", "--batch_size=4", "--seeds=1", "--variants=width,depth,width-aligned"]
    proc = run(*argv)
    with open(root / "out" / "results.json") as f:
        return root, argv, proc, json.load(f)


def test_equal_compute_and_preserved_loss(experiment):
    root, _, proc, res = experiment
    seed = res["seeds"]["1"]
    target = seed["target"]
    assert set(seed["variants"]) == {"width", "depth", "width-aligned"}
    for name, r in seed["variants"].items():
        # the grown run spends the target's compute: at least C_target, less than one more iteration
        assert target["flops"] <= r["flops"] < target["flops"] + r["flops_target_per_iter"], name
        assert r["n_post"] == math.ceil((target["flops"] - r["grown_at"] * r["flops_small_per_iter"])
                                        / r["flops_target_per_iter"] - 1e-9)
        assert r["curve"][-1][0] == r["grown_at"] + r["n_post"]
        before, after = r["loss_at_growth"]
        assert abs(after - before) < 1e-4, (name, before, after)  # the operators preserve the loss
        assert r["saving"] is None or 0 < r["flops_to_target_loss"] <= r["flops"]
    width, aligned = seed["variants"]["width"], seed["variants"]["width-aligned"]
    assert width["position_after_growth"] == round(width["grown_at"] / 1.776)
    # --restart_steps max_iters - N_post: the first step after growth is at position S + 1 (the
    # original's restart formula), the last at max_iters, where the cosine has reached min_lr
    assert aligned["position_after_growth"] == 40 - aligned["n_post"] + 1
    assert aligned["asymmetry"]["0"] == 0.0 and max(aligned["asymmetry"].values()) > 0  # symmetry broken
    assert "mean saving" in proc.stdout and "width-aligned" in proc.stdout
    for suffix in ("", "_width"):
        assert os.path.getsize(f"{root / 'plot'}{suffix}.png") > 10_000


def test_reuse_and_report_read_back_without_training(experiment):
    root, argv, proc, res = experiment
    ckpts = {p: os.stat(p).st_mtime_ns for p in glob.glob(str(root / "out" / "**" / "*.pt"), recursive=True)}
    assert ckpts
    assert run(*argv, "--reuse", check=False).returncode == 2  # its plots outside out_dir: replaced only with --force
    again = run(*argv, "--reuse", "--force")
    # nothing retrained: no checkpoint written, every checkpoint file untouched
    assert "saved checkpoint" not in again.stdout
    assert {p: os.stat(p).st_mtime_ns for p in glob.glob(str(root / "out" / "**" / "*.pt"), recursive=True)} == ckpts
    with open(root / "out" / "results.json") as f:
        assert json.load(f)["summary"] == res["summary"]
    # runs of other settings are not mixed in: one line, nothing retrained or replaced
    other = run(*argv, "--reuse", "--force", "--batch_size=8", check=False)
    assert other.returncode == 2 and "was run with other settings (batch_size=4)" in other.stderr, other.stderr
    assert {p: os.stat(p).st_mtime_ns for p in glob.glob(str(root / "out" / "**" / "*.pt"), recursive=True)} == ckpts
    report = run(f"--out_dir={root / 'out'}", "--plots=", "--report")
    table = [line for line in proc.stdout.splitlines() if line.startswith(("width ", "depth ", "width-aligned "))]
    assert table and all(line in report.stdout for line in table)


@pytest.mark.parametrize("flag, fragment", [("--batch_size=0", "--batch_size must be at least 1, got 0"),
                                            ("--variants=width,tall", "unknown variant(s) tall")])
def test_bad_settings_are_one_line_before_any_output(tmp_path, flag, fragment):
    proc = run(f"--out_dir={tmp_path / 'out'}", "--plots=", f"--data_cache_dir={tmp_path / 'data'}", flag, check=False)
    assert_one_line_error(proc, fragment)
    assert os.listdir(tmp_path) == []
