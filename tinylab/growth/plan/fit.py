"""Fitting Kaplan et al.'s L(N, S) = (N_c/N)^α_N + (S_c/S)^α_S to the runs (`fit_runs`).

Per model size L(S) = E_N + (S_c/S)^α_S with (S_c, α_S) shared by all sizes, then
E(N) = (N_c/N)^α_N across sizes (one size: α_N assumed, Kaplan's 0.076). Least squares in log
loss: a grid over α_S with a linear solve for (E_N, S_c^α_S), then Levenberg-Marquardt on all
parameters inside bounds (`fit_law`).
"""
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from tinylab.core.errors import UserError
from tinylab.growth.plan.law import KAPLAN, law_loss
from tinylab.growth.plan.shapes import N_DEFINITION, shape_dict, shape_key, shape_text_from

MIN_POINTS = 4            # per run: E, S_c, alpha_S of a one-size fit, plus one point to judge the fit
ROUGH_FIT = 0.02          # RMSE in log loss above which a run's fit is reported as rough
ALPHA_N_MAX = 1.0         # E(N) exponent bound (Kaplan: 0.076); beyond it the E_N are degenerate
ALPHA_S_BOUNDS = (0.01, 4.0)
LN_SC_BOUNDS = (math.log(1e-6), math.log(1e12))   # S_c in units of the first fitted step


def _sigmoid(t):
    return 1.0 / (1.0 + np.exp(-np.clip(t, -700, 700)))


def _logit(p, eps=1e-9):
    p = np.clip(p, eps, 1 - eps)
    return np.log(p / (1 - p))


def fit_law(S, L, group, n_groups):
    """Least squares in log loss of L_i = E_{g_i} + (S_c / S_i)^alpha over points of several
    sizes sharing (S_c, alpha). Returns (alpha, S_c, E[n_groups], sse). Bounds: alpha in
    ALPHA_S_BOUNDS, ln S_c in LN_SC_BOUNDS, 0 <= E_g < the group's lowest observed loss.
    A grid over alpha with a linear solve for (E, A = S_c^alpha) (weights 1/L, so the linear
    residual approximates the log one) starts Levenberg-Marquardt on all parameters, which works
    in unconstrained coordinates (logistic maps onto the bounds) with an analytic Jacobian."""
    S, L, group = np.asarray(S, float), np.asarray(L, float), np.asarray(group, int)
    unit = float(S.min())  # fitted in units of the first step (compute too): the bounds are relative
    S = S / unit
    lmin = np.array([L[group == k].min() for k in range(n_groups)])
    e_top = lmin * (1 - 1e-9)
    alpha, lnsc, E = _grid_start(S, L, group, n_groups, lmin, e_top)
    alpha, b, E, cost = _levenberg_marquardt(S, L, group, e_top, alpha, lnsc, E)
    return float(alpha), float(math.exp(b)) * unit, np.asarray(E, float), cost


def _log_sse(alpha, lnsc, E, group, lnS, lnL):
    expo = np.clip(alpha * (lnsc - lnS), -700, 700)
    pred = E[group] + np.exp(expo)
    return float(np.sum((np.log(pred) - lnL) ** 2))


def _grid_start(S, L, group, n_groups, lmin, e_top):
    """(alpha, ln S_c, E) of the best point of a grid over alpha, each with the linear solve."""
    lnS, lnL, w = np.log(S), np.log(L), 1.0 / L
    lo, hi = ALPHA_S_BOUNDS
    best = None
    for alpha in np.geomspace(lo * 2, hi * 0.9, 90):
        u = S ** -alpha
        X = np.zeros((len(S), n_groups + 1))
        X[np.arange(len(S)), group] = 1.0
        X[:, -1] = u
        beta = np.linalg.lstsq(X * w[:, None], L * w, rcond=None)[0]
        E = np.clip(beta[:n_groups], 0.0, e_top)
        A = float(np.sum(w ** 2 * (L - E[group]) * u) / np.sum(w ** 2 * u ** 2))
        if not A > 0:
            continue
        lnsc = float(np.clip(math.log(A) / alpha, *LN_SC_BOUNDS))
        sse = _log_sse(alpha, lnsc, E, group, lnS, lnL)
        if best is None or sse < best[0]:
            best = (sse, alpha, lnsc, E)
    if best is None:  # no alpha gives a falling curve: start from a flat one
        best = (math.inf, 0.5, float(np.log(S.min())), lmin * 0.5)
    return best[1:]


