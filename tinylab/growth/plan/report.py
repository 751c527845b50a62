"""The plan as grow.py --plan prints it (`format_plan`) and writes it (`jsonable`)."""
import math

import numpy as np

from tinylab.growth.ops import OPERATORS
from tinylab.growth.plan.shapes import shape_text_from


def _fmt_loss(x):
    return "-" if x is None or (isinstance(x, float) and math.isinf(x)) else f"{x:.4f}"


def format_plan(out) -> str:
    """The fit, the rule, every candidate, the recommended plan's stages and the comparison."""
    return "\n".join(_fit_lines(out) + _candidate_lines(out) + _stage_lines(out) + _comparison_lines(out))


def _fit_lines(out):
    fit, consts = out["fit"], out["constants"]
    lines = [f"fitted L(S) = E_N + (S_c/S)^alpha_S: alpha_S = {fit['alpha_S']:.4f}, S_c = {fit['S_c']:.4g} steps; "
             f"E(N) = (N_c/N)^alpha_N: alpha_N = {fit['alpha_N']:.4f} ({fit['alpha_N_source']}), "
             f"N_c = {'-' if fit['N_c'] is None else format(fit['N_c'], '.4g')}"]
    for r in out["runs"]:
        E = next(s["E"] for s in fit["sizes"] if r["path"] in s["runs"])
        lines.append(f"  run {r['path']}: {shape_text_from(r['shape'])}, {r['params'] / 1e6:.3f}M params (N = {r['N']}), "
                     f"{r['points']} points to step {r['max_step']}, E_N = {E:.4f}, RMSE(log loss) = {r['rmse_log_loss']:.4f}")
        lines += [f"    note: {n}" for n in r["notes"]]
    lines += [f"  note: {n}" for n in fit["notes"]]
    th = consts["thresholds"]
    rule = " / ".join(f"{th[op.name]} ({op.setting})" for op in OPERATORS)
    cs = ", ".join(f"{op.c_flag} {consts[op.c_flag]}" for op in OPERATORS)
    lines.append(f"rule: grow when d log10 L / d log10 C > {rule}; continue at "
                 + (f"S_pre / c ({cs})" if consts["continue_at"] == "c"
                    else "the step where the grown model's curve has the same loss"))
    return lines


def _candidate_lines(out):
    rec = out["recommended"]
    goal = (f"budget {out['budget']:.3e} FLOPs" if out["target_loss"] is None else
            f"target loss {out['target_loss']}" + (f", budget cap {out['budget']:.3e}" if out["budget"] else ""))
    lines = [f"candidates ({goal}):"]
    width = max([len(p.get("grow_schedule") or "-") for p in out["candidates"]] + [12])
    lines.append(f"  {'plan':<34} {'grow at iteration':<{width}} {'final loss':>10} {'FLOPs':>10}  status")
    order = (lambda p: p.get("final_loss", 0)) if out["target_loss"] is None else (lambda p: p.get("compute", 0))
    for p in sorted(out["candidates"], key=lambda p: (p["status"] != "ok", order(p))):
        mark = "*" if p["sequence"] == rec["sequence"] else " "
        flops = f"{p['compute']:.3e}" if "compute" in p else "-"
        lines.append(f"{mark} {p['name']:<34} {p.get('grow_schedule') or '-':<{width}} "
                     f"{_fmt_loss(p.get('final_loss')):>10} {flops:>10}  {p['status']}")
    return lines


def _stage_lines(out):
    rec = out["recommended"]
    lines = [f"recommended: {rec['name']}"
             + (f" (train.py --grow_schedule=\"{rec['grow_schedule']}\" --max_iters={rec['max_iters']})"
                if rec["grow_schedule"] and out["constants"]["continue_at"] == "c" else "")]
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
    return lines


def _comparison_lines(out):
    rec, cmp_ = out["recommended"], out["comparison"]
    same, sv = cmp_["final_shape_from_scratch"], cmp_["saving"]
    saving = "-" if sv is None else f"{100 * sv:+.1f}%"
    if out["target_loss"] is None:
        lines = [f"from scratch, {same['shape_text']} on the same budget: predicted loss {_fmt_loss(same['final_loss'])} "
                 f"(plan: {rec['final_loss']:.4f}); it would need {cmp_['compute_from_scratch_to_plan_loss']:.3e} "
                 f"FLOPs to reach the plan's loss: predicted saving " + saving]
    else:
        lines = [f"from scratch, {same['shape_text']} to loss {out['target_loss']}: "
                 + ("never (E above the target)" if same["compute"] is None else f"{same['compute']:.3e} FLOPs")
                 + f" (plan: {rec['compute']:.3e}): predicted saving " + saving]
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
    return lines


def format_kaplan_plan(out) -> str:
    """--law=kaplan: the constants, PR #4's per-stage table, and the best single size."""
    c = out["constants"]
    goal = (f"budget {out['budget']:.3e} FLOPs" if out["target_loss"] is None else f"target loss {out['target_loss']}")
    lines = [f"Kaplan et al.'s law, no runs ({out['source']}): L(N, S) = ({c['N_c']:.3g}/N)^{c['alpha_N']} + "
             f"(2*{c['S_c']:.3g}/S)^{c['alpha_S']}, B_crit = {c['B_star']:.3g}/L^(1/{c['alpha_B']}) tokens; {goal}",
             f"  {'stage':<5} {'N (non-emb.)':>13} {'x prev':>7} {'loss':>16} {'steps (B_crit)':>15} "
             f"{'batch (tokens)':>15} {'FLOPs':>10} {'PF-days':>9} {'share':>6}"]
    for k, s in enumerate(out["stages"]):
        loss = f"{_fmt_loss(s['loss_start'])} -> {s['loss_end']:.4f}"
        growth = "-" if s["growth"] is None else f"{s['growth']:.2f}"
        lines.append(f"  {k:<5} {s['N']:>13.4g} {growth:>7} {loss:>16} {s['steps']:>15.0f} {s['batch_tokens']:>15.4g} "
                     f"{s['compute']:>10.3e} {s['pf_days']:>9.4g} {s['compute_share']:>6.1%}")
    one = out["same_loss_one_size"]
    lines.append(f"final loss {out['final_loss']:.4f} with {out['compute']:.3e} FLOPs; one size to the same loss: "
                 f"N = {one['N']:.4g}, {one['steps']:.0f} steps, {one['compute']:.3e} FLOPs: predicted saving "
                 f"{100 * out['saving']:+.1f}%")
    if "one_size_at_budget" in out:
        b = out["one_size_at_budget"]
        lines.append(f"one size at the budget: N = {b['N']:.4g}, {b['steps']:.0f} steps, loss {b['loss']:.4f}")
    return "\n".join(lines)


def jsonable(obj):
    """`obj` with numpy numbers as Python numbers and non-finite floats as strings (JSON has neither)."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj
