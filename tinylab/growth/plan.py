"""Planning staged training from fitted scaling laws (`python grow.py --plan`; docs/growth.md §7.1).

    python grow.py --plan --runs out/small out/large --budget=1e18       # best plan at a budget
    python grow.py --plan --runs out/small --target_loss=1.2             # cheapest plan to a loss

1. Read the runs' loss-vs-compute logs (`read_run`): config.json gives the model shape and the batch,
   metrics.jsonl the `kind: "eval"` records (`iter`, `loss/test`). Compute per evaluation is
   C = model.flops_per_token(max_seq_len) (6N + 12·L·d·T, PaLM) × tokens per iteration × iter.
   In-run growth records end a run's usable curve at the first growth (later points are a grown
   model's, not a from-scratch curve).
2. Fit Kaplan et al.'s L(N, S) = (N_c/N)^α_N + (S_c/S)^α_S (`fit_runs`): per model size
   L(S) = E_N + (S_c/S)^α_S with (S_c, α_S) shared by all sizes, then E(N) = (N_c/N)^α_N across
   sizes (one size: α_N assumed, Kaplan's 0.076). Least squares in log loss: a grid over α_S with
   a linear solve for (E_N, S_c^α_S), then Levenberg-Marquardt on all parameters inside bounds.
3. Plan (`make_plan`): on the current model's fitted curve the slope s = d log10 L / d log10 C =
   -α_S x / (E + x), x = (S_c/S)^α_S, rises above the operator's threshold at a closed-form step
   S_pre (`slope_crossing`); the grown model continues at S_pre / c on its own fitted curve; the
   last stage trains to the end of the budget (or to the target loss). Every operator sequence up
   to --max_growths is evaluated; the best is recommended and compared with training its final
   size from scratch.
4. The online rule (`should_grow`) for train.py's grow_schedule=auto: the paper's smoothed-slope
   test on the points so far (growth.growth_point), or the planner's closed form on a fit of them.
"""
import itertools
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from tinylab.core.errors import UserError
from tinylab.core.fileio import read_text, write_atomic
from tinylab.core.metrics import read_metrics
from tinylab.core.outputs import guard_file
from tinylab.growth.operators import (
    C_DEPTH,
    C_WIDTH,
    DOUBLINGS,
    SLOPE_THRESHOLDS,
    check_limits,
    grown_args,
    growth_point,
    loss_slopes,
    meta_model,
)

MIN_POINTS = 4            # per run: E, S_c, alpha_S of a one-size fit, plus one point to judge the fit
ROUGH_FIT = 0.02          # RMSE in log loss above which a run's fit is reported as rough
ALPHA_N_MAX = 1.0         # E(N) exponent bound (Kaplan: 0.076); beyond it the E_N are degenerate
METRIC = "loss/test"
ALPHA_S_BOUNDS = (0.01, 4.0)
LN_SC_BOUNDS = (math.log(1e-6), math.log(1e12))   # S_c in units of the first fitted step
KAPLAN = {"N_c": 8.8e13, "alpha_N": 0.076, "S_c": 2.1e3, "alpha_S": 0.76}  # Kaplan et al. 2020, Table 5
C_DEFAULTS = {"weights": C_WIDTH, "layers": C_DEPTH}                        # the paper's constants
FLOPS_FORMULA = "model.flops_per_token(max_seq_len) x tokens per iteration (6N + 12*L*d*T per token, PaLM app. B)"
N_DEFINITION = "non-embedding parameters (Transformer.num_params(non_embedding=True), Kaplan's N)"
OPERATOR_NAMES = {"weights": "width x2", "layers": "depth x2"}


# ---------------------------------------------------------------------- the fitted form (closed forms)

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


# ---------------------------------------------------------------------- reading runs

@dataclass
class RunCurve:
    path: str
    cfg: dict
    args: object               # model.ModelArgs
    params: int                # all parameters (a tied matrix once)
    N: int                     # the scaling law's N: non-embedding parameters
    tokens_per_iter: int
    flops_per_iter: float
    steps: np.ndarray
    losses: np.ndarray
    notes: list = field(default_factory=list)

    @property
    def compute(self):
        return self.steps * self.flops_per_iter


def shape_key(args):
    return (args.dim, args.n_layers, args.n_heads, args.kv_heads(), args.ffn_hidden_dim(), args.vocab_size,
            bool(args.tie_embeddings))


def shape_dict(args):
    return {"dim": args.dim, "n_layers": args.n_layers, "n_heads": args.n_heads, "n_kv_heads": args.kv_heads(),
            "hidden_dim": args.ffn_hidden_dim(), "vocab_size": args.vocab_size, "tie_embeddings": bool(args.tie_embeddings)}


def shape_text(args):
    return f"d{args.dim} L{args.n_layers} h{args.n_heads} f{args.ffn_hidden_dim()}"


def tokens_per_iter(cfg):
    """Tokens per optimizer step (all processes): gradient_accumulation_steps counts micro-steps
    over all processes, as in Trainer.tokens_per_iter."""
    return cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["max_seq_len"]