def _levenberg_marquardt(S, L, group, e_top, alpha, lnsc, E):
    """(alpha, ln S_c, E, sse) refined from the start. theta = [a, b, e_1..e_G],
    alpha = lo + (hi - lo) sigmoid(a), ln S_c = b, E_g = e_top_g sigmoid(e_g)."""
    lnS, lnL = np.log(S), np.log(L)
    lo, hi = ALPHA_S_BOUNDS
    n_groups = len(e_top)
    theta = np.concatenate([[float(_logit(np.array((alpha - lo) / (hi - lo))))], [lnsc], _logit(E / e_top)])

    def unpack(th):
        sa = _sigmoid(th[0])
        return lo + (hi - lo) * sa, float(np.clip(th[1], *LN_SC_BOUNDS)), e_top * _sigmoid(th[2:]), sa

    def residuals(th):
        alpha, b, E, _ = unpack(th)
        u = np.exp(np.clip(alpha * (b - lnS), -700, 700))
        pred = E[group] + u
        return np.log(pred) - lnL, u, pred

    r, u, pred = residuals(theta)
    cost, lam = float(r @ r), 1e-3
    for _ in range(300):
        alpha, b, E, sa = unpack(theta)
        J = np.zeros((len(S), 2 + n_groups))
        J[:, 0] = (b - lnS) * u / pred * (hi - lo) * sa * (1 - sa)
        J[:, 1] = alpha * u / pred
        se = _sigmoid(theta[2:])
        J[np.arange(len(S)), 2 + group] = (e_top * se * (1 - se))[group] / pred
        A, g = J.T @ J, J.T @ r
        improved = False
        while lam < 1e12:
            step = np.linalg.solve(A + lam * (np.diag(np.diag(A)) + 1e-12 * np.eye(len(theta))), -g)
            cand = theta + step
            cand[1] = np.clip(cand[1], *LN_SC_BOUNDS)
            r2, u2, pred2 = residuals(cand)
            c2 = float(r2 @ r2)
            if np.isfinite(c2) and c2 < cost:
                improved = cost - c2 > 1e-14 * max(cost, 1e-300)
                theta, r, u, pred, cost, lam = cand, r2, u2, pred2, c2, max(lam / 3, 1e-12)
                break
            lam *= 4
        if not improved:
            break
    alpha, b, E, _ = unpack(theta)
    return alpha, b, E, cost


@dataclass
class ScalingFit:
    """L(N, S) = E(N) + (S_c / S)^alpha_S, E(N) = (N_c / N)^alpha_N, E measured per fitted size."""
    alpha_S: float
    S_c: float
    alpha_N: float
    N_c: Optional[float]              # None when alpha_N = 0 (E constant, E_const)
    sizes: list                       # [{"shape", "key", "N", "E", "runs"}]
    alpha_N_source: str = "fit"       # fit | assumed (one size) | clamped (E does not fall with N)
    E_const: Optional[float] = None
    rmse: dict = field(default_factory=dict)   # run path -> RMSE of log loss
    notes: list = field(default_factory=list)

    def E_of_N(self, N):
        if self.alpha_N == 0 or self.N_c is None:
            return self.E_const
        return (self.N_c / N) ** self.alpha_N

    def E(self, args, N):
        """The irreducible loss of a shape: the fitted E_N of a size that was run, else E(N)."""
        key = shape_key(args)
        for s in self.sizes:
            if s["key"] == key:
                return s["E"]
        return self.E_of_N(N)

    def measured(self, args):
        return any(s["key"] == shape_key(args) for s in self.sizes)

    def loss(self, E, S):
        return law_loss(S, E, self.S_c, self.alpha_S)

    def to_json(self):
        return {"form": "L(N, S) = (N_c/N)^alpha_N + (S_c/S)^alpha_S; per fitted size L(S) = E_N + (S_c/S)^alpha_S",
                "alpha_S": self.alpha_S, "S_c": self.S_c, "alpha_N": self.alpha_N, "N_c": self.N_c,
                "alpha_N_source": self.alpha_N_source, "E_const": self.E_const,
                "sizes": [{"shape": s["shape"], "N": s["N"], "E": s["E"], "runs": s["runs"]} for s in self.sizes],
                "rmse_log_loss": self.rmse, "S": "optimizer steps at the runs' batch (tokens per iteration)",
                "N": N_DEFINITION, "notes": self.notes}


def fit_points(S, L, group, n_groups):
    """fit_law, with the argument checks of a public entry point."""
    S, L = np.asarray(S, float), np.asarray(L, float)
    if len(S) < 2 + n_groups + 1 or np.any(S <= 0) or np.any(L <= 0):
        raise UserError(f"a fit of {n_groups} size(s) needs more than {2 + n_groups} points with step > 0 and loss > 0")
    return fit_law(S, L, group, n_groups)



