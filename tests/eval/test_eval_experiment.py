"""experiments/deletion_recovery.py, shortened to seconds (tiny corpus, tiny model, a few
iterations): every phase runs, and the plot, table and results it writes are well-formed."""
import json
import os

import pytest
from conftest import run_main

from tinylab.core.errors import UserError

QUICK = ["--num_shards=3", "--stories_per_shard=200", "--vocab_size=512", "--dim=32", "--n_layers=2",
         "--max_seq_len=128", "--batch_size=4", "--pretrain_iters=6", "--delete_iters=4", "--recover_iters=4",
         "--eval_interval=2", "--eval_iters=1", "--max_new_tokens=12", "--gen_prompts=2", "--finetune_gen_prompts=2",
         "--final_samples=3", "--probe_train=30", "--probe_test=20", "--probe_iters=10"]
PHASES = ("pretrain", "control", "delete", "recover", "recover_control")


def experiment(argv, **kw):
    """experiments/deletion_recovery.py's command line in this process (its steps run as it says:
    --jobs=2 in subprocesses, --jobs=1 in the same process)."""
    return run_main("experiments/deletion_recovery.py", argv, **kw)


@pytest.mark.slow
def test_shortened_experiment_outputs(tmp_path):
    out = tmp_path / "dr"
    # every step in this process (--jobs=1); the rerun below runs its one step in a subprocess
    # lane (--jobs=2, the default), so both ways of running a step are exercised, with one
    # subprocess instead of thirteen
    proc = experiment([f"--out_dir={out}"] + QUICK + ["--jobs=1"], check=True)
    png = out / "deletion_recovery.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    md = (out / "results.md").read_text()
    # header, rule and five models; header, rule and two rows of recovery curves
    assert sum(line.startswith("|") for line in md.splitlines()) == 7 + 4
    for phrase in ("score falls after deletion", "probes still decode Twist after deletion",
                   "recovery faster than the control", "classifier:bow-logreg"):
        assert phrase in md and phrase in proc.stdout
    results = json.loads((out / "results.json").read_text())
    assert set(results["effects"]) == {"score_falls_after_deletion", "probes_decode_after_deletion",
                                       "recovery_faster_than_control"}
    assert all(isinstance(v["holds"], bool) for v in results["effects"].values())
    assert results["runtime_s"] > 0 and 0 <= results["judge"]["accuracy"] <= 1
    for phase in PHASES:
        feats = results["final"][phase]
        assert set(feats) == {"feature", "score", "ci95", "n", "judge", "judge_accuracy"} and feats["n"] == 3
        curve = results["curves"][phase]
        iters = 6 if phase in ("pretrain", "control") else 4
        assert curve[0]["iter"] == 0 and curve[-1]["iter"] == iters
        assert all(r["task"] > 0 and r["complement"] > 0 and r["adversarial"] > 0 for r in curve)
        assert all(r["score"] is None or 0 <= r["score"] <= 1 for r in curve)
        assert os.path.isfile(out / "runs" / phase / "ckpt.pt")
    for phase in ("pretrain", "control", "delete"):
        assert len(results["probes"][phase]["layers"]) == 2 * 6  # every block, six features
    # the recovery runs start from the deleted model and the control
    cfg = json.loads((out / "runs" / "recover" / "config.json").read_text())
    assert cfg["init_from"] == "resume_model" and cfg["model_dir"].endswith(os.path.join("runs", "delete"))
    assert cfg["lr_scheduling"] is False and cfg["dataset_name"] == "recovery-Twist"
    # a rerun in the same folder reuses every finished step; the one step whose record is gone
    # runs again, here in a subprocess of the two parallel lanes (--jobs=2: its log is the
    # subprocess's output, its record the child's CPU time)
    os.remove(out / "logs" / "features_recover_control.done")
    again = experiment([f"--out_dir={out}"] + QUICK + ["--jobs=2"], check=True)
    assert again.stdout.count("reuse ") == 12 and again.stdout.count("start ") == 1
    assert "start features_recover_control" in again.stdout
    done = json.loads((out / "logs" / "features_recover_control.done").read_text())
    assert done["cpu_s"] > 0 and "Twist present in" in (out / "logs" / "features_recover_control.log").read_text()
    rerun = json.loads((out / "results.json").read_text())
    assert rerun["curves"] == results["curves"] and rerun["final"]["delete"] == results["final"]["delete"]
    assert rerun["final"]["recover_control"]["n"] == 3
    # ... but not with other data settings
    other = experiment([f"--out_dir={out}"] + QUICK + ["--stories_per_shard=250"])
    assert other.returncode == 2 and "other settings" in other.stderr


def test_bad_input(tmp_path):
    from experiments.deletion_recovery import main
    for argv, fragment in [(["--feature=twist"], "did you mean 'Twist'"), (["--num_shards=1"], "--num_shards"),
                           (["--jobs=3"], "--jobs"), (["--pretrain_iters=0"], "--pretrain_iters")]:
        with pytest.raises(UserError, match=fragment):
            main([f"--out_dir={tmp_path}"] + argv)
