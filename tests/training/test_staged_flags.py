"""staged-training's gpt_pretrain.py flags in train.py (tinylab/training/staged_flags.py) and the
restart of a resumed run (tinylab/training/restart.py). References: the translation table written
out by hand from gpt_pretrain.py's argparse flags and Trainer arguments (gpt_pretrain.py:1253-1338,
1486-1517), and the original's get_restart_linear_schedule_with_warmup lr_lambda re-implemented
below; the cheatsheet's commands (cheatsheet.txt:40-87) run end to end with a tiny model."""
import os

import pytest
from conftest import records, run_main, staged_training_lr_lambda

from tinylab.core.checkpoint import load_checkpoint
from tinylab.core.errors import UserError
from tinylab.schema import TRAIN, train_family
from tinylab.training.restart import RestartOptions, restart_rewarmup
from tinylab.training.staged_flags import notice


def ours(corpus, **over):
    """The keys gpt_pretrain.py has no flag for (data, model shape), in this project's syntax."""
    cfg = dict(data_cache_dir=corpus.cache_dir, vocab_size=corpus.vocab_size, dataset_name=corpus.dataset_name,
               dim=16, n_layers=2, n_heads=2, n_kv_heads=2, multiple_of=16, max_new_tokens=0, device="cpu",
               dtype="float32", export_bin=False, dropout=0.0, critical_batch_size=False)
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()]


def staged(save_dir, prefix, steps=8, lr="0.002", warmup=2):
    """The cheatsheet's flags (cheatsheet.txt:40-45) with its sizes made tiny."""
    return ["--save_dir", str(save_dir), "--save_prefix", prefix, "--gpu_count", "1", "--batch_size", "4",
            "--grad_accum", "2", "--lr", lr, "--warmup_steps", str(warmup), "--train_steps", str(steps),
            "--val_every", "4", "--val_batches", "1", "--seqlen", "32", "--log_rate", "1", "--num_workers", "2",
            "--random"]


def parse(argv, **env):
    return TRAIN.parse(argv)


# ---------------------------------------------------------------------- the translation

def test_each_flag_maps_onto_our_keys(tiny_corpus, tmp_path, monkeypatch):
    """Two processes (WORLD_SIZE=2, as torchrun sets it): grad_accum and val_batches are per
    process in the original, so they are multiplied; batch_size is per process in both."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = staged(tmp_path, "run") + ["--gpu_count", "2", "--adam_epsilon", "1e-6", "--adam_beta2", "0.98",
                                      "--seed", "3", "--fp16", "--grad_clip", "0.5"] + ours(tiny_corpus)
    argv.remove("--fp16")  # (float16 is checked with the device below; here the mapping only)
    cfg = TRAIN.parse(argv)
    want = dict(out_dir=os.path.join(str(tmp_path), "run"), batch_size=4, gradient_accumulation_steps=4,
                learning_rate=0.002, warmup_iters=2, max_iters=8, eval_interval=4, eval_iters=2, max_seq_len=32,
                log_interval=1, lr_schedule="linear", min_lr=0.0, lr_decay_iters=0, adam_eps=1e-6, beta2=0.98,
                seed=3, grad_clip=0.5, init_from="scratch")
    assert {k: cfg[k] for k in want} == want
    line = notice(cfg)
    assert line.startswith("notice: staged-training flags: ")
    for part in ("--train_steps 8 -> max_iters=8", "--grad_accum 2 -> gradient_accumulation_steps=4",
                 "--val_batches 1 -> eval_iters=2", "--gpu_count 2 -> checked against the 2 process(es)",
                 "--num_workers 2 -> no effect", "--random -> a new model",
                 f"--save_dir {tmp_path} --save_prefix run -> out_dir={tmp_path}/run", "lr_schedule=linear"):
        assert part in line, (part, line)
    assert train_family(cfg) == "staged"


def test_same_name_keys_mean_the_same_in_both_spellings(tiny_corpus, tmp_path):
    spaced = TRAIN.parse(["--batch_size", "8", "--seed", "5", "--lr", "0.003", "--grad_clip", "0"]
                         + ours(tiny_corpus, out_dir=tmp_path / "a"))
    eq = TRAIN.parse(["--batch_size=8", "--seed=5", "--learning_rate=0.003", "--grad_clip=0"]
                     + ours(tiny_corpus, out_dir=tmp_path / "a"))
    assert spaced == eq and (spaced["batch_size"], spaced["seed"], spaced["learning_rate"]) == (8, 5, 0.003)
    # our own keys in the original's syntax do not make a staged-training run
    assert notice(spaced) is None and train_family(spaced) == "study"


def test_flags_override_a_config_file_and_clash_with_the_command_line(tiny_corpus, tmp_path):
    conf = tmp_path / "conf.py"
    conf.write_text("max_iters = 50\nwarmup_iters = 2\nlr_schedule = 'constant'\nmin_lr = 1e-5\n")
    cfg = TRAIN.parse([str(conf), "--train_steps", "9"] + ours(tiny_corpus, out_dir=tmp_path / "a"))
    # the flag wins over the file; the schedule's shape the file chose is kept (and said)
    assert (cfg["max_iters"], cfg["lr_schedule"], cfg["min_lr"]) == (9, "constant", 1e-5)
    assert "lr_schedule=constant (kept as set; the original's is linear)" in notice(cfg)
    with pytest.raises(UserError, match=r"--train_steps 9 means max_iters=9, but --max_iters=5 is given too"):
        TRAIN.parse(["--train_steps", "9", "--max_iters=5"] + ours(tiny_corpus, out_dir=tmp_path / "a"))
    assert TRAIN.parse(["--train_steps", "9", "--max_iters=9", "--warmup_steps", "2"] + ours(tiny_corpus, out_dir=tmp_path / "a"))["max_iters"] == 9


def test_train_family(tiny_corpus, tmp_path):
    base = ours(tiny_corpus, out_dir=tmp_path / "a", max_iters=10, warmup_iters=2)
    assert train_family(TRAIN.parse(base)) == "study"
    assert train_family(TRAIN.parse(base + ["--grow_schedule=4:weights"])) == "staged"
    assert train_family(TRAIN.parse(base + ["--log_rate", "2"])) == "staged"
    assert train_family(TRAIN.parse(base + ["--fp16", "--dtype=float16"])) == "staged"


# ---------------------------------------------------------------------- the restart of a resumed run

def test_restart_record_is_the_originals_schedule():
    """The schedule position of every step after the restart, against the original's lr_lambda
    (its re-warmup only when both restart numbers are non-zero, gpt_pretrain.py:1192)."""
    from tinylab.training.optim import lr_at
    from tinylab.training.options import ScheduleOptions
    sched = ScheduleOptions.from_config({**TRAIN.defaults(), "learning_rate": 1e-3, "warmup_iters": 10,
                                         "max_iters": 100, "lr_schedule": "linear"})
    for s, r in ((12, 5), (3, 20), (40, 0), (0, 30)):
        rw = restart_rewarmup(57, s, r)
        for k in range(100 - s - 1):
            want = 1e-3 * staged_training_lr_lambda(s + 1 + k, 10, 100, s, r)
            assert lr_at(57 + k, sched, rw) == pytest.approx(want, rel=1e-12, abs=1e-15), (s, r, k)


def test_restart_applies_once_and_resets_the_optimizer():
    ckpt = {"iter_num": 30, "optimizer": {"state": {}}, "param_names": ["a"], "config": {"learning_rate": 1e-3},
            "lr_rewarmup": None}
    cfg = {"learning_rate": 2e-3, "max_iters": 100}
    said = []
    opts = RestartOptions(restart_steps=12, restart_warmup_steps=5, reset_lr_scheduler=False, reset_optimizer=True)
    out = opts.apply(ckpt, cfg, log=said.append)
    assert out["optimizer"] is None and out["param_names"] is None and ckpt["optimizer"] is not None
    assert out["lr_rewarmup"] == {"start": 30, "iters": 5, "shift": 30 - 13, "ramp_from": 12, "restart_steps": 12,
                                  "base_lr": 1e-3}  # the checkpoint's peak LR without --reset_lr_scheduler
    # the restarted run's own checkpoint, resumed with the same command after a crash: no second restart
    later = {**out, "iter_num": 44}
    assert opts.apply(later, cfg, log=said.append)["lr_rewarmup"] == out["lr_rewarmup"]
    reset = RestartOptions(12, 5, True, False).apply(ckpt, cfg, log=said.append)
    assert "base_lr" not in reset["lr_rewarmup"] and reset["optimizer"] is not None


# ---------------------------------------------------------------------- the cheatsheet, end to end

def lrs(run):
    return {r["iter"]: r["lr"] for r in records(run, "train")}


@pytest.mark.slow
@pytest.mark.parametrize("doubling, extra, grown_key, grown_value", [
    ("weights", [], "dim", 32),
    ("layers", ["--doubling_layers", "alternate_id"], "n_layers", 4),
])
def test_cheatsheet_commands(tiny_corpus, tmp_path, doubling, extra, grown_key, grown_value):
    """cheatsheet.txt's three steps with tiny sizes: train the small model (40-45); `--resume
    CKPT --doubling ...` writes CKPT.doubled_* and exits (48-56 / 68-77); the grown checkpoint
    resumed with --restart_steps / --restart_warmup_steps / --reset_lr_scheduler (58-66 /
    79-87) trains train_steps - restart_steps - 1 steps on the original's restarted schedule."""
    small = tmp_path / "runs" / "small"
    proc = run_main("train.py", staged(tmp_path / "runs", "small", steps=6) + ours(tiny_corpus))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("notice: staged-training flags:") == 1
    assert sorted(lrs(small)) == list(range(6))
    for it, lr in lrs(small).items():
        assert lr == pytest.approx(0.002 * staged_training_lr_lambda(it, 2, 6), abs=1e-15)
    ckpt = str(small / "ckpt.pt")
    restart = ["--restart_warmup_steps", "2", "--restart_steps", "3", "--reset_lr_scheduler"]
    grow = staged(tmp_path / "runs", "small", steps=12, lr="0.0015") + ["--resume", ckpt, "--doubling", doubling]
    proc = run_main("train.py", grow + extra + restart + ours(tiny_corpus))
    assert proc.returncode == 0, proc.stderr
    doubled = ckpt + {"weights": ".doubled_weights", "layers": ".doubled_layer"}[doubling]
    assert load_checkpoint(doubled)["model_args"][grown_key] == grown_value
    assert sorted(set(os.listdir(small)) - {".lock"}) == sorted(["ckpt.pt", os.path.basename(doubled), "config.json", "metrics.jsonl"])
    grown = tmp_path / "runs" / "grown"
    proc = run_main("train.py", staged(tmp_path / "runs", "grown", steps=12, lr="0.0015") + ["--resume", doubled]
                    + restart + ours(tiny_corpus))
    assert proc.returncode == 0, proc.stderr
    got = lrs(grown)
    assert sorted(got) == list(range(6, 6 + 12 - 3 - 1))  # iterations continue; positions 4 .. 11
    for k, it in enumerate(sorted(got)):
        assert got[it] == pytest.approx(0.0015 * staged_training_lr_lambda(3 + 1 + k, 2, 12, 3, 2), rel=1e-12, abs=1e-15)
    assert load_checkpoint(str(grown))["model_args"][grown_key] == grown_value


@pytest.mark.slow
def test_doubling_command_run_again_trains_the_grown_checkpoint(tiny_corpus, tmp_path):
    """gpt_pretrain.py:1355-1361: when <ckpt>.doubled_weights exists, the doubling command trains it."""
    run_main("train.py", staged(tmp_path, "small", steps=4) + ours(tiny_corpus), check=True)
    cmd = staged(tmp_path, "wide", steps=8) + ["--resume", str(tmp_path / "small"), "--doubling", "weights",
                                               "--restart_steps", "3"] + ours(tiny_corpus)
    run_main("train.py", cmd, check=True)
    assert not os.path.exists(tmp_path / "wide")
    proc = run_main("train.py", cmd)
    assert proc.returncode == 0, proc.stderr
    assert "ckpt.pt.doubled_weights exists -> resume_ckpt=" in proc.stderr
    assert load_checkpoint(str(tmp_path / "wide"))["model_args"]["dim"] == 32
    assert sorted(lrs(tmp_path / "wide")) == [4, 5, 6, 7]  # positions 4 .. 7


@pytest.mark.slow
def test_resume_in_place_with_restart_and_reset_optimizer(tiny_corpus, tmp_path):
    """A plain resume (no growth) restarted as the cheatsheet's resume commands set it, keeping the
    checkpoint's peak LR (no --reset_lr_scheduler), with fresh AdamW moments."""
    run = tmp_path / "run"
    run_main("train.py", staged(tmp_path, "run", steps=6) + ours(tiny_corpus), check=True)
    proc = run_main("train.py", staged(tmp_path, "run", steps=10, lr="0.001")
                    + ["--resume", str(run), "--restart_steps", "2", "--restart_warmup_steps", "3", "--reset_optimizer"]
                    + ours(tiny_corpus))
    assert proc.returncode == 0, proc.stderr
    assert "fresh moments" in proc.stdout + proc.stderr
    got = lrs(run)
    assert sorted(got) == list(range(6 + 10 - 2 - 1))  # the in-place resume appends iterations 6 .. 12
    for k, it in enumerate(range(6, 13)):
        assert got[it] == pytest.approx(0.002 * staged_training_lr_lambda(3 + k, 2, 10, 2, 3), rel=1e-12, abs=1e-15)


def test_fp16_trains_in_float16_with_the_loss_scaler(tiny_corpus, tmp_path):
    """--fp16 is PTL's precision=16: autocast to float16 and a GradScaler (also on the CPU here)."""
    proc = run_main("train.py", staged(tmp_path, "half", steps=2) + ["--fp16"]
                    + [a for a in ours(tiny_corpus) if not a.startswith("--dtype=")])
    assert proc.returncode == 0, proc.stderr
    ckpt = load_checkpoint(str(tmp_path / "half"))
    assert ckpt["config"]["dtype"] == "float16" and ckpt["scaler"]["scale"] > 0
    assert "--fp16 -> dtype=float16" in proc.stderr