class Costs:
    """Training FLOPs per iteration of a model shape at the runs' batch and sequence length,
    from Transformer.flops_per_token on a meta-device model (as growth.meta_model builds it)."""

    def __init__(self, seq_len, tokens):
        self.seq_len, self.tokens, self.cache = seq_len, tokens, {}

    def model(self, args):
        key = shape_key(args)
        if key not in self.cache:
            m = meta_model(args)
            self.cache[key] = (m.flops_per_token(self.seq_len) * self.tokens, m.num_params(),
                               m.num_params(non_embedding=True))
        return self.cache[key]

    def per_iter(self, args):
        return self.model(args)[0]


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# what read_run takes from a run's config.json: the model shape (trainer.model_args_from_config,
# dropout aside), the tokens per iteration, the data (check_comparable) and the evaluations'
# spacing and warmup (which points are fitted)
PLAN_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "multiple_of", "vocab_size", "tie_embeddings",
             "max_seq_len", "batch_size", "gradient_accumulation_steps", "dataset_name", "eval_interval", "warmup_iters")


def read_run(folder) -> RunCurve:
    """One run folder's from-scratch loss curve (eval points with iter > 0), its shape and cost."""
    if not os.path.isdir(folder):
        raise UserError(f"run folder {folder} {'is not a folder' if os.path.exists(folder) else 'not found'}")
    cfg_path, met_path = os.path.join(folder, "config.json"), os.path.join(folder, "metrics.jsonl")
    for path, what in ((cfg_path, "config.json (its model shape and batch)"),
                       (met_path, "metrics.jsonl (its evaluation losses)")):
        if not os.path.isfile(path):
            raise UserError(f"run folder {folder} has no {what}; --runs takes folders written by train.py")
    try:
        cfg = json.loads(read_text(cfg_path, "config.json"))
    except json.JSONDecodeError as e:
        raise UserError(f"{cfg_path} is not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{cfg_path} is not a JSON object")
    missing = [k for k in PLAN_KEYS if k not in cfg]
    if missing:  # filled from the defaults, they would describe some other run
        raise UserError(f"run folder {folder}: config.json has no {', '.join(missing[:4])}"
                        f"{f' (and {len(missing) - 4} more)' if len(missing) > 4 else ''}; the planner reads the "
                        f"model shape, batch and warmup from it (--runs takes folders written by train.py)")
    from tinylab.schema import TRAIN  # not at the top: schema imports the growth flags' defaults
    cfg = {**TRAIN.defaults(), **cfg}
    ints = ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "multiple_of", "vocab_size", "max_seq_len",
            "batch_size", "gradient_accumulation_steps", "eval_interval")
    bad = next((k for k in ints if type(cfg[k]) is not int or cfg[k] < (0 if k in ("n_kv_heads", "hidden_dim") else 1)), None)
    if bad:
        raise UserError(f"{cfg_path}: {bad}={cfg[bad]!r:.40} is not a valid value (a positive integer)")
    ramps = [k for k in ("warmup_bsz", "warmup_seq") if _number(cfg.get(k)) and cfg[k] > 0]
    if ramps:
        raise UserError(f"run {folder} ramps its {'batch' if ramps[0] == 'warmup_bsz' else 'sequence length'} up "
                        f"({ramps[0]}={cfg[ramps[0]]}): its tokens per iteration vary, and the fitted law needs a fixed "
                        f"batch (steps at one batch size)")
    if cfg.get("init_from") == "resume_model":
        raise UserError(f"run {folder} was fine-tuned from {cfg.get('model_dir') or 'another model'} "
                        f"(init_from=resume_model); the planner fits from-scratch curves")
    from tinylab.training.options import model_args_from_config  # the shape train.py builds from this config
    try:
        args = model_args_from_config(cfg)
        costs = Costs(cfg["max_seq_len"], tokens_per_iter(cfg))
        flops, params, n = costs.model(args)
    except (AssertionError, TypeError, ValueError, ZeroDivisionError, RuntimeError) as e:
        raise UserError(f"{cfg_path} does not describe a model ({type(e).__name__}: {str(e)[:100]})") from None

    rows = read_metrics(met_path)
    notes = []
    growth_iters = [r["iter"] for r in rows if r.get("kind") == "growth" and _number(r.get("iter"))]
    end = min(growth_iters) if growth_iters else math.inf
    evals = {}
    for r in rows:
        if r.get("kind") == "eval" and _number(r.get("iter")):
            evals[int(r["iter"])] = r.get(METRIC)  # a resumed run's record replaces the older one
    if not evals:
        raise UserError(f"run {folder}: metrics.jsonl has no evaluation records (kind eval with {METRIC}); "
                        f"the fit needs at least {MIN_POINTS} evaluations after iteration 0")
    first = min(evals)
    if first > cfg["eval_interval"]:
        raise UserError(f"run {folder}: its evaluations start at iteration {first}, not at 0 (a run continued from "
                        f"another run's checkpoint, e.g. one grown by grow.py?); the planner fits from-scratch curves")
    # the law describes training after the LR warmup (the plateau before it is no power law)
    warm = cfg["warmup_iters"] if _number(cfg.get("warmup_iters")) and cfg.get("lr_scheduling", True) else 0
    pts = sorted((it, v) for it, v in evals.items() if max(0, warm) < it < end)
    if warm and any(0 < it <= warm for it in evals):
        notes.append(f"{sum(1 for it in evals if 0 < it <= warm)} evaluation(s) inside the LR warmup "
                     f"(iter <= {warm}) not fitted")
    good = [(it, float(v)) for it, v in pts if _number(v) and v > 0]
    if len(good) < len(pts):
        notes.append(f"{len(pts) - len(good)} evaluation(s) without a finite positive {METRIC} skipped")
    if growth_iters:
        notes.append(f"grown in the run at iteration {end}: the {sum(1 for it in evals if it >= end)} evaluation(s) "
                     f"from there on are a grown model's, not a from-scratch curve, and are not fitted")
    if len(good) < MIN_POINTS:
        where = f" before its first growth (iteration {end})" if growth_iters else ""
        raise UserError(f"run {folder} has {len(good)} usable evaluation point(s){where} (kind eval, iter > "
                        f"{max(0, warm)}{' (the LR warmup)' if warm else ''}, finite "
                        f"{METRIC}); the fit needs at least {MIN_POINTS} per run: train longer or evaluate more often "
                        f"(eval_interval)")
    steps = np.array([it for it, _ in good], dtype=float)
    losses = np.array([v for _, v in good], dtype=float)
    return RunCurve(folder, cfg, args, params, n, tokens_per_iter(cfg), flops, steps, losses, notes)