def fit_runs(runs, alpha_N=KAPLAN["alpha_N"]) -> ScalingFit:
    """Fit the shared step term and the per-size E_N to the runs, then E(N) across sizes."""
    sizes = []
    for r in runs:
        key = shape_key(r.args)
        s = next((s for s in sizes if s["key"] == key), None)
        if s is None:
            s = {"key": key, "shape": shape_dict(r.args), "N": r.N, "runs": []}
            sizes.append(s)
        s["runs"].append(r.path)
    index = {s["key"]: k for k, s in enumerate(sizes)}
    S = np.concatenate([r.steps for r in runs])
    L = np.concatenate([r.losses for r in runs])
    g = np.concatenate([np.full(len(r.steps), index[shape_key(r.args)]) for r in runs])
    a_s, s_c, E, _ = fit_points(S, L, g, len(sizes))
    fit = ScalingFit(alpha_S=a_s, S_c=s_c, alpha_N=alpha_N, N_c=None, sizes=sizes)
    for s, e in zip(sizes, E):
        s["E"] = float(e)
    note_bounds(fit, runs)
    for r in runs:
        k = index[shape_key(r.args)]
        pred = law_loss(r.steps, E[k], s_c, a_s)
        fit.rmse[r.path] = float(np.sqrt(np.mean((np.log(pred) - np.log(r.losses)) ** 2)))
        if fit.rmse[r.path] > ROUGH_FIT:
            fit.notes.append(f"the fitted form describes {r.path} only roughly (RMSE {fit.rmse[r.path]:.3f} in log loss: "
                             f"its curve is not yet in the power-law regime, or its LR decay bends it); plans from it "
                             f"are rough extrapolations")
    fit_E_of_N(fit, alpha_N)
    return fit


def note_bounds(fit, runs):
    """Notes on fitted values at their bounds (E at 0 or at the lowest loss, alpha_S at either end)."""
    for s in fit.sizes:
        e = s["E"]
        lmin = min(float(r.losses.min()) for r in runs if shape_key(r.args) == s["key"])
        if e < 1e-6 * lmin:
            fit.notes.append(f"E of {shape_text_from(s['shape'])} is at its bound 0 (a pure power law: the slope never "
                             f"rises, so the rule does not fire on this size)")
        elif e > (1 - 1e-4) * lmin:
            fit.notes.append(f"E of {shape_text_from(s['shape'])} is at its bound (the lowest observed loss): the curve "
                             f"has flattened out or the fit is poor")
    for bound, name in ((ALPHA_S_BOUNDS[0], "lower"), (ALPHA_S_BOUNDS[1], "upper")):
        if abs(fit.alpha_S - bound) < 1e-3 * bound:
            fit.notes.append(f"alpha_S is at its {name} bound {bound}")


def fit_E_of_N(fit, alpha_N):
    """E(N) = (N_c/N)^alpha_N through the fitted sizes' E_N (one size: alpha_N assumed)."""
    sizes = fit.sizes
    Ns = np.array([s["N"] for s in sizes], float)
    Es = np.array([max(s["E"], 1e-12) for s in sizes])
    if len(sizes) == 1:
        fit.alpha_N_source = "assumed"
        fit.N_c = float(Ns[0] * Es[0] ** (1 / alpha_N))
        fit.notes.append(f"one model size: grown sizes are predicted with an assumed alpha_N = {alpha_N} "
                         f"(--alpha_N; Kaplan et al.'s), E(N) = E_N (N_run / N)^alpha_N")
        return
    if len(set(Ns)) < len(Ns) and len(set(Ns)) == 1:
        raise UserError("the runs' model sizes differ in shape but not in N; E(N) cannot be fitted across them")
    slope, c0 = np.polyfit(np.log(Ns), np.log(Es), 1)
    if -slope > ALPHA_N_MAX:
        fit.alpha_N, fit.alpha_N_source = ALPHA_N_MAX, "clamped"
        m = float(np.mean(np.log(Ns)))  # the line through the mean point: ln E = alpha_N (ln N_c - ln N)
        fit.N_c = float(math.exp((c0 + slope * m) / ALPHA_N_MAX + m))
        fit.notes.append(f"the fitted E_N fall with N as N^{slope:.2f}, beyond alpha_N <= {ALPHA_N_MAX} (a degenerate "
                         f"fit, e.g. an E at its bound); alpha_N clamped to {ALPHA_N_MAX} through their mean")
    elif slope >= 0:
        fit.alpha_N, fit.alpha_N_source = 0.0, "clamped"
        fit.E_const = float(np.exp(np.mean(np.log(Es))))
        fit.notes.append(f"the fitted E_N does not fall with N (slope {slope:+.3f} of ln E on ln N); alpha_N clamped "
                         f"to 0, so sizes that were not run get E = {fit.E_const:.4g} and growth cannot pay off")
    else:
        fit.alpha_N = float(-slope)
        fit.N_c = float(math.exp(c0 / fit.alpha_N))
    if len(sizes) >= 3:
        resid = np.log(Es) - np.log([fit.E_of_N(n) for n in Ns])
        fit.rmse["E(N) across sizes"] = float(np.sqrt(np.mean(resid ** 2)))
