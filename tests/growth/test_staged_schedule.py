"""Staged training as the paper ran it: grow.py with the staged-training repository's flags
(<ckpt>.doubled_* outputs, --doubling_layers, --restart_steps / --restart_warmup_steps /
--reset_lr_scheduler / --reset_optimizer), train.py's lr_schedule=linear|constant, the batch-size
and sequence-length warmups, and the logged critical batch size. References: the original's
schedule formula and its grow placements re-implemented here, transformers' own schedules, and
per-micro-batch gradients computed separately."""
import os

import pytest
import torch
from conftest import assert_one_line_error, records, run_main, staged_training_lr_lambda, train_losses

from model import ModelArgs, Transformer
from tinylab.core.checkpoint import load_checkpoint, model_args_dict, save_checkpoint
from tinylab.core.errors import UserError
from tinylab.growth.options import GrowthOptions
from tinylab.growth.state import grow_checkpoint
from tinylab.schema import TRAIN
from tinylab.training.optim import build_optimizer, lr_at, optimizer_param_names
from tinylab.training.options import OptimizerOptions, ScheduleOptions
from tinylab.training.warmup import BatchWarmup

VOCAB, T = 61, 16


def small_state(iter_num=30, **cfg_over):
    """A small model's training state after a few AdamW steps, with a full config."""
    torch.manual_seed(0)
    m = Transformer(ModelArgs(dim=16, n_layers=2, n_heads=2, n_kv_heads=2, vocab_size=VOCAB, multiple_of=8,
                              max_seq_len=T))
    cfg = {**TRAIN.defaults(), "learning_rate": 1e-3, "warmup_iters": 10, "max_iters": 100, "lr_schedule": "linear",
           "vocab_size": VOCAB, "dataset_name": "none-here", "data_cache_dir": "/nonexistent", **cfg_over}
    opt = build_optimizer(m, OptimizerOptions.from_config(cfg))
    for _ in range(3):
        x = torch.randint(0, VOCAB, (2, T))
        m(x, x)
        m.last_loss.backward()
        opt.step()
        opt.zero_grad()
    return {"model": m.state_dict(), "model_args": model_args_dict(m), "iter_num": iter_num, "config": cfg,
            "optimizer": opt.state_dict(), "optimizer_name": "adamw", "param_names": optimizer_param_names(opt),
            "param_overrides": None, "lr_rewarmup": None}


# ---------------------------------------------------------------------- the schedules

def test_linear_and_constant_schedules_equal_transformers():
    from transformers.optimization import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup
    for kind, make in (("linear", get_linear_schedule_with_warmup), ("constant", get_constant_schedule_with_warmup)):
        cfg = ScheduleOptions.from_config({**TRAIN.defaults(), "learning_rate": 3e-3, "warmup_iters": 7, "max_iters": 40,
                                           "lr_schedule": kind})
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-3)
        sched = make(opt, 7, 40) if kind == "linear" else make(opt, 7)
        for it in range(45):
            assert lr_at(it, cfg) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=1e-15), (kind, it)
            opt.step()
            sched.step()
    cfg = ScheduleOptions.from_config({**TRAIN.defaults(), "learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 0,
                                       "max_iters": 10, "lr_schedule": "linear"})
    assert lr_at(0, cfg) == 1e-3 and lr_at(5, cfg) == pytest.approx(5.5e-4) and lr_at(10, cfg) == pytest.approx(1e-4)
    assert lr_at(99, cfg) == pytest.approx(1e-4)


