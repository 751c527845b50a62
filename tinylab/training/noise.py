"""The gradient-noise estimate of the critical batch size (McCandlish et al. 2018, App. A), which
the Trainer logs on log steps with critical_batch_size=True (staged-training logs it to decide when
to grow). It needs two gradients of one step: one micro-batch's (b_small sequences, measured after
the first micro-step) and the whole step's (b_big sequences, before clipping).
"""
import torch

from tinylab.core.distributed import all_reduce_mean, local_shard


def grad_sq_norm(model, run=None) -> torch.Tensor:
    """Sum of the squared gradients of `model` (a device tensor: no host sync); under FSDP
    (`run.fsdp`) over all ranks' gradient shards (an all-reduce)."""
    grads = [local_shard(p.grad) for p in model.parameters() if p.grad is not None]
    total = torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum()
    return all_reduce_mean(total, run.dist) * run.dist.world_size if run is not None and run.fsdp else total


def step_sample(g_small, model, run, scaler, micro_rows, micro_steps):
    """(|g_small|^2, |g_big|^2, b_small, b_big) of the step whose gradient `model` now holds;
    `g_small`: the first micro-batch's squared norm (micro_rows rows on each process)."""
    world = run.dist.world_size
    g_big = grad_sq_norm(model, run)  # the step's gradient, before clipping
    if scaler.is_enabled():
        g_small, g_big = g_small / scaler.get_scale() ** 2, g_big / scaler.get_scale() ** 2
    if run.fsdp:  # the first micro-step's gradient is already the mean over all ranks' first micro-batches
        return g_small, g_big, micro_rows * world, micro_rows * micro_steps * world
    return all_reduce_mean(g_small, run.dist), g_big, micro_rows, micro_rows * micro_steps * world


def critical_batch_size(ema, g_small, g_big, b_small, b_big):
    """(new running means, metrics) from one step's squared gradient norms:
        |G|^2 ~ (b_big |g_big|^2 - b_small |g_small|^2) / (b_big - b_small)
        S     ~ (|g_small|^2 - |g_big|^2) / (1/b_small - 1/b_big)
    B_crit = S / |G|^2, in sequences. A single step's estimate is noisy (it can be negative), so
    the logged `critical_batch_size` is the ratio of running means (decay 0.9, `ema`: {"g2",
    "trace"} or None at the start) over log steps, the step's own ratio
    `critical_batch_size_step`. (The original plugged gradient norms, not squared norms, into
    these formulas.)"""
    g_small, g_big = float(g_small), float(g_big)
    g2 = (b_big * g_big - b_small * g_small) / (b_big - b_small)
    trace = (g_small - g_big) / (1.0 / b_small - 1.0 / b_big)
    ema = ema or {"g2": g2, "trace": trace}
    ema = {"g2": 0.9 * ema["g2"] + 0.1 * g2, "trace": 0.9 * ema["trace"] + 0.1 * trace}
    return ema, {"critical_batch_size": ema["trace"] / ema["g2"] if ema["g2"] > 0 else float("nan"),
                 "critical_batch_size_step": trace / g2 if g2 != 0 else float("nan")}
