"""grow.py --plan --law=kaplan: growth stages from Kaplan et al.'s published constants, as
staged-training's PR #4 (compute_optimal_schedule.py) plans them. The references re-implement
PR #4's formulas here: the constants (lines 14-21), L(N, S) with S_min = S / 2 (44-48), B_crit
(123-125), the steps to a loss (224-233), the stage losses joined at equal loss (251-283) and the
compute 6 N B S (210-215)."""
import json
import math

import numpy as np
import pytest
from conftest import assert_one_line_error, run_main

from tinylab.growth.plan.kaplan import kaplan_loss, kaplan_plan, least_compute, steps_to

B_star, S_c, N_c, alpha_B, alpha_N, alpha_S = 2.1e8, 2.1e3, 8.8e13, 0.21, 0.076, 0.76


def pr4_loss(N, S):
    return (N_c / N) ** alpha_N + (2 * S_c / S) ** alpha_S


def pr4_steps(N, L):
    return 2 * S_c / ((L - (N_c / N) ** alpha_N) ** (1.0 / alpha_S))


def pr4_stage_losses(sizes, total_steps):
    """MinimizeComputeSchedule.get_loss_at_each_stage."""
    losses = [pr4_loss(sizes[0], total_steps[0])]
    for k in range(1, len(sizes)):
        s_eff = pr4_steps(sizes[k], losses[-1])
        losses.append(pr4_loss(sizes[k], s_eff + total_steps[k] - total_steps[k - 1]))
    return losses


def test_the_law_is_kaplans():
    assert kaplan_loss(1e8, 1e4) == pytest.approx(880000 ** 0.076 + 0.42 ** 0.76, rel=1e-14)
    assert kaplan_loss(1e8, 1e4) == pytest.approx(2.8300 + 0.5168, abs=1e-3)  # by hand: 2.82998 + 0.51683
    assert steps_to(1e8, kaplan_loss(1e8, 1e4)) == pytest.approx(1e4, rel=1e-12)
    assert math.isinf(steps_to(1e8, 2.0))  # below E(1e8) = 2.83: never


@pytest.mark.slow
@pytest.mark.parametrize("budget,stages", [(1e20, 3), (1e18, 2)])
def test_plan_at_a_budget_against_pr4s_formulas(budget, stages):
    plan = kaplan_plan(budget=budget, stages=stages)
    L = plan["final_loss"]
    B = B_star / L ** (1.0 / alpha_B)  # the critical batch at the final loss, every stage
    sizes = [s["N"] for s in plan["stages"]]
    steps = [s["steps"] for s in plan["stages"]]
    assert sizes == sorted(sizes) and all(s >= 0 for s in steps)
    losses = pr4_stage_losses(sizes, np.cumsum(steps))
    assert [s["loss_end"] for s in plan["stages"]] == pytest.approx(losses, rel=1e-9)
    assert losses[-1] == pytest.approx(L, rel=1e-9)
    assert [s["batch_tokens"] for s in plan["stages"]] == pytest.approx([B] * stages, rel=1e-12)
    assert sum(6.0 * N * B * S for N, S in zip(sizes, steps)) == pytest.approx(budget, rel=1e-6)
    # PR #4's MinimizeComputeFixedSize on a grid: no single size reaches L for less
    grid = np.geomspace(1e5, 1e12, 20001)
    gaps = L - (N_c / grid) ** alpha_N
    ok = gaps > 0
    best = np.min(6.0 * grid[ok] * B * 2 * S_c / gaps[ok] ** (1 / alpha_S))
    one = plan["same_loss_one_size"]
    assert one["compute"] == pytest.approx(best, rel=1e-5) and one["compute"] <= best * (1 + 1e-9)
    assert plan["saving"] == pytest.approx(1 - budget / one["compute"], rel=1e-6) and plan["saving"] > 0
    # more stages never cost more (the schedule includes the single size)
    assert least_compute(L, stages)[1] <= least_compute(L, 1)[1] * (1 + 1e-9)


def test_cli_prints_and_writes_through_the_output_guard(tmp_path):
    out = tmp_path / "plan.json"
    proc = run_main("grow.py", ["--plan", "--law=kaplan", "--budget=1e19", "--max_growths=1", f"--plan_out={out}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["law"] == "kaplan" and len(data["stages"]) == 2 and data["budget"] == 1e19
    assert data["constants"] == dict(N_c=N_c, alpha_N=alpha_N, S_c=S_c, alpha_S=alpha_S, B_star=B_star, alpha_B=alpha_B)
    assert f"final loss {data['final_loss']:.4f}" in proc.stdout and f"wrote {out}" in proc.stdout
    before = out.read_bytes()
    proc = run_main("grow.py", ["--plan", "--law=kaplan", "--budget=1e19", f"--plan_out={out}"])
    assert_one_line_error(proc, str(out))  # an existing plan is replaced only with --force
    assert out.read_bytes() == before
    proc = run_main("grow.py", ["--plan", "--law=kaplan", "--target_loss=3.0", "--max_growths=0"])
    assert proc.returncode == 0 and "wrote" not in proc.stdout, proc.stderr[-2000:]
    assert "target loss 3.0" in proc.stdout
