"""The fitted form and its closed forms (docs/growth.md §7.1).

Per model size L(S) = E + (S_c / S)^alpha (S: optimizer steps at the runs' batch). Its log-log
slope s = d log10 L / d log10 S = -alpha x / (E + x), x = (S_c/S)^alpha, rises monotonically from
-alpha towards 0, so the step at which it crosses a threshold, and the step at which the curve
reaches a loss, have closed forms.
"""
import math

# Kaplan et al. 2020, Table 5 (as staged-training's compute_optimal_schedule.py:14-21 writes them)
KAPLAN = {"N_c": 8.8e13, "alpha_N": 0.076, "S_c": 2.1e3, "alpha_S": 0.76, "B_star": 2.1e8, "alpha_B": 0.21}


def law_loss(S, E, S_c, alpha):
    """L(S) = E + (S_c / S)^alpha (S: optimizer steps at the runs' batch)."""
    return E + (S_c / S) ** alpha


def law_slope(S, E, S_c, alpha):
    """d log10 L / d log10 S = -alpha x / (E + x), x = (S_c/S)^alpha. At a fixed model and batch
    C is proportional to S, so this is also d log10 L / d log10 C, the slope of the paper's rule."""
    x = (S_c / S) ** alpha
    return -alpha * x / (E + x)


def slope_crossing(E, S_c, alpha, threshold):
    """The step at which law_slope rises through `threshold` (< 0): the slope increases
    monotonically from -alpha towards 0, so it is above the threshold exactly for S > this.
    0 when alpha <= |threshold| (above it from the start), inf when E = 0 (a pure power law
    keeps the slope -alpha for ever)."""
    t = -threshold
    if alpha <= t:
        return 0.0
    if E <= 0:
        return math.inf
    return S_c * (t * E / (alpha - t)) ** (-1.0 / alpha)


def steps_to_loss(L, E, S_c, alpha):
    """The step at which the curve reaches loss L (inf when L <= E)."""
    return math.inf if L <= E else S_c * (L - E) ** (-1.0 / alpha)


def first_step_above(s_cross):
    """The first integer step whose slope is above the threshold, given the crossing point."""
    return math.inf if math.isinf(s_cross) else math.floor(s_cross) + 1

