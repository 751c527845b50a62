"""Reading the runs the planner fits (`read_run`): config.json gives the model shape and the batch,
metrics.jsonl the `kind: "eval"` records (`iter`, `loss/test`). Compute per evaluation is
C = model.flops_per_token(max_seq_len) (6N + 12·L·d·T, PaLM) × tokens per iteration × iter.
In-run growth records end a run's usable curve at the first growth (later points are a grown
model's, not a from-scratch curve)."""
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from tinylab.core.errors import UserError
from tinylab.core.fileio import read_text
from tinylab.core.metrics import read_metrics
from tinylab.growth.plan.fit import MIN_POINTS
from tinylab.growth.plan.shapes import Costs, tokens_per_iter
from tinylab.training.options import model_args_from_config

METRIC = "loss/test"

# what read_run takes from a run's config.json: the model shape (training/options.model_args_from_config,
# dropout aside), the tokens per iteration, the data (check_comparable) and the evaluations'
# spacing and warmup (which points are fitted)
RUN_CONFIG_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "multiple_of", "vocab_size", "tie_embeddings",
             "max_seq_len", "batch_size", "gradient_accumulation_steps", "dataset_name", "eval_interval", "warmup_iters")
# the one other key model_args_from_config reads; the shape and its cost do not depend on it
RUN_DEFAULTS = {"dropout": 0.0}
INTS = ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "multiple_of", "vocab_size", "max_seq_len",
        "batch_size", "gradient_accumulation_steps", "eval_interval")


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


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_run(folder) -> RunCurve:
    """One run folder's from-scratch loss curve (eval points with iter > 0), its shape and cost."""
    if not os.path.isdir(folder):
        raise UserError(f"run folder {folder} {'is not a folder' if os.path.exists(folder) else 'not found'}")
    cfg_path, met_path = os.path.join(folder, "config.json"), os.path.join(folder, "metrics.jsonl")
    for path, what in ((cfg_path, "config.json (its model shape and batch)"),
                       (met_path, "metrics.jsonl (its evaluation losses)")):
        if not os.path.isfile(path):
            raise UserError(f"run folder {folder} has no {what}; --runs takes folders written by train.py")
    cfg = read_config(folder, cfg_path)
    try:
        args = model_args_from_config(cfg)  # the shape train.py builds from this config
        costs = Costs(cfg["max_seq_len"], tokens_per_iter(cfg))
        flops, params, n = costs.model(args)
    except (AssertionError, TypeError, ValueError, ZeroDivisionError, RuntimeError) as e:
        raise UserError(f"{cfg_path} does not describe a model ({type(e).__name__}: {str(e)[:100]})") from None
    steps, losses, notes = read_curve(folder, met_path, cfg)
    return RunCurve(folder, cfg, args, params, n, tokens_per_iter(cfg), flops, steps, losses, notes)


def read_config(folder, cfg_path) -> dict:
    """A run's config.json, checked: the keys the planner reads, integers where it needs them, a
    fixed batch, a from-scratch run."""
    try:
        cfg = json.loads(read_text(cfg_path, "config.json"))
    except json.JSONDecodeError as e:
        raise UserError(f"{cfg_path} is not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{cfg_path} is not a JSON object")
    missing = [k for k in RUN_CONFIG_KEYS if k not in cfg]
    if missing:  # filled from the defaults, they would describe some other run
        raise UserError(f"run folder {folder}: config.json has no {', '.join(missing[:4])}"
                        f"{f' (and {len(missing) - 4} more)' if len(missing) > 4 else ''}; the planner reads the "
                        f"model shape, batch and warmup from it (--runs takes folders written by train.py)")
    cfg = {**RUN_DEFAULTS, **cfg}
    bad = next((k for k in INTS if type(cfg[k]) is not int or cfg[k] < (0 if k in ("n_kv_heads", "hidden_dim") else 1)), None)
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
    return cfg


def read_curve(folder, met_path, cfg):
    """(steps, losses, notes): the evaluations the law is fitted to, after the LR warmup and
    before any in-run growth."""
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
    return np.array([it for it, _ in good], dtype=float), np.array([v for _, v in good], dtype=float), notes


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
