"""grow.py --plan: read the runs, fit, plan, print, write the JSON (docs/growth.md §7.1).

    python grow.py --plan --runs out/small out/large --budget=1e18       # best plan at a budget
    python grow.py --plan --runs out/small --target_loss=1.2             # cheapest plan to a loss
    python grow.py --plan --law=kaplan --budget=1e20                     # from published constants (§7.2)
"""
import json
import os

from tinylab.core.errors import UserError
from tinylab.core.fileio import write_atomic
from tinylab.core.outputs import guard_file
from tinylab.growth.plan.fit import fit_runs
from tinylab.growth.plan.kaplan import kaplan_plan
from tinylab.growth.plan.options import FIT_ONLY, LAW, PLAN_KEYS, plan_options
from tinylab.growth.plan.report import format_kaplan_plan, format_plan, jsonable
from tinylab.growth.plan.runs import check_comparable, read_run
from tinylab.growth.plan.search import make_plan

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
    given += ["--law"] if a.law != LAW.default else []
    if given:
        raise UserError(f"{given[0]} belongs to --plan (planning growth points from run logs); add --plan or drop it")


def plan_main(a):
    """grow.py --plan: read, fit, plan, print, write the JSON (atomically; nothing on any error)."""
    given = [f"--{n}" for n in GROWTH_FLAGS if getattr(a, n, None) is not None]
    if given:
        raise UserError(f"--plan reads run logs and writes a plan; it takes no {given[0]} (drop it, or drop --plan "
                        f"to grow a checkpoint)")
    if a.law == "kaplan":
        return kaplan_main(a)
    if not a.runs:
        raise UserError("--plan needs --runs DIR [DIR ...] (run folders with config.json and metrics.jsonl), "
                        "or --law=kaplan (Kaplan et al.'s published constants, no runs)")
    opts = plan_options(a)
    runs = [read_run(p) for p in a.runs]
    check_comparable(runs)
    # --plan_out was guarded when the flags were parsed; the default lands in a run folder the user owns
    out_path = a.plan_out or guard_file(os.path.join(a.runs[0], "growth_plan.json"), "json", a.force, a.runs,
                                        "growth plan", tool="grow.py")
    fit = fit_runs(runs, alpha_N=a.alpha_N)
    plan = make_plan(runs, fit, opts)
    text = format_plan(plan)
    data = jsonable(plan)
    write_atomic(out_path, (json.dumps(data, indent=1) + "\n").encode())
    print(text)
    print(f"wrote {out_path}")
    return data


def kaplan_main(a):
    """grow.py --plan --law=kaplan: PR #4's schedule from Kaplan et al.'s constants; the JSON is
    written only to --plan_out (guarded when the flags were parsed): there is no run folder."""
    defaults = {k.name: k.default for k in PLAN_KEYS}
    given = [f"--{n}" for n in FIT_ONLY if getattr(a, n) not in (defaults[n], None, [])]
    if given:
        raise UserError(f"--law=kaplan plans from published constants and takes no {given[0]} (that is --law=fit's)")
    if (a.budget is None) == (a.target_loss is None):
        raise UserError("--law=kaplan needs --budget=FLOPS (the lowest loss at a budget) or --target_loss=L (the least "
                        "compute to a loss), one of them")
    plan = kaplan_plan(budget=a.budget, target_loss=a.target_loss, stages=a.max_growths + 1)
    text = format_kaplan_plan(plan)
    data = jsonable(plan)
    if a.plan_out:
        write_atomic(a.plan_out, (json.dumps(data, indent=1) + "\n").encode())
    print(text)
    if a.plan_out:
        print(f"wrote {a.plan_out}")
    return data