def test_restart_schedule_is_the_originals_formula():
    """--restart_steps S --restart_warmup_steps R: the grown run's LR at each step equals the
    original's lr_lambda(S + 1 + k) * lr, in both of its branches, with the checkpoint's peak LR
    kept (no --reset_lr_scheduler) or the resumed config's (--reset_lr_scheduler)."""
    for s, r in ((12, 5), (3, 5), (40, 0)):  # restart after the warmup, inside it, no re-warmup
        ckpt = small_state(iter_num=30)
        grown = grow_checkpoint(ckpt, GrowthOptions("weights", restart_steps=s, restart_warmup_steps=r),
                                ckpt["config"])
        # the target model's config says another LR
        resumed = ScheduleOptions.from_config({**ckpt["config"], "learning_rate": 2e-3})
        for k in range(70):
            it = grown["iter_num"] + k
            want = 1e-3 * staged_training_lr_lambda(s + 1 + k, 10, 100, s, r)
            assert lr_at(it, resumed, grown["lr_rewarmup"]) == pytest.approx(want, rel=1e-12, abs=1e-15), (s, r, k)
        reset = grow_checkpoint(ckpt, GrowthOptions("weights", restart_steps=s, restart_warmup_steps=r,
                                                    reset_lr_scheduler=True), ckpt["config"])
        for k in range(70):
            want = 2e-3 * staged_training_lr_lambda(s + 1 + k, 10, 100, s, r)
            assert lr_at(reset["iter_num"] + k, resumed, reset["lr_rewarmup"]) == pytest.approx(want, rel=1e-12,
                                                                                                  abs=1e-15)
    # the run ends when the schedule position reaches max_iters: 100 - (S + 1) more steps
    assert grown["lr_rewarmup"]["shift"] == 30 - 41


def test_reset_optimizer_drops_the_state_and_the_rest_continues():
    ckpt = small_state(iter_num=30)
    grown = grow_checkpoint(ckpt, GrowthOptions("layers", reset_optimizer=True), ckpt["config"])
    assert grown["optimizer"] is None and grown["param_names"] is None and grown["iter_num"] == 30
    kept = grow_checkpoint(ckpt, GrowthOptions("layers"), ckpt["config"])
    assert kept["optimizer"] is not None  # without the flag the moments are mapped as before
    with pytest.raises(UserError, match="exact"):
        GrowthOptions("weights", mode="exact", reset_optimizer=True).check()


def test_doubling_layers_placements_and_plain_copies():
    ckpt = small_state()
    cfg = ckpt["config"]
    by_placement = {p: grow_checkpoint(ckpt, GrowthOptions("layers", placement=p), cfg) for p in ("interleave", "append")}
    for name, (placement, copies) in GrowthOptions.DOUBLING_LAYERS.items():
        g = grow_checkpoint(ckpt, GrowthOptions("layers", placement=placement, copy_layers=copies), cfg)
        if not copies:  # *_id: exactly the function-preserving operator
            assert all(torch.equal(g["model"][k], by_placement[placement]["model"][k]) for k in g["model"])
            continue
        # *_copy: the original's plain copies: the new layer is the old one, weights and moments
        copy_of = {1: 0, 3: 1} if placement == "interleave" else {2: 0, 3: 1}
        names = g["param_names"]
        state = {n: g["optimizer"]["state"][i] for i, n in enumerate(names) if i in g["optimizer"]["state"]}
        for new, old in copy_of.items():
            w = "attention.wo.weight"
            old_at = 2 * old if placement == "interleave" else old
            assert torch.equal(g["model"][f"layers.{new}.{w}"], ckpt["model"][f"layers.{old}.{w}"])
            assert torch.equal(state[f"layers.{new}.{w}"]["exp_avg"], state[f"layers.{old_at}.{w}"]["exp_avg"])
    with pytest.raises(UserError, match="--doubling layers only"):
        GrowthOptions("weights", copy_layers=True).check()


# ---------------------------------------------------------------------- grow.py, the original's commands

@pytest.fixture
def small_ckpt(tmp_path):
    path = str(tmp_path / "run" / "ckpt.pt")
    save_checkpoint(small_state(), path)
    return path


def test_grow_writes_beside_the_input_with_the_original_names(small_ckpt):
    proc = run_main("grow.py", ["--doubling", "weights", "--resume", small_ckpt])
    assert proc.returncode == 0, proc.stderr
    assert os.path.isfile(small_ckpt + ".doubled_weights")
    assert f"--resume_ckpt={small_ckpt}.doubled_weights" in proc.stdout
    change = next(line for line in proc.stdout.splitlines() if line.startswith("loss on"))
    assert "random tokens" in change and abs(float(change.split("change ")[1].split(")")[0])) < 1e-4
    before = open(small_ckpt + ".doubled_weights", "rb").read()
    assert_one_line_error(run_main("grow.py", ["--doubling", "weights", "--resume", small_ckpt]), "already exists")
    assert open(small_ckpt + ".doubled_weights", "rb").read() == before
    assert run_main("grow.py", ["--doubling", "weights", "--resume", small_ckpt, "--force"]).returncode == 0
    proc = run_main("grow.py", ["--doubling", "layers", "--doubling_layers", "alternate_copy", "--resume",
                                os.path.dirname(small_ckpt)])
    assert proc.returncode == 0, proc.stderr
    assert os.path.isfile(small_ckpt + ".doubled_layer") and "NOT preserved" in proc.stdout
    change = float(next(line for line in proc.stdout.splitlines() if line.startswith("loss on")).split("change ")[1]
                   .split(")")[0])
    assert abs(change) > 1e-3  # a plain copy changes the function


