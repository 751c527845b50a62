"""When to grow: the paper's slope rule (docs/growth.md §7), for grow_schedule=auto and the planner.

The smoothed slope of log10 loss against log10 compute rises above an operator's threshold
(its registry entry's slope_threshold; "optimality" for the optimality point) at the growth point.
`should_grow` decides on the points so far, either with the paper's smoothed test or with the
planner's closed form on a fit of them.
"""
import math
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from tinylab.core.errors import UserError
from tinylab.growth.ops import OPERATORS
from tinylab.growth.plan.fit import fit_law
from tinylab.growth.plan.law import law_slope, slope_crossing
from tinylab.growth.plan.runs import MIN_POINTS

OPTIMALITY_THRESHOLD = -0.052  # the slope at the optimality point (reported for a plan's last stage)
# the thresholds by name (weights, layers, ..., optimality); the planner's defaults
SLOPE_THRESHOLDS = {**{op.name: op.slope_threshold for op in OPERATORS}, "optimality": OPTIMALITY_THRESHOLD}


def loss_slopes(compute, losses, window=5):
    """s = d log10 L / d log10 C between consecutive points, smoothed by a trailing running mean
    over `window` slopes; s[i] belongs to point i (None for the first point)."""
    raw = [None] + [(math.log10(losses[i]) - math.log10(losses[i - 1])) / (math.log10(compute[i]) - math.log10(compute[i - 1]))
                    for i in range(1, len(compute))]
    return [None if i == 0 else sum(raw[max(1, i - window + 1):i + 1]) / (i + 1 - max(1, i - window + 1))
            for i in range(len(raw))]


def growth_point(compute, losses, threshold, window=5):
    """Index of the first point after the steepest smoothed slope where the slope rises above
    `threshold` (SLOPE_THRESHOLDS), or None if it has not yet."""
    s = loss_slopes(compute, losses, window)
    valid = [i for i in range(len(s)) if s[i] is not None]
    if not valid:
        return None
    steepest = min(valid, key=lambda i: s[i])
    return next((i for i in valid if i > steepest and s[i] > threshold), None)


@dataclass
class RuleDecision:
    fire: bool                       # grow now
    index: Optional[int]             # the point at which the rule fired (None: not yet)
    slope: Optional[float]           # the slope the decision used, at the last point
    threshold: float
    method: str                      # smoothed | fit
    fit: Optional[dict] = None       # method fit: {"E", "C_c", "alpha", "fires_at_compute"}

    def to_json(self):
        return asdict(self)


def checked_points(compute, losses):
    compute, losses = [float(c) for c in compute], [float(v) for v in losses]
    if len(compute) != len(losses):
        raise UserError(f"{len(compute)} compute values but {len(losses)} losses")
    if any(not (c > 0 and math.isfinite(c)) for c in compute) or any(not (v > 0 and math.isfinite(v)) for v in losses):
        raise UserError("the rule needs points with finite compute > 0 and loss > 0")
    if any(b <= a for a, b in zip(compute, compute[1:])):
        raise UserError("compute must increase from point to point")
    return compute, losses


def should_grow(compute, losses, operator, thresholds=None, window=5, method="smoothed") -> RuleDecision:
    """Does the paper's growth rule fire now for `operator` (an operator's name, or optimality)?

    `compute` and `losses`: the current model's evaluations so far, in order, compute > 0, on the
    current model's own curve (C proportional to its schedule position S: for a grown model pass
    flops_per_iter x (iter - shift), not the compute the earlier stages spent).
      method "smoothed": the paper's test on the points themselves (loss_slopes over a running
        window, growth_point: the first point after the steepest smoothed slope whose slope is
        above the threshold); `slope` is the last smoothed slope.
      method "fit": the planner's closed form: fit L(C) = E + (C_c/C)^alpha to the points (needs
        MIN_POINTS) and fire when the fitted slope at the last point is above the threshold;
        `fit["fires_at_compute"]` is where it will (C proportional to S, so the fitted form and
        slope are those of L(S)).
    """
    th = {**SLOPE_THRESHOLDS, **(thresholds or {})}
    if operator not in th:
        raise UserError(f"operator must be one of {', '.join(th)}, not '{operator}'")
    tau = th[operator]
    compute, losses = checked_points(compute, losses)
    if method == "smoothed":
        if len(compute) < 2:
            return RuleDecision(False, None, None, tau, method)
        idx = growth_point(compute, losses, tau, window)
        return RuleDecision(idx is not None, idx, loss_slopes(compute, losses, window)[-1], tau, method)
    if method != "fit":
        raise UserError(f"method must be smoothed or fit, not '{method}'")
    if len(compute) < MIN_POINTS:
        return RuleDecision(False, None, None, tau, method)
    alpha, c_c, E, _ = fit_law(np.array(compute), np.array(losses), np.zeros(len(compute), int), 1)
    s = law_slope(compute[-1], E[0], c_c, alpha)
    at = slope_crossing(E[0], c_c, alpha, tau)
    idx = next((i for i, c in enumerate(compute) if c > at), None)
    return RuleDecision(bool(s > tau), idx if s > tau else None, float(s), tau, method,
                        {"E": float(E[0]), "C_c": c_c, "alpha": alpha, "fires_at_compute": at})