def check_comparable(runs):
    """The shared step term (S_c, alpha_S) needs the same data, vocabulary and batch in every run."""
    seen = {}
    for r in runs:
        key = os.path.realpath(r.path)
        if key in seen:
            raise UserError(f"run folder {r.path} is given twice in --runs")
        seen[key] = r
    first = runs[0]
    for r in runs[1:]:
        for what, a, b in (("dataset_name", first.cfg["dataset_name"], r.cfg["dataset_name"]),
                           ("vocab_size", first.args.vocab_size, r.args.vocab_size),
                           ("max_seq_len", first.cfg["max_seq_len"], r.cfg["max_seq_len"]),
                           ("tokens per iteration", first.tokens_per_iter, r.tokens_per_iter)):
            if a != b:
                raise UserError(f"runs {first.path} and {r.path} differ in {what} ({a} vs {b}); the fitted law shares "
                                f"its step term across sizes, so every run needs the same data, vocabulary and batch")


# ---------------------------------------------------------------------- the fit

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
    lnS, lnL, w = np.log(S), np.log(L), 1.0 / L
    lmin = np.array([L[group == k].min() for k in range(n_groups)])
    e_top = lmin * (1 - 1e-9)
    lo, hi = ALPHA_S_BOUNDS

    def sse_of(alpha, lnsc, E):
        expo = np.clip(alpha * (lnsc - lnS), -700, 700)
        pred = E[group] + np.exp(expo)
        return float(np.sum((np.log(pred) - lnL) ** 2))

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
        sse = sse_of(alpha, lnsc, E)
        if best is None or sse < best[0]:
            best = (sse, alpha, lnsc, E)
    if best is None:  # no alpha gives a falling curve: start from a flat one
        best = (math.inf, 0.5, float(np.log(S.min())), lmin * 0.5)
    _, alpha, lnsc, E = best

    # Levenberg-Marquardt: theta = [a, b, e_1..e_G], alpha = lo + (hi - lo) sigmoid(a),
    # ln S_c = b, E_g = e_top_g sigmoid(e_g)
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
    return float(alpha), float(math.exp(b)) * unit, np.asarray(E, float), cost


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
        lmin = min(float(r.losses.min()) for r in runs if shape_key(r.args) == s["key"])
        if e < 1e-6 * lmin:
            fit.notes.append(f"E of {shape_text_from(s['shape'])} is at its bound 0 (a pure power law: the slope never "
                             f"rises, so the rule does not fire on this size)")
        elif e > (1 - 1e-4) * lmin:
            fit.notes.append(f"E of {shape_text_from(s['shape'])} is at its bound (the lowest observed loss): the curve "
                             f"has flattened out or the fit is poor")
    for bound, name in ((ALPHA_S_BOUNDS[0], "lower"), (ALPHA_S_BOUNDS[1], "upper")):
        if abs(a_s - bound) < 1e-3 * bound:
            fit.notes.append(f"alpha_S is at its {name} bound {bound}")
    for r in runs:
        k = index[shape_key(r.args)]
        pred = law_loss(r.steps, E[k], s_c, a_s)
        fit.rmse[r.path] = float(np.sqrt(np.mean((np.log(pred) - np.log(r.losses)) ** 2)))
        if fit.rmse[r.path] > ROUGH_FIT:
            fit.notes.append(f"the fitted form describes {r.path} only roughly (RMSE {fit.rmse[r.path]:.3f} in log loss: "
                             f"its curve is not yet in the power-law regime, or its LR decay bends it); plans from it "
                             f"are rough extrapolations")

    Ns = np.array([s["N"] for s in sizes], float)
    Es = np.array([max(s["E"], 1e-12) for s in sizes])
    if len(sizes) == 1:
        fit.alpha_N_source = "assumed"
        fit.N_c = float(Ns[0] * Es[0] ** (1 / alpha_N))
        fit.notes.append(f"one model size: grown sizes are predicted with an assumed alpha_N = {alpha_N} "
                         f"(--alpha_N; Kaplan et al.'s), E(N) = E_N (N_run / N)^alpha_N")
    elif len(set(Ns)) < len(Ns) and len(set(Ns)) == 1:
        raise UserError("the runs' model sizes differ in shape but not in N; E(N) cannot be fitted across them")
    else:
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
    return fit