def test_grow_restart_flags_end_to_end(small_ckpt, tmp_path):
    out = str(tmp_path / "wide")
    proc = run_main("grow.py", ["--doubling", "weights", "--resume", small_ckpt, "--out_dir", out,
                                "--restart_steps", "12", "--restart_warmup_steps", "5", "--reset_lr_scheduler",
                                "--reset_optimizer"])
    assert proc.returncode == 0, proc.stderr
    g = load_checkpoint(out)
    assert g["optimizer"] is None and g["lr_rewarmup"] == {"start": 30, "iters": 5, "shift": 30 - 13, "ramp_from": 12,
                                                                "restart_steps": 12}
    assert "schedule position 13 (was 30)" in proc.stdout and "optimizer state reset" in proc.stdout


@pytest.mark.parametrize("argv, fragment", [
    (["--doubling_layers", "alternate"], "--doubling_layers='alternate': must be one of"),
    (["--doubling_layers", "alternate_id"], "applies to --doubling layers"),
    (["--restart_steps", "100"], "beyond the run's schedule"),
    (["--restart_warmup_steps", "5"], "needs --restart_steps"),
    (["--restart_steps", "-1"], "must be in [0, inf)"),
])
def test_grow_bad_original_flags(small_ckpt, argv, fragment):
    folder = os.path.dirname(small_ckpt)
    before = sorted(os.listdir(folder))
    assert_one_line_error(run_main("grow.py", ["--doubling", "weights", "--resume", small_ckpt] + argv), fragment)
    assert sorted(os.listdir(folder)) == before  # nothing written


def test_conflicting_placement_is_refused(small_ckpt):
    assert_one_line_error(run_main("grow.py", ["--doubling", "layers", "--doubling_layers", "alternate_id",
                                               "--placement", "append", "--resume", small_ckpt]), "--placement=append")


# ---------------------------------------------------------------------- warmups and the noise estimate

def tiny_args(corpus, out_dir, **over):
    cfg = dict(data_cache_dir=corpus.cache_dir, vocab_size=corpus.vocab_size, dataset_name=corpus.dataset_name,
               out_dir=out_dir, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, multiple_of=16, max_seq_len=32,
               batch_size=4, gradient_accumulation_steps=4, learning_rate=1e-3, warmup_iters=0, max_iters=8,
               eval_interval=100, eval_iters=1, log_interval=1, max_new_tokens=0, device="cpu", dtype="float32")
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()]


def test_batch_warmup_plan_by_hand():
    w = BatchWarmup(batch_size=4, accum=8, max_seq_len=128, bsz_tokens=1000, bsz_start=6, seq_tokens=2000, seq_start=16)
    assert w.plan(0, 1) == (1, 4, 16)         # 6 sequences: one micro-step of 4 rows (6 // 4 = 1 step, 6 // 1 -> 4)
    assert w.plan(500, 1) == (4, 4, 44)       # 6 + 26 * 0.5 = 19 -> 4 micro-steps of 4 rows; 16 + 112 * 0.25
    assert w.plan(1000, 1) == (8, 4, 72)      # the full batch
    assert w.plan(10 ** 6, 1) == (8, 4, 128)
    assert w.plan(0, 2) == (1, 3, 16)         # two processes: a micro-step each, 6 // 2 = 3 rows
    with pytest.raises(UserError, match="number of processes"):
        BatchWarmup(4, 8, 128, bsz_tokens=10, bsz_start=1).check(2)


