"""grow.py --plan (tinylab/growth/plan/, docs/growth.md §7.1): fitting L(N, S) = (N_c/N)^alpha_N +
(S_c/S)^alpha_S to run logs, the closed-form slope and growth point, the plan search, the JSON,
the online rule, bad input. Synthetic runs with a known law need no training; one end-to-end test
plans from two tiny train.py runs."""
import itertools
import json
import math
import os

import numpy as np
import pytest
from conftest import assert_one_line_error, run_main

from model import ModelArgs
from tinylab.core.errors import UserError
from tinylab.growth.ops.base import meta_model
from tinylab.growth.plan.cli import split_multi_values
from tinylab.growth.plan.fit import ALPHA_S_BOUNDS, ScalingFit, fit_runs
from tinylab.growth.plan.law import first_step_above, law_loss, law_slope, slope_crossing
from tinylab.growth.plan.options import PlanOptions
from tinylab.growth.plan.runs import read_run
from tinylab.growth.plan.search import make_plan
from tinylab.growth.rule import SLOPE_THRESHOLDS, growth_point, should_grow
from tinylab.schema import TRAIN

TRUE = dict(N_c=8.8e13, alpha_N=0.076, S_c=2.1e3, alpha_S=0.76)  # Kaplan et al.'s constants
BATCH = dict(vocab_size=512, multiple_of=32, max_seq_len=64, batch_size=16, gradient_accumulation_steps=1)
BASE = dict(dim=64, n_layers=2, n_heads=2, n_kv_heads=2, hidden_dim=0)
WIDE = dict(BASE, dim=128, n_heads=4, n_kv_heads=4, hidden_dim=384)   # BASE width-doubled
DEEP = dict(BASE, n_layers=4)                                          # BASE depth-doubled
STEPS = list(range(0, 20001, 100))
BUDGET = 1e14


def args_of(shape):
    return ModelArgs(dim=shape["dim"], n_layers=shape["n_layers"], n_heads=shape["n_heads"],
                     n_kv_heads=shape["n_kv_heads"] or shape["n_heads"], hidden_dim=shape["hidden_dim"] or None,
                     vocab_size=BATCH["vocab_size"], multiple_of=BATCH["multiple_of"], max_seq_len=BATCH["max_seq_len"])


def non_embedding(shape):
    return meta_model(args_of(shape)).num_params(non_embedding=True)


def true_E(N):
    return (TRUE["N_c"] / N) ** TRUE["alpha_N"]