def shape_text_from(d):
    return f"d{d['dim']} L{d['n_layers']} h{d['n_heads']} f{d['hidden_dim']}"


# ---------------------------------------------------------------------- the plan

@dataclass
class PlanOptions:
    budget: Optional[float] = None        # FLOPs of the whole plan
    target_loss: Optional[float] = None   # instead: the cheapest plan to this loss (budget: a cap)
    max_growths: int = 2
    operators: tuple = DOUBLINGS
    thresholds: dict = field(default_factory=lambda: dict(SLOPE_THRESHOLDS))
    c: dict = field(default_factory=lambda: dict(C_DEFAULTS))
    continue_at: str = "c"                # c: S_pre / c (the paper) | loss: the step of equal fitted loss

    def check(self):
        if self.budget is None and self.target_loss is None:
            raise UserError("--plan needs --budget=FLOPS (the best plan at a budget) or --target_loss=L "
                            "(the cheapest plan to a loss)")
        if self.budget is not None and not (self.budget > 0 and math.isfinite(self.budget)):
            raise UserError(f"--budget={self.budget}: must be a positive number of FLOPs")
        if self.target_loss is not None and not (self.target_loss > 0 and math.isfinite(self.target_loss)):
            raise UserError(f"--target_loss={self.target_loss}: must be a positive loss")
        bad = [op for op in self.operators if op not in DOUBLINGS]
        if bad or not self.operators:
            raise UserError(f"--operators must list some of {', '.join(DOUBLINGS)}, not '{','.join(self.operators)}'")
        if not 0 <= self.max_growths <= 4:
            raise UserError(f"--max_growths={self.max_growths}: must be in [0, 4]")
        for op in self.operators:
            if not self.thresholds[op] < 0 or not self.c[op] >= 1:
                raise UserError(f"{op}: the slope threshold must be < 0 and c >= 1")
        if self.continue_at not in ("c", "loss"):
            raise UserError(f"continue_at must be c or loss, not {self.continue_at}")
        return self


def candidate_sequences(operators, max_growths):
    """Every operator sequence of 0..max_growths growths (() = the smallest model alone)."""
    seqs = [()]
    for k in range(1, max_growths + 1):
        seqs += list(itertools.product(operators, repeat=k))
    return seqs


def _stage(args, E, costs, fit, start, it):
    f, params, n = costs.model(args)
    return {"shape": shape_dict(args), "shape_text": shape_text(args), "params": params, "N": n,
            "E": E, "E_source": "fitted" if fit.measured(args) else "E(N)", "flops_per_iter": f,
            "start_step": start, "start_iter": it,
            "loss_start": None if start == 0 else fit.loss(E, start)}


