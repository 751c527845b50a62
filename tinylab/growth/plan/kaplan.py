"""Growth stages from Kaplan et al.'s published constants, without runs, as staged-training's PR #4
(compute_optimal_schedule.py, MinimizeComputeSchedule) plans them: `grow.py --plan --law=kaplan`.

    L(N, S)    = (N_c / N)^alpha_N + (2 S_c / S)^alpha_S    N non-embedding parameters, S steps at
                                                             the critical batch (S_min = S / 2)
    B_crit(L)  = B* / L^(1 / alpha_B)                        tokens per step
    S(N, L)    = 2 S_c / (L - (N_c / N)^alpha_N)^(1 / alpha_S)   the steps N needs to reach L
    stage k    size N_k >= N_{k-1}; it starts where its own curve has the loss stage k-1 ended
               with (S(N_k, loss_{k-1})) and trains S_k steps: loss_k = L(N_k, S(N_k, loss_{k-1}) + S_k)
    compute    sum_k 6 N_k B_crit(L_target) S_k (FLOPs; PF-days = FLOPs / 8.64e19)

PR #4 minimises the compute to a target loss with SLSQP over (log10 N_0, log10 S_0, increments).
Here the same problem is written in the stages' end losses and sizes, where the final-loss
constraint and N_k >= N_{k-1} hold by construction (E_k = (N_c/N_k)^alpha_N lies between E_{k+1}
and loss_k), and minimised by L-BFGS; a budget is met by bisection on the target loss (the least
compute to a loss falls as the loss rises).
"""
import math

import torch

from tinylab.core.errors import UserError
from tinylab.growth.plan.law import KAPLAN

PF_DAY = 8.64e19  # FLOPs in one PF-day (compute_optimal_schedule.py:24-26)
SOURCE = "allenai/staged-training PR #4, compute_optimal_schedule.py (Kaplan et al. 2020, Table 5)"


def kaplan_loss(N, S):
    return (KAPLAN["N_c"] / N) ** KAPLAN["alpha_N"] + (2 * KAPLAN["S_c"] / S) ** KAPLAN["alpha_S"]


def critical_batch(L):
    return KAPLAN["B_star"] / L ** (1.0 / KAPLAN["alpha_B"])


def steps_to(N, L):
    """S(N, L): the steps (at the critical batch) size N needs to reach loss L (inf when it cannot)."""
    gap = L - (KAPLAN["N_c"] / N) ** KAPLAN["alpha_N"]
    return math.inf if gap <= 0 else 2 * KAPLAN["S_c"] / gap ** (1.0 / KAPLAN["alpha_S"])


def _stages(theta, L, k):
    """(sizes N_k, end losses loss_k) of a k-stage schedule ending at loss L, from free variables:
    theta[:k] place E_k in (E_{k+1}, loss_k), theta[k:] are log gaps loss_{j} - loss_{j+1}."""
    a_n, a_s = KAPLAN["alpha_N"], KAPLAN["alpha_S"]
    losses, E = [L] * k, [None] * k
    for j in range(k - 2, -1, -1):
        losses[j] = losses[j + 1] + torch.exp(theta[k + j])
    E[k - 1] = L * torch.sigmoid(theta[k - 1])
    for j in range(k - 2, -1, -1):
        E[j] = E[j + 1] + (losses[j] - E[j + 1]) * torch.sigmoid(theta[j])
    sizes = [KAPLAN["N_c"] / e ** (1.0 / a_n) for e in E]
    steps = [[2 * KAPLAN["S_c"] / (lo - e) ** (1.0 / a_s) for lo in losses] for e in E]  # S(N_j, loss_i)
    return sizes, losses, steps


def _log_cost(theta, L, k):
    """log of sum_j N_j S_j (the compute without its constant factor 6 B)."""
    sizes, _, steps = _stages(theta, L, k)
    total = sizes[0] * steps[0][0]
    for j in range(1, k):
        total = total + sizes[j] * (steps[j][j] - steps[j][j - 1])
    return torch.log(total)


