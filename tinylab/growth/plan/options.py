"""What to plan: grow.py --plan's keys and the typed PlanOptions made from them.

The operator keys come from the registry (ops/): --operators' names and its default (the entries
with plan_default), and one --threshold_<setting> per operator (the --c_<setting> keys are
options.py's, shared with growing).
"""
import math
from dataclasses import dataclass, field
from typing import Optional

from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.growth.ops import OPERATORS
from tinylab.growth.ops.base import plan_defaults
from tinylab.growth.rule import SLOPE_THRESHOLDS


def _default_c():
    return {op.name: op.c for op in OPERATORS}


@dataclass
class PlanOptions:
    budget: Optional[float] = None        # FLOPs of the whole plan
    target_loss: Optional[float] = None   # instead: the cheapest plan to this loss (budget: a cap)
    max_growths: int = 2
    operators: tuple = plan_defaults()    # the operators the candidates combine
    thresholds: dict = field(default_factory=lambda: dict(SLOPE_THRESHOLDS))
    c: dict = field(default_factory=_default_c)  # the paper's constants
    continue_at: str = "c"                # c: S_pre / c (the paper) | loss: the step of equal fitted loss

    def check(self):
        if self.budget is None and self.target_loss is None:
            raise UserError("--plan needs --budget=FLOPS (the best plan at a budget) or --target_loss=L "
                            "(the cheapest plan to a loss)")
        if self.budget is not None and not (self.budget > 0 and math.isfinite(self.budget)):
            raise UserError(f"--budget={self.budget}: must be a positive number of FLOPs")
        if self.target_loss is not None and not (self.target_loss > 0 and math.isfinite(self.target_loss)):
            raise UserError(f"--target_loss={self.target_loss}: must be a positive loss")
        names = OPERATORS.names()
        bad = [op for op in self.operators if op not in names]
        if bad or not self.operators:
            raise UserError(f"--operators must list some of {', '.join(names)}, not '{','.join(self.operators)}'")
        if not 0 <= self.max_growths <= 4:
            raise UserError(f"--max_growths={self.max_growths}: must be in [0, 4]")
        for op in self.operators:
            if not self.thresholds[op] < 0 or not self.c[op] >= 1:
                raise UserError(f"{op}: the slope threshold must be < 0 and c >= 1")
        if self.continue_at not in ("c", "loss"):
            raise UserError(f"continue_at must be c or loss, not {self.continue_at}")
        return self


def plan_options(a):
    """PlanOptions from grow.py's parsed flags."""
    ops = tuple(o.strip() for o in a.operators.split(",") if o.strip())
    thresholds = {**{op.name: getattr(a, op.threshold_flag) for op in OPERATORS},
                  "optimality": a.threshold_optimality}
    return PlanOptions(budget=a.budget, target_loss=a.target_loss, max_growths=a.max_growths, operators=ops,
                       thresholds=thresholds, c={op.name: getattr(a, op.c_flag) for op in OPERATORS},
                       continue_at=a.continue_at).check()


def _check_operators(value):
    names = OPERATORS.names()
    if all(o.strip() in names for o in value.split(",")):
        return None
    return f"must be a comma-separated list of {', '.join(names)}"


LAWS = ("fit", "kaplan")
LAW = Key("law", "fit", "fit: fit the scaling law to --runs and plan operator sequences | kaplan: plan model sizes "
          "from Kaplan et al.'s published constants, no runs (staged-training's compute_optimal_schedule.py)",
          choices=LAWS)
# the fitted law's flags, which --law=kaplan does not read
FIT_ONLY = ("runs", "operators", "continue_at", "alpha_N", "threshold_optimality",
            *(op.threshold_flag for op in OPERATORS))

PLAN_KEYS = [
    Key("plan", False, "plan the compute-optimal growth stages from run logs instead of growing a checkpoint"),
    LAW,
    Key("runs", [], "run folders with config.json + metrics.jsonl: --runs A B (or --runs=A,B)", input=True),
    Key("budget", None, "training FLOPs of the whole plan: recommend the lowest predicted final loss",
        type=float, range="(0, inf)"),
    Key("target_loss", None, "instead: the least compute to this loss (with --budget as a cap)", type=float,
        range="(0, inf)"),
    Key("max_growths", 2, "candidate plans grow up to this many times", range="[0, 4]"),
    Key("operators", ",".join(plan_defaults()), f"the growth operators the candidates combine "
        f"({', '.join(OPERATORS.names())})", check=_check_operators),
    *[Key(op.threshold_flag, op.slope_threshold,
          op.threshold_help or f"grow {op.setting} when d log10 L / d log10 C rises above this", range="(-inf, 0)")
      for op in OPERATORS],
    Key("threshold_optimality", SLOPE_THRESHOLDS["optimality"], "the optimality point (reported for the last "
        "stage)", range="(-inf, 0)"),
    Key("continue_at", "c", "c: the grown model continues at S_pre / c_width or c_depth (the paper) | loss: at "
        "the step where its fitted curve has the loss at growth", choices=("c", "loss")),
    Key("alpha_N", 0.076, "one model size in --runs: E(N) = (N_c/N)^alpha_N with this exponent (Kaplan et al.)",
        range="(0, inf)"),
    Key("plan_out", "", "the plan's JSON ('' = <first run>/growth_plan.json); replaced only with --force",
        output="json"),
]
PLAN_SECTION = ("plan (--plan): growth points from the runs' fitted scaling laws (docs/growth.md §7.1)", PLAN_KEYS)