@pytest.mark.slow
def test_warmups_grow_the_batch_and_resume_exactly(tiny_corpus, tmp_path):
    warm = dict(warmup_bsz=400, warmup_bsz_start=5, warmup_seq=1600, warmup_seq_start=8, lr_decay_iters=8)
    full = str(tmp_path / "full")
    run_main("train.py", tiny_args(tiny_corpus, full, **warm), check=True)
    logs = records(full, "train")
    # by hand from the plan: (batch, seq, tokens so far) of each step
    plan, tokens = [], 0
    for _ in range(8):
        b = int(5 + 11 * min(1, tokens / 400))
        steps = min(4, max(1, b // 4)) if b < 16 else 4
        rows = min(4, b // steps) if b < 16 else 4
        seq = int(8 + 24 * min(1, tokens / 1600))
        tokens += steps * rows * seq
        plan.append((steps * rows, seq, tokens))
    assert [(r["batch_size"], r["seq_len"], r["tokens_seen"]) for r in logs] == plan
    assert plan[0][:2] == (4, 8) and plan[-1][0] == 16 and plan[-1][1] > 8
    split = str(tmp_path / "split")
    run_main("train.py", tiny_args(tiny_corpus, split, max_iters=4, **warm), check=True)
    run_main("train.py", tiny_args(tiny_corpus, split, init_from="resume_train", **warm), check=True)
    assert train_losses(split) == train_losses(full)  # bit for bit


def test_bad_warmups(tiny_corpus, tmp_path):
    out = str(tmp_path / "bad")
    assert_one_line_error(run_main("train.py", tiny_args(tiny_corpus, out, warmup_bsz=-1)), "--warmup_bsz=-1")
    assert_one_line_error(run_main("train.py", tiny_args(tiny_corpus, out, warmup_bsz=100, warmup_bsz_start=16)),
                          "is not below the global batch")
    assert_one_line_error(run_main("train.py", tiny_args(tiny_corpus, out, warmup_seq=100, warmup_seq_start=32)),
                          "is not below max_seq_len=32")
    assert not os.path.exists(out)


@pytest.mark.slow
def test_critical_batch_size_against_separate_gradients(tiny_corpus, tmp_path):
    """The first step's logged estimate from gradients the test computes itself: |g|^2 of the first
    micro-batch alone and of the mean over the step's four micro-batches."""
    out = str(tmp_path / "noise")
    argv = tiny_args(tiny_corpus, out, max_iters=1, dropout=0.0)
    run_main("train.py", argv, check=True)
    logged = records(out, "train")[0]
    # the same model and batches, rebuilt here
    from tinylab.data.pretokenized import BatchLoader, dataset_dir
    cfg = TRAIN.parse(argv)
    torch.manual_seed(cfg["seed"])
    from tinylab.training.options import model_args_from_config
    model = Transformer(model_args_from_config(cfg))
    batches = BatchLoader(dataset_dir(cfg["data_cache_dir"], cfg["vocab_size"], cfg["dataset_name"]), "train", 4, 32,
                          seed=cfg["seed"], bos_id=1)
    grads = []
    for _ in range(4):
        x, y = next(batches)
        model.zero_grad()
        model(x, y)
        model.last_loss.backward()
        grads.append(torch.cat([p.grad.flatten().double() for p in model.parameters()]))
    g_small, g_big = grads[0].pow(2).sum().item(), torch.stack(grads).mean(0).pow(2).sum().item()
    b_small, b_big = 4, 16
    g2 = (b_big * g_big - b_small * g_small) / (b_big - b_small)
    s = (g_small - g_big) / (1 / b_small - 1 / b_big)
    assert logged["critical_batch_size_step"] == pytest.approx(s / g2, rel=1e-3)
    assert logged["critical_batch_size"] == pytest.approx(s / g2, rel=1e-3)  # the running mean starts there
    none = str(tmp_path / "none")
    run_main("train.py", tiny_args(tiny_corpus, none, max_iters=1, gradient_accumulation_steps=1), check=True)
    assert "critical_batch_size" not in records(none, "train")[0]  # one micro-batch: nothing to compare


@pytest.mark.slow
def test_resume_ckpt_continues_a_grown_file_in_a_new_folder(tiny_corpus, tmp_path):
    small = str(tmp_path / "small")
    run_main("train.py", tiny_args(tiny_corpus, small, max_iters=4, lr_schedule="linear"), check=True)
    proc = run_main("grow.py", ["--doubling", "layers", "--resume", small, "--restart_steps", "2",
                                "--restart_warmup_steps", "2"])
    assert proc.returncode == 0, proc.stderr
    grown = os.path.join(small, "ckpt.pt.doubled_layer")
    deep = str(tmp_path / "deep")
    run_main("train.py", tiny_args(tiny_corpus, deep, max_iters=8, lr_schedule="linear", init_from="resume_train",
                                   resume_ckpt=grown), check=True)
    lrs = {r["iter"]: r["lr"] for r in records(deep, "train")}
    assert sorted(lrs) == [4, 5, 6, 7, 8]  # schedule positions 3..7: the run ends at position max_iters
    assert lrs[4] == pytest.approx(1e-3 * staged_training_lr_lambda(3, 0, 8, 2, 2))
    assert lrs[6] == pytest.approx(1e-3 * staged_training_lr_lambda(5, 0, 8, 2, 2))
    assert load_checkpoint(deep)["model_args"]["n_layers"] == 2
    # the small run's folder is untouched by the continued run; a second continuation into the
    # now-used folder is refused
    assert_one_line_error(run_main("train.py", tiny_args(tiny_corpus, deep, init_from="resume_train",
                                                         resume_ckpt=grown)), "already holds a run")
    assert lrs[8] == pytest.approx(1e-3 * staged_training_lr_lambda(7, 0, 8, 2, 2))


@pytest.mark.slow
def test_auto_growth_follows_the_rule_and_resumes_exactly(tiny_corpus, tmp_path, monkeypatch):
    """grow_schedule=auto grows when growth_plan.should_grow fires on the evaluations so far (the
    paper's thresholds never fire on a 20-iteration toy, so the width threshold is lowered here),
    and a run stopped at a checkpoint and resumed decides, and trains, exactly the same."""
    from tinylab.growth import rule as growth
    from tinylab.growth.ops.base import meta_model
    from tinylab.growth.rule import should_grow
    monkeypatch.setitem(growth.SLOPE_THRESHOLDS, "weights", -3.0)
    common = dict(max_iters=24, eval_interval=2, eval_iters=1, grow_schedule="auto:weights", lr_decay_iters=24,
                  gradient_accumulation_steps=1)
    full = str(tmp_path / "full")
    run_main("train.py", tiny_args(tiny_corpus, full, **common), check=True)
    grew = records(full, "growth")
    assert len(grew) == 1 and grew[0]["doubling"] == "weights" and grew[0]["dim"] == 32
    g = grew[0]["iter"]
    # the decision, recomputed from the logged evaluations of the small model
    evals = [r for r in records(full, "eval") if 0 < r["iter"] < g]
    cfg = TRAIN.parse(tiny_args(tiny_corpus, full, **common))
    per_iter = meta_model(ModelArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=8192,
                                           multiple_of=16, max_seq_len=32)).flops_per_token(32) * 4 * 32
    compute = [per_iter * r["iter"] for r in evals]
    losses = [r["loss/test"] for r in evals]
    assert should_grow(compute, losses, "weights").fire and not should_grow(compute[:-1], losses[:-1], "weights").fire
    assert cfg["grow_schedule"] == "auto:weights"
    split = str(tmp_path / "split")
    stop = 2 * ((g - 2) // 2) or 2  # a checkpoint before the growth
    run_main("train.py", tiny_args(tiny_corpus, split, **{**common, "max_iters": stop}), check=True)
    run_main("train.py", tiny_args(tiny_corpus, split, **{**common, "init_from": "resume_train"}), check=True)
    assert [r["iter"] for r in records(split, "growth")] == [g]
    assert train_losses(split) == train_losses(full)


def test_auto_growth_bad_input(tiny_corpus, tmp_path):
    out = str(tmp_path / "bad")
    assert_one_line_error(run_main("train.py", tiny_args(tiny_corpus, out, grow_schedule="auto:sideways")),
                          "doubling must be one of")
    assert_one_line_error(run_main("train.py", tiny_args(tiny_corpus, out, grow_schedule="automatic")),
                          "write auto or auto:OP")
    assert_one_line_error(run_main("train.py", tiny_args(tiny_corpus, out, grow_schedule="auto", grow_mode="exact")),
                          "grow_mode=target")
    assert not os.path.exists(out)
