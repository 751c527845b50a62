"""The candidate plans and the recommendation (`make_plan`; docs/growth.md §7.1).

On the current model's fitted curve the slope rises above the next operator's threshold at a
closed-form step S_pre (law.slope_crossing); the grown model continues at S_pre / c on its own
fitted curve (or where that curve has the loss at growth); the last stage trains to the end of the
budget (or to the target loss). Every operator sequence up to max_growths is evaluated; the best is
recommended and compared with training its final size from scratch.
"""
import itertools
import math

from tinylab.core.errors import UserError
from tinylab.growth.ops import OPERATORS
from tinylab.growth.ops.base import check_limits
from tinylab.growth.plan.law import first_step_above, law_slope, slope_crossing, steps_to_loss
from tinylab.growth.plan.shapes import FLOPS_FORMULA, Costs, shape_dict, shape_key, shape_text


def candidate_sequences(operators, max_growths):
    """Every operator sequence of 0..max_growths growths (() = the smallest model alone)."""
    seqs = [()]
    for k in range(1, max_growths + 1):
        seqs += list(itertools.product(operators, repeat=k))
    return seqs


def shapes_of(sequence, base):
    """The shapes a sequence of operators passes through, from `base`."""
    shapes = [base]
    for op in sequence:
        shapes.append(OPERATORS.get(op).grown_args(shapes[-1]))
    return shapes


def _stage(args, E, costs, fit, start, it):
    f, params, n = costs.model(args)
    return {"shape": shape_dict(args), "shape_text": shape_text(args), "params": params, "N": n,
            "E": E, "E_source": "fitted" if fit.measured(args) else "E(N)", "flops_per_iter": f,
            "start_step": start, "start_iter": it,
            "loss_start": None if start == 0 else fit.loss(E, start)}