def _minimise(L, k, start):
    theta = start.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([theta], lr=1, max_iter=200, tolerance_grad=1e-10, tolerance_change=1e-13,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        value = _log_cost(theta, L, k)
        value.backward()
        return value

    opt.step(closure)
    with torch.no_grad():
        return theta.detach(), float(_log_cost(theta, L, k))


def least_compute(L, k, start=None):
    """(theta, FLOPs) of the k-stage schedule that reaches loss L with the least compute."""
    if start is None:  # a few deterministic starts: sizes spread over the loss range, gaps from L / k to 4 L
        starts = [torch.cat([torch.full((k,), u, dtype=torch.float64),
                             torch.full((k - 1,), math.log(g * L / k), dtype=torch.float64)])
                  for u in (0.0, -2.0) for g in ((1.0,) if k == 1 else (0.25, 2.0))]
    else:
        starts = [start]
    theta, log_cost = min((_minimise(L, k, s) for s in starts), key=lambda r: r[1])
    return theta, 6.0 * critical_batch(L) * math.exp(log_cost)


def loss_at_budget(budget, k):
    """(L, theta): the lowest loss whose least compute is the budget (bisection on log L)."""
    lo, hi = 0.5, 8.0  # losses in nats; widened until they bracket the budget
    while least_compute(lo, k)[1] < budget:
        lo /= 2
        if lo < 1e-3:
            raise UserError(f"--budget={budget:.3e} FLOPs is beyond what this plan can price (loss < 1e-3 nats)")
    while least_compute(hi, k)[1] > budget:
        hi *= 2
        if hi > 1e3:
            raise UserError(f"--budget={budget:.3e} FLOPs is too small to plan with Kaplan et al.'s law")
    theta = None
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        theta, c = least_compute(mid, k, theta)
        lo, hi = (mid, hi) if c > budget else (lo, mid)
        if hi / lo < 1 + 1e-8:
            break
    return hi, least_compute(hi, k, theta)[0]


def describe(theta, L, k):
    """The stages as PR #4's print_info_schedule lists them (loss, size, growth, steps, compute, batch)."""
    with torch.no_grad():
        sizes, losses, steps = _stages(theta, L, k)
    B = critical_batch(L)
    stages, total = [], 0
    for j in range(k):
        N = float(sizes[j])
        S = float(steps[j][0]) if j == 0 else float(steps[j][j] - steps[j][j - 1])
        start = 0.0 if j == 0 else float(steps[j][j - 1])
        stages.append({"N": N, "growth": None if j == 0 else N / float(sizes[j - 1]),
                       "loss_start": None if j == 0 else float(losses[j - 1]), "loss_end": float(losses[j]),
                       "start_step": start, "steps": S, "batch_tokens": B, "compute": 6.0 * N * B * S})
        total += stages[-1]["compute"]
    for s in stages:
        s["compute_share"], s["pf_days"] = s["compute"] / total, s["compute"] / PF_DAY
    return stages, total


def fixed_size(L):
    """PR #4's MinimizeComputeFixedSize: the one size that reaches L with the least compute."""
    theta, compute = least_compute(L, 1)
    stages, _ = describe(theta, L, 1)
    return {"N": stages[0]["N"], "steps": stages[0]["steps"], "compute": compute, "loss": L}


def kaplan_plan(budget=None, target_loss=None, stages=3) -> dict:
    """The plan: the lowest loss at `budget` FLOPs (or the least compute to `target_loss`) with up
    to `stages` model sizes, and the best single size on the same terms."""
    if target_loss is None:
        L, theta = loss_at_budget(budget, stages)
    else:
        L, (theta, _) = target_loss, least_compute(target_loss, stages)
    plan_stages, compute = describe(theta, L, stages)
    single = fixed_size(L)
    out = {"version": 1, "law": "kaplan", "source": SOURCE,
           "objective": "lowest predicted loss at the budget" if target_loss is None else "least compute to the target loss",
           "budget": budget, "target_loss": target_loss, "final_loss": L, "compute": compute,
           "constants": dict(KAPLAN), "stages": plan_stages,
           "form": "L(N, S) = (N_c/N)^alpha_N + (2 S_c/S)^alpha_S; B_crit(L) = B_star / L^(1/alpha_B); "
                   "compute = sum 6 N_k B_crit(L_final) S_k",
           "same_loss_one_size": single, "saving": 1 - compute / single["compute"]}
    if target_loss is None:
        loss_one, theta_one = loss_at_budget(budget, 1)
        out["one_size_at_budget"] = {**fixed_size(loss_one), "compute": budget}
    return out