def evaluate_plan(seq, base_args, fit, opts, costs):
    """One candidate: stage k trains shape k from its start position to the rule's growth point
    (the first step whose fitted slope is above the next operator's threshold), the grown model
    starts at round(S_pre / c) (or at the step where its own curve has the same loss), the last
    stage trains to the end of the budget or to the target loss. Positions are schedule steps on
    each model's own curve; `iter` counts optimizer steps over the whole plan (as train.py does)."""
    plan = {"sequence": list(seq), "name": " -> ".join(OPERATOR_NAMES[o] for o in seq) or "no growth",
            "stages": [], "status": "ok"}
    shapes = [base_args]
    try:
        for op in seq:
            shapes.append(grown_args(shapes[-1], op))
            check_limits(shapes[-1])
    except UserError as e:
        plan["status"] = f"a grown shape is beyond grow.py's limits ({e})"
        return plan
    start, it, spent = 0, 0, 0.0
    budget, target = opts.budget, opts.target_loss
    for k, args in enumerate(shapes):
        E = fit.E(args, costs.model(args)[2])
        st = _stage(args, E, costs, fit, start, it)
        plan["stages"].append(st)
        f = st["flops_per_iter"]
        st["optimality_step"] = first_step_above(slope_crossing(E, fit.S_c, fit.alpha_S, opts.thresholds["optimality"]))
        if k < len(seq):  # grow by the rule
            op = seq[k]
            tau = opts.thresholds[op]
            cross = slope_crossing(E, fit.S_c, fit.alpha_S, tau)
            end = max(start, first_step_above(cross))
            if math.isinf(end):
                plan["status"] = (f"the rule never fires on stage {k}'s fitted curve (E = 0: its slope stays at "
                                  f"-alpha_S = {-fit.alpha_S:.3f} < {tau})")
                return plan
            cost = f * (end - start)
            if budget is not None and spent + cost > budget:
                plan["status"] = f"the budget ends before growth {k + 1} ({spent + cost:.3e} FLOPs needed)"
                plan["needs"] = spent + cost
                return plan
            loss_end = fit.loss(E, end)
            if target is not None and loss_end <= target:
                plan["status"] = f"reaches the target before growth {k + 1} (the same as the shorter plan)"
                return plan
            nxt = shapes[k + 1]
            E_next = fit.E(nxt, costs.model(nxt)[2])
            if opts.continue_at == "c":
                s_target = max(1, int(round(end / opts.c[op])))
            else:
                s_eq = steps_to_loss(loss_end, E_next, fit.S_c, fit.alpha_S)
                if math.isinf(s_eq):
                    plan["status"] = f"the grown model's fitted curve never reaches the loss at growth {k + 1}"
                    return plan
                s_target = max(1, int(round(s_eq)))
            it += end - start
            spent += cost
            # the law's own constant: S_pre over the step at which the grown model's fitted curve
            # has the loss at growth (the notebook's "constant_op"; 2.717 / 1.831 on Kaplan's law)
            s_eq = steps_to_loss(loss_end, E_next, fit.S_c, fit.alpha_S)
            st.update(end_step=end, end_iter=it, grow_iter=it, grow_operator=op, slope_threshold=tau,
                      c=opts.c[op] if opts.continue_at == "c" else end / s_target,
                      c_equal_loss=None if math.isinf(s_eq) or s_eq <= 0 else end / s_eq,
                      slope_end=law_slope(end, E, fit.S_c, fit.alpha_S), loss_end=loss_end, compute=cost,
                      loss_after_growth=fit.loss(E_next, s_target), next_start_step=s_target)
            start = s_target
        else:  # the last stage
            if target is None:
                end = start + int((budget - spent) // f)
            else:
                s = steps_to_loss(target, E, fit.S_c, fit.alpha_S)
                if math.isinf(s):
                    plan["status"] = f"the final model's fitted irreducible loss E = {E:.4f} is not below the target"
                    return plan
                end = max(start, math.ceil(s))
            cost = f * (end - start)
            if budget is not None and spent + cost > budget * (1 + 1e-12):
                plan["status"] = f"over the budget ({spent + cost:.3e} FLOPs)"
                plan["needs"] = spent + cost
                return plan
            it += end - start
            spent += cost
            st.update(end_step=end, end_iter=it, compute=cost, loss_end=fit.loss(E, end) if end > 0 else math.inf,
                      slope_end=law_slope(end, E, fit.S_c, fit.alpha_S) if end > 0 else None,
                      past_optimality=end > st["optimality_step"])
    plan["compute"] = spent
    plan["final_loss"] = plan["stages"][-1]["loss_end"]
    plan["iters"] = it
    plan["grow_schedule"] = ",".join(f"{s['grow_iter']}:{s['grow_operator']}" for s in plan["stages"] if s.get("grow_operator"))
    plan["max_iters"] = plan["stages"][-1]["end_step"]  # train.py: the run ends at this schedule position
    return plan


def from_scratch(args, fit, opts, costs):
    """The shape trained from scratch on the same budget (or to the target loss)."""
    f, params, n = costs.model(args)
    E = fit.E(args, n)
    out = {"shape": shape_dict(args), "shape_text": shape_text(args), "params": params, "N": n, "E": E,
           "E_source": "fitted" if fit.measured(args) else "E(N)", "flops_per_iter": f}
    if opts.target_loss is None:
        steps = int(opts.budget // f)
        out.update(steps=steps, compute=steps * f, final_loss=fit.loss(E, steps) if steps > 0 else math.inf)
    else:
        s = steps_to_loss(opts.target_loss, E, fit.S_c, fit.alpha_S)
        steps = None if math.isinf(s) else math.ceil(s)
        out.update(steps=steps, compute=None if steps is None else steps * f,
                   final_loss=opts.target_loss if steps is not None else None)
    return out


def make_plan(runs, fit, opts, base_args=None):
    """Every candidate plan from the smallest run's shape (or `base_args`), the recommendation and
    its comparison with its final size trained from scratch; the growth-plan JSON as a dict."""
    opts.check()
    base = base_args or min(runs, key=lambda r: r.N).args
    costs = Costs(runs[0].cfg["max_seq_len"], runs[0].tokens_per_iter)
    plans = [evaluate_plan(seq, base, fit, opts, costs) for seq in candidate_sequences(opts.operators, opts.max_growths)]
    ok = [p for p in plans if p["status"] == "ok"]
    grown_ok = [p for p in ok if p["sequence"]]
    if opts.target_loss is None:
        if opts.max_growths > 0 and not grown_ok:
            firsts = [p for p in plans if len(p["sequence"]) == 1]
            needs = [p["needs"] for p in firsts if "needs" in p]
            if needs:
                p = min(firsts, key=lambda p: p.get("needs", math.inf))
                st = p["stages"][0]
                raise UserError(f"--budget={opts.budget:.3e} FLOPs is smaller than the first stage needs: the smallest "
                                f"model ({st['shape_text']}) reaches its earliest growth point ({p['sequence'][0]}) only "
                                f"after {min(needs):.3e} FLOPs; raise --budget or train it without growth")
            raise UserError(f"no growth plan is possible: {firsts[0]['status'] if firsts else 'no candidates'}")
        key = lambda p: (p["final_loss"], len(p["sequence"]))  # noqa: E731
    else:
        if not ok:
            reasons = sorted({p["status"] for p in plans})
            raise UserError(f"no candidate plan reaches --target_loss={opts.target_loss}"
                            f"{' within the budget' if opts.budget else ''}: {reasons[0]}")
        key = lambda p: (p["compute"], len(p["sequence"]))  # noqa: E731
    best = min(ok, key=key)
    scratch = []
    seen = set()
    for p in [best] + ok:
        args = shapes_of(p, base)[-1]
        if shape_key(args) not in seen:
            seen.add(shape_key(args))
            scratch.append(from_scratch(args, fit, opts, costs))
    same = scratch[0]
    if opts.target_loss is None:
        c_scratch = steps_to_loss(best["final_loss"], same["E"], fit.S_c, fit.alpha_S) * same["flops_per_iter"]
        saving = None if math.isinf(c_scratch) else 1 - best["compute"] / c_scratch
        comparison = {"final_shape_from_scratch": same, "compute_from_scratch_to_plan_loss": c_scratch, "saving": saving,
                      "loss_gap_at_budget": same["final_loss"] - best["final_loss"]}
    else:
        saving = None if same["compute"] is None else 1 - best["compute"] / same["compute"]
        comparison = {"final_shape_from_scratch": same, "saving": saving}
    comparison["best_from_scratch"] = min(
        (s for s in scratch if s["final_loss"] is not None and s["compute"] is not None),
        key=(lambda s: s["final_loss"]) if opts.target_loss is None else (lambda s: s["compute"]), default=None)
    max_seen = max(float(r.steps.max()) for r in runs)
    extrapolation = max(s["end_step"] for s in best["stages"]) / max_seen
    return {
        "version": 1,
        "objective": ("lowest predicted loss at the budget" if opts.target_loss is None
                      else "least compute to the target loss"),
        "budget": opts.budget, "target_loss": opts.target_loss,
        "runs": [{"path": r.path, "shape": shape_dict(r.args), "params": r.params, "N": r.N,
                  "tokens_per_iter": r.tokens_per_iter, "flops_per_iter": r.flops_per_iter, "points": len(r.steps),
                  "max_step": int(r.steps.max()), "max_compute": float(r.compute.max()),
                  "rmse_log_loss": fit.rmse.get(r.path), "notes": r.notes} for r in runs],
        "fit": fit.to_json(),
        "constants": {"thresholds": {k: opts.thresholds[k] for k in ("weights", "layers", "optimality")},
                      "c_width": opts.c["weights"], "c_depth": opts.c["layers"], "continue_at": opts.continue_at,
                      "max_growths": opts.max_growths, "operators": list(opts.operators),
                      "flops": FLOPS_FORMULA, "slope": "d log10 L / d log10 C = -alpha_S x / (E + x), x = (S_c/S)^alpha_S"},
        "recommended": best,
        "comparison": comparison,
        "extrapolation": extrapolation,
        "train_py": {"grow_schedule": best["grow_schedule"], "max_iters": best["max_iters"],
                     "grow_c_width": opts.c["weights"], "grow_c_depth": opts.c["layers"],
                     **shape_dict(base),
                     "note": ("one in-run schedule: train.py --grow_schedule with these grow_c_* (the run ends when "
                              "its schedule position reaches max_iters)" if opts.continue_at == "c" else
                              "continue_at=loss: each growth has its own c (the stages' c); grow with grow.py "
                              "--restart_steps=<next_start_step> per growth")},
        "candidates": plans,
    }


def shapes_of(plan, base):
    shapes = [base]
    for op in plan["sequence"]:
        shapes.append(grown_args(shapes[-1], op))
    return shapes


# ---------------------------------------------------------------------- the report

def _fmt_loss(x):
    return "-" if x is None or (isinstance(x, float) and math.isinf(x)) else f"{x:.4f}"


def format_plan(out) -> str:
    fit, rec, cmp_ = out["fit"], out["recommended"], out["comparison"]
    lines = [f"fitted L(S) = E_N + (S_c/S)^alpha_S: alpha_S = {fit['alpha_S']:.4f}, S_c = {fit['S_c']:.4g} steps; "
             f"E(N) = (N_c/N)^alpha_N: alpha_N = {fit['alpha_N']:.4f} ({fit['alpha_N_source']}), "
             f"N_c = {'-' if fit['N_c'] is None else format(fit['N_c'], '.4g')}"]
    for r in out["runs"]:
        E = next(s["E"] for s in fit["sizes"] if r["path"] in s["runs"])
        lines.append(f"  run {r['path']}: {shape_text_from(r['shape'])}, {r['params'] / 1e6:.3f}M params (N = {r['N']}), "
                     f"{r['points']} points to step {r['max_step']}, E_N = {E:.4f}, RMSE(log loss) = {r['rmse_log_loss']:.4f}")
        lines += [f"    note: {n}" for n in r["notes"]]
    lines += [f"  note: {n}" for n in fit["notes"]]
    th = out["constants"]["thresholds"]
    lines.append(f"rule: grow when d log10 L / d log10 C > {th['weights']} (width) / {th['layers']} (depth); continue at "
                 + ("S_pre / c (c_width " f"{out['constants']['c_width']}, c_depth {out['constants']['c_depth']})"
                    if out["constants"]["continue_at"] == "c" else "the step where the grown model's curve has the same loss"))
    goal = (f"budget {out['budget']:.3e} FLOPs" if out["target_loss"] is None else
            f"target loss {out['target_loss']}" + (f", budget cap {out['budget']:.3e}" if out["budget"] else ""))
    lines.append(f"candidates ({goal}):")
    width = max([len(p.get("grow_schedule") or "-") for p in out["candidates"]] + [12])
    lines.append(f"  {'plan':<34} {'grow at iteration':<{width}} {'final loss':>10} {'FLOPs':>10}  status")
    order = (lambda p: p.get("final_loss", 0)) if out["target_loss"] is None else (lambda p: p.get("compute", 0))
    for p in sorted(out["candidates"], key=lambda p: (p["status"] != "ok", order(p))):
        mark = "*" if p["sequence"] == rec["sequence"] else " "
        flops = f"{p['compute']:.3e}" if "compute" in p else "-"
        lines.append(f"{mark} {p['name']:<34} {p.get('grow_schedule') or '-':<{width}} "
                     f"{_fmt_loss(p.get('final_loss')):>10} {flops:>10}  {p['status']}")
    lines.append(f"recommended: {rec['name']}"
                 + (f" (train.py --grow_schedule=\"{rec['grow_schedule']}\" --max_iters={rec['max_iters']})"
                    if rec["grow_schedule"] and out["constants"]["continue_at"] == "c" else ""))
    lines.append(f"  {'stage':<5} {'shape':<18} {'params':>8} {'schedule steps':>15} {'iterations':>13} {'FLOPs':>10} "
                 f"{'loss':>16}  then")
    for k, s in enumerate(rec["stages"]):
        if s.get("grow_operator"):
            then = (f"grow {s['grow_operator']} (slope {s['slope_end']:+.5f} > {s['slope_threshold']}), continue at "
                    f"step {s['next_start_step']} (S_pre/{s['c']:.3f}; predicted loss {s['loss_end']:.4f} -> "
                    f"{s['loss_after_growth']:.4f}"
                    + (f", equal-loss c {s['c_equal_loss']:.3f})" if s.get("c_equal_loss") else ")"))
        else:
            then = ("end of budget" if out["target_loss"] is None else "target reached") + (
                f"; past its optimality point (step {s['optimality_step']})" if s.get("past_optimality") else "")
        loss = f"{_fmt_loss(s['loss_start'])} -> {_fmt_loss(s['loss_end'])}"
        lines.append(f"  {k:<5} {s['shape_text']:<18} {s['params'] / 1e6:>7.3f}M {s['start_step']:>7}-{s['end_step']:<7} "
                     f"{s['start_iter']:>6}-{s['end_iter']:<6} {s['compute']:>10.3e} {loss:>16}  {then}")
    same = cmp_["final_shape_from_scratch"]
    if out["target_loss"] is None:
        sv = cmp_["saving"]
        lines.append(f"from scratch, {same['shape_text']} on the same budget: predicted loss {_fmt_loss(same['final_loss'])} "
                     f"(plan: {rec['final_loss']:.4f}); it would need {cmp_['compute_from_scratch_to_plan_loss']:.3e} "
                     f"FLOPs to reach the plan's loss: predicted saving "
                     + ("-" if sv is None else f"{100 * sv:+.1f}%"))
    else:
        sv = cmp_["saving"]
        lines.append(f"from scratch, {same['shape_text']} to loss {out['target_loss']}: "
                     + ("never (E above the target)" if same["compute"] is None else f"{same['compute']:.3e} FLOPs")
                     + f" (plan: {rec['compute']:.3e}): predicted saving " + ("-" if sv is None else f"{100 * sv:+.1f}%"))
    b = cmp_.get("best_from_scratch")
    if b and b["shape"] != same["shape"]:
        lines.append(f"best size from scratch among the candidates' shapes: {b['shape_text']} "
                     + (f"(loss {_fmt_loss(b['final_loss'])})" if out["target_loss"] is None else f"({b['compute']:.3e} FLOPs)"))
    drops = [s["loss_end"] - s["loss_after_growth"] for s in rec["stages"] if s.get("grow_operator")]
    if out["constants"]["continue_at"] == "c" and drops and max(drops) > 1e-3 * rec["final_loss"]:
        lines.append(f"note: at S_pre / c the grown model's fitted curve lies up to {max(drops):.4f} below the loss at growth: "
                     f"the plan credits growth with a drop the (loss-preserving) operator does not give, because c is "
                     f"below the fitted law's equal-loss c; --continue_at=loss plans without it")
    if out["extrapolation"] > 3:
        lines.append(f"note: the plan runs to {out['extrapolation']:.1f}x the longest fitted run's steps: an extrapolation "
                     f"of the fitted law")
    return "\n".join(lines)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


# ---------------------------------------------------------------------- grow.py --plan

PLAN_FLAGS = ("runs", "budget", "target_loss", "plan_out")
# grow.py's flags that name a checkpoint to grow (None unless given): no part of a plan
GROWTH_FLAGS = ("doubling", "resume", "out_dir", "doubling_layers", "restart_steps")


def split_multi_values(argv, flags=("--runs",)):
    """`--runs A B C` (one or more values after the flag) as the repeatable `--runs=A --runs=B
    --runs=C`; `--runs=A B` and `--runs=A,B` work too. A bare flag without values is left for
    argparse to report."""
    out, taking = [], None
    for arg in argv:
        if arg.partition("=")[0] in flags:
            taking = arg.partition("=")[0]
            out.append(arg)  # a bare flag is replaced by the values that follow it, if any
            continue
        if taking and not arg.startswith("-"):
            if out[-1] == taking:
                out.pop()
            out.append(f"{taking}={arg}")
            continue
        taking = None
        out.append(arg)
    return out


def refuse_plan_flags(a):
    """grow.py without --plan: a plan flag is a mistake (it would be ignored)."""
    given = [f"--{n}" for n in PLAN_FLAGS if getattr(a, n, None) not in (None, "", [])]
    if given:
        raise UserError(f"{given[0]} belongs to --plan (planning growth points from run logs); add --plan or drop it")


def plan_options(a):
    ops = tuple(o.strip() for o in a.operators.split(",") if o.strip())
    return PlanOptions(budget=a.budget, target_loss=a.target_loss, max_growths=a.max_growths, operators=ops,
                       thresholds={"weights": a.threshold_width, "layers": a.threshold_depth,
                                   "optimality": a.threshold_optimality},
                       c={"weights": a.c_width, "layers": a.c_depth}, continue_at=a.continue_at).check()


def plan_main(a):
    """grow.py --plan: read, fit, plan, print, write the JSON (atomically; nothing on any error)."""
    given = [f"--{n}" for n in GROWTH_FLAGS if getattr(a, n, None) is not None]
    if given:
        raise UserError(f"--plan reads run logs and writes a plan; it takes no {given[0]} (drop it, or drop --plan "
                        f"to grow a checkpoint)")
    if not a.runs:
        raise UserError("--plan needs --runs DIR [DIR ...] (run folders with config.json and metrics.jsonl)")
    opts = plan_options(a)
    runs = [read_run(p) for p in a.runs]
    check_comparable(runs)
    # --plan_out was guarded when the flags were parsed; the default lands in a run folder the user owns
    out_path = a.plan_out or guard_file(os.path.join(a.runs[0], "growth_plan.json"), "json", a.force, a.runs,
                                        "growth plan", tool="grow.py")
    fit = fit_runs(runs, alpha_N=a.alpha_N)
    plan = make_plan(runs, fit, opts)
    text = format_plan(plan)
    data = _jsonable(plan)
    write_atomic(out_path, (json.dumps(data, indent=1) + "\n").encode())
    print(text)
    print(f"wrote {out_path}")
    return data


# ---------------------------------------------------------------------- the online rule (grow_schedule=auto)

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


def should_grow(compute, losses, operator, thresholds=None, window=5, method="smoothed") -> RuleDecision:
    """Does the paper's growth rule fire now for `operator` (weights | layers, or optimality)?

    `compute` and `losses`: the current model's evaluations so far, in order, compute > 0, on the
    current model's own curve (C proportional to its schedule position S: for a grown model pass
    flops_per_iter x (iter - shift), not the compute the earlier stages spent).
      method "smoothed": the paper's test on the points themselves (growth.loss_slopes over a
        running window, growth.growth_point: the first point after the steepest smoothed slope
        whose slope is above the threshold); `slope` is the last smoothed slope.
      method "fit": the planner's closed form: fit L(C) = E + (C_c/C)^alpha to the points (needs
        MIN_POINTS) and fire when the fitted slope at the last point is above the threshold;
        `fit["fires_at_compute"]` is where it will (C proportional to S, so the fitted form and
        slope are those of L(S)).
    """
    th = {**SLOPE_THRESHOLDS, **(thresholds or {})}
    if operator not in th:
        raise UserError(f"operator must be one of {', '.join(th)}, not '{operator}'")
    tau = th[operator]
    compute, losses = [float(c) for c in compute], [float(v) for v in losses]
    if len(compute) != len(losses):
        raise UserError(f"{len(compute)} compute values but {len(losses)} losses")
    if any(not (c > 0 and math.isfinite(c)) for c in compute) or any(not (v > 0 and math.isfinite(v)) for v in losses):
        raise UserError("the rule needs points with finite compute > 0 and loss > 0")
    if any(b <= a for a, b in zip(compute, compute[1:])):
        raise UserError("compute must increase from point to point")
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