class _Walk:
    """One candidate's stages in order: the position on the current model's own curve (`start`),
    the optimizer steps (`it`, counting on through growth as train.py does) and FLOPs so far."""

    def __init__(self, plan, fit, opts):
        self.plan, self.fit, self.opts = plan, fit, opts
        self.start, self.it, self.spent = 0, 0, 0.0

    def fail(self, status, needs=None):
        self.plan["status"] = status
        if needs is not None:
            self.plan["needs"] = needs
        return False

    def grow_stage(self, k, st, op, E, E_next):
        """Stage k trains to the rule's growth point (the first step whose fitted slope is above
        the operator's threshold); the grown model starts at round(S_pre / c), or where its own
        curve has the same loss. False (and the plan's status) when it cannot."""
        fit, opts = self.fit, self.opts
        tau = opts.thresholds[op]
        end = max(self.start, first_step_above(slope_crossing(E, fit.S_c, fit.alpha_S, tau)))
        if math.isinf(end):
            return self.fail(f"the rule never fires on stage {k}'s fitted curve (E = 0: its slope stays at "
                             f"-alpha_S = {-fit.alpha_S:.3f} < {tau})")
        cost = st["flops_per_iter"] * (end - self.start)
        if opts.budget is not None and self.spent + cost > opts.budget:
            return self.fail(f"the budget ends before growth {k + 1} ({self.spent + cost:.3e} FLOPs needed)",
                             self.spent + cost)
        loss_end = fit.loss(E, end)
        if opts.target_loss is not None and loss_end <= opts.target_loss:
            return self.fail(f"reaches the target before growth {k + 1} (the same as the shorter plan)")
        # the law's own constant: S_pre over the step at which the grown model's fitted curve
        # has the loss at growth (the notebook's "constant_op"; 2.717 / 1.831 on Kaplan's law)
        s_eq = steps_to_loss(loss_end, E_next, fit.S_c, fit.alpha_S)
        if opts.continue_at == "c":
            s_target = max(1, int(round(end / opts.c[op])))
        elif math.isinf(s_eq):
            return self.fail(f"the grown model's fitted curve never reaches the loss at growth {k + 1}")
        else:
            s_target = max(1, int(round(s_eq)))
        self.it += end - self.start
        self.spent += cost
        st.update(end_step=end, end_iter=self.it, grow_iter=self.it, grow_operator=op, slope_threshold=tau,
                  c=opts.c[op] if opts.continue_at == "c" else end / s_target,
                  c_equal_loss=None if math.isinf(s_eq) or s_eq <= 0 else end / s_eq,
                  slope_end=law_slope(end, E, fit.S_c, fit.alpha_S), loss_end=loss_end, compute=cost,
                  loss_after_growth=fit.loss(E_next, s_target), next_start_step=s_target)
        self.start = s_target
        return True

    def last_stage(self, st, E):
        """The final model trains to the end of the budget, or to the target loss."""
        fit, opts = self.fit, self.opts
        f = st["flops_per_iter"]
        if opts.target_loss is None:
            end = self.start + int((opts.budget - self.spent) // f)
        else:
            s = steps_to_loss(opts.target_loss, E, fit.S_c, fit.alpha_S)
            if math.isinf(s):
                return self.fail(f"the final model's fitted irreducible loss E = {E:.4f} is not below the target")
            end = max(self.start, math.ceil(s))
        cost = f * (end - self.start)
        if opts.budget is not None and self.spent + cost > opts.budget * (1 + 1e-12):
            return self.fail(f"over the budget ({self.spent + cost:.3e} FLOPs)", self.spent + cost)
        self.it += end - self.start
        self.spent += cost
        st.update(end_step=end, end_iter=self.it, compute=cost, loss_end=fit.loss(E, end) if end > 0 else math.inf,
                  slope_end=law_slope(end, E, fit.S_c, fit.alpha_S) if end > 0 else None,
                  past_optimality=end > st["optimality_step"])
        return True


def evaluate_plan(seq, base_args, fit, opts, costs):
    """One candidate: stage k trains shape k from its start position to the rule's growth point,
    the grown model continues, the last stage trains to the end of the budget or to the target
    loss (_Walk). Positions are schedule steps on each model's own curve; `iter` counts optimizer
    steps over the whole plan (as train.py does)."""
    plan = {"sequence": list(seq), "name": " -> ".join(OPERATORS.get(o).display for o in seq) or "no growth",
            "stages": [], "status": "ok"}
    try:
        shapes = shapes_of(seq, base_args)
        for args in shapes[1:]:
            check_limits(args)
    except UserError as e:
        plan["status"] = f"a grown shape is beyond grow.py's limits ({e})"
        return plan
    walk = _Walk(plan, fit, opts)
    for k, args in enumerate(shapes):
        E = fit.E(args, costs.model(args)[2])
        st = _stage(args, E, costs, fit, walk.start, walk.it)
        plan["stages"].append(st)
        st["optimality_step"] = first_step_above(slope_crossing(E, fit.S_c, fit.alpha_S, opts.thresholds["optimality"]))
        if k < len(seq):  # grow by the rule
            nxt = shapes[k + 1]
            ok = walk.grow_stage(k, st, seq[k], E, fit.E(nxt, costs.model(nxt)[2]))
        else:
            ok = walk.last_stage(st, E)
        if not ok:
            return plan
    plan["compute"] = walk.spent
    plan["final_loss"] = plan["stages"][-1]["loss_end"]
    plan["iters"] = walk.it
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
    best = recommend(plans, ok, opts)
    comparison = compare_from_scratch(best, ok, base, fit, opts, costs)
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
        "constants": {"thresholds": {k: opts.thresholds[k] for k in (*OPERATORS.names(), "optimality")},
                      **{op.c_flag: opts.c[op.name] for op in OPERATORS}, "continue_at": opts.continue_at,
                      "max_growths": opts.max_growths, "operators": list(opts.operators),
                      "flops": FLOPS_FORMULA, "slope": "d log10 L / d log10 C = -alpha_S x / (E + x), x = (S_c/S)^alpha_S"},
        "recommended": best,
        "comparison": comparison,
        "extrapolation": extrapolation,
        "train_py": {"grow_schedule": best["grow_schedule"], "max_iters": best["max_iters"],
                     **{f"grow_{op.c_flag}": opts.c[op.name] for op in OPERATORS},
                     **shape_dict(base),
                     "note": ("one in-run schedule: train.py --grow_schedule with these grow_c_* (the run ends when "
                              "its schedule position reaches max_iters)" if opts.continue_at == "c" else
                              "continue_at=loss: each growth has its own c (the stages' c); grow with grow.py "
                              "--restart_steps=<next_start_step> per growth")},
        "candidates": plans,
    }


def recommend(plans, ok, opts):
    """The best of the feasible candidates `ok` (the lowest final loss at the budget, or the least
    compute to the target; the fewer growths on a tie), or a UserError saying why there is none."""
    if opts.target_loss is None:
        if opts.max_growths > 0 and not any(p["sequence"] for p in ok):
            firsts = [p for p in plans if len(p["sequence"]) == 1]
            needs = [p["needs"] for p in firsts if "needs" in p]
            if needs:
                p = min(firsts, key=lambda p: p.get("needs", math.inf))
                st = p["stages"][0]
                raise UserError(f"--budget={opts.budget:.3e} FLOPs is smaller than the first stage needs: the smallest "
                                f"model ({st['shape_text']}) reaches its earliest growth point ({p['sequence'][0]}) only "
                                f"after {min(needs):.3e} FLOPs; raise --budget or train it without growth")
            raise UserError(f"no growth plan is possible: {firsts[0]['status'] if firsts else 'no candidates'}")
        return min(ok, key=lambda p: (p["final_loss"], len(p["sequence"])))
    if not ok:
        reasons = sorted({p["status"] for p in plans})
        raise UserError(f"no candidate plan reaches --target_loss={opts.target_loss}"
                        f"{' within the budget' if opts.budget else ''}: {reasons[0]}")
    return min(ok, key=lambda p: (p["compute"], len(p["sequence"])))


def compare_from_scratch(best, ok, base, fit, opts, costs):
    """The recommended plan against its final shape trained from scratch (the predicted saving),
    and the best of the candidates' final shapes trained from scratch."""
    scratch = []
    seen = set()
    for p in [best] + ok:
        args = shapes_of(p["sequence"], base)[-1]
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
    return comparison