def write_run(folder, shape, steps=STEPS, noise=0.003, seed=0, records=(), **cfg_over):
    """A run folder as train.py leaves it: config.json (all TRAIN keys) and eval records drawn from
    the known law with multiplicative noise."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    cfg = {**TRAIN.defaults(), **BATCH, "warmup_iters": 0, "eval_interval": 100, "out_dir": str(folder), **shape,
           **cfg_over}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    E = true_E(non_embedding(shape))
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for s in steps:
            loss = (E + (TRUE["S_c"] / s) ** TRUE["alpha_S"] if s > 0 else 10.0) * math.exp(noise * rng.standard_normal())
            f.write(json.dumps({"iter": s, "kind": "eval", "loss/test": loss, "loss/train": loss}) + "\n")
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(folder)


@pytest.fixture(scope="module")
def three_sizes(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    return [write_run(root / name, shape, seed=k) for k, (name, shape) in enumerate(
        [("base", BASE), ("wide", WIDE), ("deep", DEEP)])]


def true_fit():
    """The known law as a ScalingFit (every size's E from E(N))."""
    return ScalingFit(alpha_S=TRUE["alpha_S"], S_c=TRUE["S_c"], alpha_N=TRUE["alpha_N"], N_c=TRUE["N_c"], sizes=[])


def files_under(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


# ---------------------------------------------------------------------- the fit

def test_fit_recovers_the_known_law_from_three_sizes(three_sizes):
    runs = [read_run(p) for p in three_sizes]
    fit = fit_runs(runs)
    assert fit.alpha_S == pytest.approx(TRUE["alpha_S"], rel=0.02)
    assert fit.S_c == pytest.approx(TRUE["S_c"], rel=0.10)
    assert fit.alpha_N == pytest.approx(TRUE["alpha_N"], rel=0.03) and fit.alpha_N_source == "fit"
    assert math.log(fit.N_c) == pytest.approx(math.log(TRUE["N_c"]), rel=0.01)  # N_c within ~30%
    for s in fit.sizes:
        assert s["E"] == pytest.approx(true_E(s["N"]), rel=0.005)
    for r in runs:  # the RMSE in log loss is the noise's (0.003)
        assert 0.002 < fit.rmse[r.path] < 0.0045
    assert fit.rmse["E(N) across sizes"] < 0.005


def test_fit_of_one_size_and_noise_free_recovery(tmp_path):
    one = read_run(write_run(tmp_path / "one", BASE, noise=0.0))
    fit = fit_runs([one])
    E = true_E(non_embedding(BASE))
    assert fit.alpha_S == pytest.approx(TRUE["alpha_S"], rel=1e-5) and fit.S_c == pytest.approx(TRUE["S_c"], rel=1e-4)
    assert fit.sizes[0]["E"] == pytest.approx(E, rel=1e-6) and fit.rmse[one.path] < 1e-6
    # one size: E(N) extrapolates with the assumed alpha_N through the fitted E
    assert fit.alpha_N_source == "assumed" and fit.alpha_N == 0.076
    assert fit.E_of_N(4 * one.N) == pytest.approx(E * 4 ** -0.076, rel=1e-6)


def test_compute_per_evaluation_is_flops_per_token_times_tokens(three_sizes):
    r = read_run(three_sizes[0])
    tokens = BATCH["batch_size"] * BATCH["gradient_accumulation_steps"] * BATCH["max_seq_len"]
    assert r.tokens_per_iter == tokens
    assert r.flops_per_iter == meta_model(args_of(BASE)).flops_per_token(BATCH["max_seq_len"]) * tokens
    assert np.array_equal(r.compute, r.steps * r.flops_per_iter) and r.steps[0] == 100  # iteration 0 has no compute


# ---------------------------------------------------------------------- closed forms against brute force

@pytest.mark.parametrize("E", [0.0, 1.5, 4.76])
def test_closed_form_slope_equals_a_finite_difference(E):
    f = 9.6e8  # FLOPs per iteration: log C = log S + const, the slope is the same on both axes
    for S in (10.0, 300.0, 7000.0, 1e6):
        h = 1e-5
        L = lambda s: law_loss(s, E, TRUE["S_c"], TRUE["alpha_S"])  # noqa: E731
        fd = (math.log10(L(S * (1 + h))) - math.log10(L(S * (1 - h)))) / (
            math.log10(f * S * (1 + h)) - math.log10(f * S * (1 - h)))
        assert law_slope(S, E, TRUE["S_c"], TRUE["alpha_S"]) == pytest.approx(fd, rel=1e-7, abs=1e-12)


@pytest.mark.parametrize("op", ["weights", "layers", "optimality"])
def test_growth_point_equals_a_brute_force_search(op):
    tau, E = SLOPE_THRESHOLDS[op], true_E(non_embedding(BASE))
    steps = np.arange(1, 200001, dtype=float)
    L = law_loss(steps, E, TRUE["S_c"], TRUE["alpha_S"])
    # the slope between consecutive steps, on log10 L against log10 C (C = f S)
    C = steps * 9.6e8
    s = np.diff(np.log10(L)) / np.diff(np.log10(C))
    brute = int(steps[1:][np.argmax(s > tau)])
    closed = first_step_above(slope_crossing(E, TRUE["S_c"], TRUE["alpha_S"], tau))
    assert abs(closed - brute) <= 1 and 5000 < closed < 20000
    # the smoothed rule of growth.py (window 1: raw secant slopes, each assigned to its later
    # point) finds the same point on points 10 steps apart, within one spacing and a half
    idx = growth_point(list(C[::10]), list(L[::10]), tau, window=1)
    assert abs(steps[::10][idx] - closed) <= 15
    # edge cases: a pure power law never rises; alpha below |tau| is above it from the start
    assert slope_crossing(0.0, 2.1e3, 0.76, tau) == math.inf and slope_crossing(1.0, 2.1e3, 0.01, tau) == 0.0


def brute_force_plan(seq, budget, c_mode=True):
    """An independent evaluation of one operator sequence on the known law: step through each
    stage until the finite-difference slope rises above the next operator's threshold."""
    tokens = BATCH["batch_size"] * BATCH["gradient_accumulation_steps"] * BATCH["max_seq_len"]
    shape, start, spent, it, grows = dict(BASE), 0, 0.0, 0, []
    hidden = args_of(BASE).ffn_hidden_dim()
    for k in range(len(seq) + 1):
        args = ModelArgs(**{**vars(args_of(shape)), "hidden_dim": hidden})
        m = meta_model(args)
        f, E = m.flops_per_token(BATCH["max_seq_len"]) * tokens, true_E(m.num_params(non_embedding=True))
        if k == len(seq):
            end = start + int((budget - spent) // f)
            return {"sequence": list(seq), "grows": grows, "final_loss": E + (TRUE["S_c"] / end) ** TRUE["alpha_S"]}
        tau = SLOPE_THRESHOLDS[seq[k]]
        S = np.arange(max(start, 1), 400001, dtype=float)
        L = E + (TRUE["S_c"] / S) ** TRUE["alpha_S"]
        h = 1e-6
        slope = (np.log10(E + (TRUE["S_c"] / (S * (1 + h))) ** TRUE["alpha_S"]) - np.log10(
            E + (TRUE["S_c"] / (S * (1 - h))) ** TRUE["alpha_S"])) / (np.log10(1 + h) - np.log10(1 - h))
        end = int(S[np.argmax(slope > tau)])
        spent += f * (end - start)
        if spent > budget:
            return None
        it += end - start
        grows.append((it, seq[k]))
        start = int(round(end / {"weights": 1.776, "layers": 1.412}[seq[k]]))
        if seq[k] == "weights":
            shape = dict(shape, dim=2 * shape["dim"], n_heads=2 * shape["n_heads"], n_kv_heads=2 * shape["n_kv_heads"])
            hidden *= 2
        else:
            shape = dict(shape, n_layers=2 * shape["n_layers"])
        del L


@pytest.mark.parametrize("budget", [3e13, BUDGET])
def test_recommended_plan_equals_a_brute_force_over_the_candidates(three_sizes, budget):
    runs = [read_run(p) for p in three_sizes]
    out = make_plan(runs, true_fit(), PlanOptions(budget=budget, max_growths=2))
    seqs = [s for k in range(3) for s in itertools.product(("weights", "layers"), repeat=k)]
    brute = [p for p in (brute_force_plan(s, budget) for s in seqs) if p is not None]
    best = min(brute, key=lambda p: p["final_loss"])
    rec = out["recommended"]
    assert rec["sequence"] == best["sequence"]
    grows = [(s["grow_iter"], s["grow_operator"]) for s in rec["stages"] if s.get("grow_operator")]
    assert len(grows) == len(best["grows"]) and all(
        op == bop and abs(it - bit) <= 2 for (it, op), (bit, bop) in zip(grows, best["grows"]))
    assert rec["final_loss"] == pytest.approx(best["final_loss"], rel=1e-4)
    for p in brute:  # every candidate's predicted final loss, not only the best
        mine = next(q for q in out["candidates"] if q["sequence"] == p["sequence"])
        assert mine["status"] == "ok" and mine["final_loss"] == pytest.approx(p["final_loss"], rel=1e-4)
    assert rec["compute"] <= budget and sum(s["compute"] for s in rec["stages"]) == pytest.approx(rec["compute"])
    assert rec["grow_schedule"] == ",".join(f"{i}:{o}" for i, o in grows)


def test_target_loss_mode_finds_the_cheapest_plan(three_sizes):
    runs = [read_run(p) for p in three_sizes]
    out = make_plan(runs, true_fit(), PlanOptions(target_loss=4.3, max_growths=2))
    ok = [p for p in out["candidates"] if p["status"] == "ok"]
    rec = out["recommended"]
    assert rec["compute"] == min(p["compute"] for p in ok) and rec["sequence"]
    last = rec["stages"][-1]
    assert rec["final_loss"] <= 4.3
    # the last stage trains until its curve reaches the target, or not at all when the grown
    # model's curve is already below it at S_pre / c
    assert rec["final_loss"] == pytest.approx(4.3, abs=1e-4) or last["end_step"] == last["start_step"]
    for p in ok:
        assert p["final_loss"] <= 4.3 and p["compute"] == pytest.approx(sum(s["compute"] for s in p["stages"]))
    # the smallest model alone has E = 4.76 > 4.3: never reaches it
    alone = next(p for p in out["candidates"] if not p["sequence"])
    assert alone["status"].startswith("the final model's fitted irreducible loss")
    assert out["comparison"]["saving"] is not None


# ---------------------------------------------------------------------- the command

@pytest.mark.slow
def test_cli_plan_prints_a_table_and_writes_the_json(three_sizes, tmp_path):
    out = str(tmp_path / "plan.json")
    proc = run_main("grow.py", ["--plan", "--runs", *three_sizes, f"--budget={BUDGET}", f"--plan_out={out}"])
    assert proc.returncode == 0, proc.stderr
    assert "recommended:" in proc.stdout and "RMSE(log loss)" in proc.stdout and "predicted saving" in proc.stdout
    plan = json.load(open(out))
    assert plan["budget"] == BUDGET and len(plan["runs"]) == 3 and len(plan["candidates"]) == 7
    assert plan["constants"]["thresholds"] == SLOPE_THRESHOLDS
    assert plan["constants"]["c_width"] == 1.776 and plan["constants"]["c_depth"] == 1.412
    assert plan["fit"]["alpha_S"] == pytest.approx(0.76, rel=0.02)
    # the fitted plan recommends what the known law does, growing within 2% of its iterations
    known = make_plan([read_run(p) for p in three_sizes], true_fit(), PlanOptions(budget=BUDGET))["recommended"]
    rec = plan["recommended"]
    assert rec["sequence"] == known["sequence"]
    for s, t in zip(rec["stages"], known["stages"]):
        assert s["shape"] == t["shape"] and s["params"] == t["params"]
        if "grow_iter" in t:
            assert s["grow_iter"] == pytest.approx(t["grow_iter"], rel=0.02)
    stage = rec["stages"][0]
    for key in ("shape", "params", "N", "start_step", "end_step", "grow_iter", "grow_operator", "compute", "loss_end"):
        assert key in stage
    assert plan["train_py"]["grow_schedule"] == rec["grow_schedule"]
    # a second run refuses to replace it; --force does
    again = run_main("grow.py", ["--plan", f"--runs={','.join(three_sizes)}", f"--budget={BUDGET}", f"--plan_out={out}"])
    assert_one_line_error(again, "already exists", "--force")
    forced = run_main("grow.py", ["--plan", "--runs", *three_sizes, f"--budget={BUDGET}", f"--plan_out={out}", "--force",
                                  "--max_growths=1", "--operators=layers"])
    assert forced.returncode == 0, forced.stderr
    assert [p["sequence"] for p in json.load(open(out))["candidates"]] == [[], ["layers"]]


def test_cli_default_output_and_one_run(tmp_path):
    run = write_run(tmp_path / "only", BASE)
    proc = run_main("grow.py", ["--plan", "--runs", run, "--budget=5e13"])
    assert proc.returncode == 0, proc.stderr
    plan = json.load(open(os.path.join(run, "growth_plan.json")))
    assert plan["fit"]["alpha_N_source"] == "assumed" and "assumed alpha_N" in proc.stdout
    assert not [f for f in os.listdir(run) if f.startswith(".tmp")]


def test_growth_records_end_the_fitted_curve(tmp_path):
    growth = {"iter": 10000, "kind": "growth", "doubling": "weights", "delta_loss": 0.0}
    run = write_run(tmp_path / "grown", BASE, records=[growth])
    r = read_run(run)
    assert r.steps.max() < 10000 and any("grown in the run at iteration 10000" in n for n in r.notes)
    few = write_run(tmp_path / "early", BASE, records=[dict(growth, iter=350)])
    with pytest.raises(UserError, match="before its first growth"):
        read_run(few)
    warm = read_run(write_run(tmp_path / "warm", BASE, warmup_iters=1000))
    assert warm.steps.min() > 1000 and any("LR warmup" in n for n in warm.notes)


# ---------------------------------------------------------------------- bad input: one line, nothing written

def bad_cases(tmp, good):
    few = write_run(tmp / "few", BASE, steps=[0, 100, 200, 300])
    no_cfg = write_run(tmp / "no_cfg", BASE)
    os.remove(os.path.join(no_cfg, "config.json"))
    no_met = write_run(tmp / "no_met", BASE)
    os.remove(os.path.join(no_met, "metrics.jsonl"))
    other_batch = write_run(tmp / "batch", WIDE, batch_size=32)
    tuned = write_run(tmp / "tuned", BASE, init_from="resume_model", model_dir="out/base")
    ramp = write_run(tmp / "ramp", BASE, warmup_bsz=100000)
    return [
        (["--plan", "--runs", few, "--budget=1e14"], "has 3 usable evaluation point(s)", "at least 4"),
        (["--plan", "--runs", no_cfg, "--budget=1e14"], "has no config.json"),
        (["--plan", "--runs", no_met, "--budget=1e14"], "has no metrics.jsonl"),
        (["--plan", "--runs", str(tmp / "missing"), "--budget=1e14"], "not found"),
        (["--plan", "--runs", good, "--budget=0"], "--budget=0.0: must be in (0, inf)"),
        (["--plan", "--runs", good, "--budget=-1e18"], "--budget"),
        (["--plan", "--runs", good, "--budget=1e9"], "smaller than the first stage needs", "FLOPs"),
        (["--plan", "--runs", good], "--budget=FLOPS"),
        (["--plan", "--budget=1e14"], "--plan needs --runs"),
        (["--plan", "--runs", good, "--budget=1e14", "--doubling=weights"], "takes no --doubling"),
        (["--runs", good, "--budget=1e14"], "--runs belongs to --plan"),
        (["--plan", "--runs", good, other_batch, "--budget=1e14"], "differ in tokens per iteration"),
        (["--plan", "--runs", good, good, "--budget=1e14"], "given twice"),
        (["--plan", "--runs", tuned, "--budget=1e14"], "init_from=resume_model"),
        (["--plan", "--runs", ramp, "--budget=1e14"], "warmup_bsz=100000", "fixed batch"),
        (["--plan", "--runs", good, "--budget=1e14", "--operators=heads"], "--operators"),
        (["--plan", "--runs", good, "--target_loss=1.0"], "no candidate plan reaches --target_loss=1.0"),
        (["--plan", "--runs", good, "--budget=1e14", "--threshold_width=0.1"], "--threshold_width"),
    ]


@pytest.mark.slow
def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    good = write_run(tmp_path / "good", BASE)
    cases = bad_cases(tmp_path, good)
    before = files_under(tmp_path)
    for argv, *fragments in cases:
        proc = run_main("grow.py", argv)
        assert_one_line_error(proc, *fragments)
        assert files_under(tmp_path) == before, argv


def test_split_multi_values():
    f = split_multi_values
    assert f(["--plan", "--runs", "a", "b", "--budget=1"]) == ["--plan", "--runs=a", "--runs=b", "--budget=1"]
    assert f(["--runs=a", "b"]) == ["--runs=a", "--runs=b"] and f(["--runs=a,b"]) == ["--runs=a,b"]
    assert f(["--runs", "--budget=1"]) == ["--runs", "--budget=1"]  # argparse reports the missing value
    assert f(["--doubling", "weights", "--resume", "x"]) == ["--doubling", "weights", "--resume", "x"]


# ---------------------------------------------------------------------- the online rule (grow_schedule=auto)

def test_should_grow_uses_the_planners_slope_and_threshold():
    E, f = true_E(non_embedding(BASE)), 9.6e8
    s_pre = first_step_above(slope_crossing(E, TRUE["S_c"], TRUE["alpha_S"], SLOPE_THRESHOLDS["weights"]))
    steps = np.arange(500, 20001, 250, dtype=float)
    C, L = steps * f, law_loss(steps, E, TRUE["S_c"], TRUE["alpha_S"])
    before = steps < s_pre
    for method in ("smoothed", "fit"):
        early = should_grow(C[before], L[before], "weights", method=method)
        late = should_grow(C, L, "weights", method=method)
        assert not early.fire and late.fire and early.threshold == SLOPE_THRESHOLDS["weights"]
        assert steps[late.index] >= s_pre - 250 and steps[late.index] <= s_pre + 5 * 250
    # smoothed: exactly growth.growth_point on the same points
    assert should_grow(C, L, "weights").index == growth_point(list(C), list(L), SLOPE_THRESHOLDS["weights"])
    # fit: the closed form recovers where the rule fires, in compute
    fitted = should_grow(C, L, "weights", method="fit")
    assert fitted.fit["fires_at_compute"] == pytest.approx(s_pre * f, rel=1e-3)
    assert fitted.slope == pytest.approx(law_slope(steps[-1], E, TRUE["S_c"], TRUE["alpha_S"]), rel=1e-4)
    # depth's threshold is lower, so it fires earlier
    assert should_grow(C, L, "layers", method="fit").fit["fires_at_compute"] < fitted.fit["fires_at_compute"]
    # too few points: not yet; bad points: one-line errors
    assert not should_grow(C[:3], L[:3], "weights", method="fit").fire
    with pytest.raises(UserError, match="increase"):
        should_grow([2.0, 1.0], [3.0, 2.0], "weights")
    with pytest.raises(UserError, match="operator"):
        should_grow(C, L, "heads")


# ---------------------------------------------------------------------- real logs

@pytest.mark.slow
def test_plan_from_two_tiny_train_runs(tiny_corpus, tmp_path):
    """Two tiny train.py runs (dim 16 and its width-doubled shape, 120 iterations each, warmup +
    cosine): the planner fits them and returns a consistent plan; only robust properties."""
    common = dict(data_cache_dir=tiny_corpus.cache_dir, vocab_size=tiny_corpus.vocab_size,
                  dataset_name=tiny_corpus.dataset_name, multiple_of=16, max_seq_len=32, batch_size=4,
                  gradient_accumulation_steps=1, learning_rate=3e-3, warmup_iters=4, max_iters=120, eval_interval=8,
                  eval_iters=2, log_interval=10, max_new_tokens=0, device="cpu", dtype="float32", dropout=0.0)
    shapes = {"small": dict(dim=16, n_layers=1, n_heads=2, n_kv_heads=1),
              "large": dict(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, hidden_dim=96)}  # small, width x2
    dirs = []
    for name, shape in shapes.items():
        dirs.append(str(tmp_path / name))
        run_main("train.py", [f"--{k}={v}" for k, v in {**common, **shape, "out_dir": dirs[-1]}.items()], check=True)
    budget = 1e13  # ~1000x what each run spent
    proc = run_main("grow.py", ["--plan", "--runs", *dirs, f"--budget={budget}"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.load(open(os.path.join(dirs[0], "growth_plan.json")))
    fit = plan["fit"]
    small, large = (next(s for s in fit["sizes"] if d in s["runs"]) for d in dirs)
    assert large["N"] > small["N"] and 0 < large["E"] < small["E"]   # the wider model learns more
    assert ALPHA_S_BOUNDS[0] <= fit["alpha_S"] <= ALPHA_S_BOUNDS[1]
    assert all(r["rmse_log_loss"] < 0.1 and r["points"] == 15 for r in plan["runs"])  # evaluations 8, 16, ..., 120
    rec = plan["recommended"]
    stages = rec["stages"]
    assert rec["compute"] <= budget * (1 + 1e-9) and rec["final_loss"] > 0
    for a, b in zip(stages, stages[1:]):
        assert b["start_iter"] == a["end_iter"] == a["grow_iter"] and b["params"] > a["params"]
    if any(s.get("grow_operator") == "weights" for s in stages[:1]):
        assert stages[1]["E_source"] == "fitted" and stages[1]["E"] == large["E"]  # the large run's own E
    no_growth = next(p for p in plan["candidates"] if not p["sequence"])
    assert no_growth["status"] == "ok" and rec["final_loss"] <= no_growth["final_loss"]
    assert "recommended:" in proc.stdout
