"""Optimizers and learning-rate schedules, shared by every driver.

Every function here receives typed options (tinylab/training/options.py: OptimizerOptions,
ScheduleOptions, built from a config by their from_config). build_optimizer(model, options) makes
AdamW (weight decay on >=2-D parameters only, as llama2.c; fused on CUDA and CPU, foreach
elsewhere; without bias correction adamw_nobias.py's) or Adafactor (adafactor.py). Parameter groups are defined by role (`group["role"]`:
"decay" / "no_decay"), never by the decay's value, and carry the parameter *names*
(`group["param_names"]`), so a checkpoint's optimizer state is mapped by name (state_for:
resume_train, reset_progress; growth), and optional per-parameter overrides {name: {"lr_scale": s,
"eps": e, "weight_decay_scale": w, "clip_weight": c}} that exact growth needs (grow.py).
lr_at(it, schedule) is the schedule: constant, or linear warmup + cosine to min_lr, optionally moved
back after growth with a linear re-warmup from 0 (docs/growth.md §6.3). The named recipes (T0's
Adafactor, HF's T5 Adafactor, BLOOMZ's Adam) are presets.py's.
"""
import dataclasses
import math

import torch

from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.training.adafactor import Adafactor
from tinylab.training.adamw_nobias import AdamWNoBiasCorrection

OPTIMIZERS = ("adamw", "adafactor")

def param_groups(model, weight_decay, overrides=None):
    """Parameter groups by role: "decay" (tensors with >= 2 dims: matrices, embeddings; weight
    decay `weight_decay` x the override's weight_decay_scale) and "no_decay" (1-D: norm gains;
    weight decay 0), each split further by the per-parameter overrides that change an update
    (lr_scale, eps, weight_decay_scale). The layout never depends on the decay's value, so a run
    with another weight_decay has the same groups. Each group lists its parameter names."""
    overrides = overrides or {}
    groups = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        ov = overrides.get(name, {})
        role = "decay" if p.dim() >= 2 else "no_decay"
        scale = ov.get("weight_decay_scale", 1.0) if role == "decay" else None
        key = (role, ov.get("lr_scale", 1.0), ov.get("eps"), scale)
        g = groups.setdefault(key, {"params": [], "param_names": [], "role": role,
                                    "weight_decay": weight_decay * scale if role == "decay" else 0.0,
                                    "lr_scale": ov.get("lr_scale", 1.0)})
        if ov.get("eps") is not None:
            g["eps"] = ov["eps"]
        g["params"].append(p)
        g["param_names"].append(name)
    return list(groups.values())


def build_optimizer(model, options, overrides=None):
    """The optimizer `options` (OptimizerOptions) names, over `model`'s parameters."""
    if options.name not in OPTIMIZERS:
        raise UserError(f"unknown optimizer '{options.name}' (choose from {', '.join(OPTIMIZERS)})")
    if options.name == "adafactor":
        return build_adafactor(model, options, overrides)
    groups = param_groups(model, options.weight_decay, overrides)
    betas = (options.beta1, options.beta2)
    if not options.adam_bias_correction:  # transformers' AdamW(correct_bias=False): staged-training's
        return AdamWNoBiasCorrection(groups, lr=options.learning_rate, betas=betas, eps=options.adam_eps)
    device_type = next(model.parameters()).device.type
    # fused kernels exist for CUDA and (torch >= 2.4) CPU; on CPU fused is ~4x faster than
    # foreach / for-loop for an 8M model (bench/train.py); other devices take foreach
    extra = {"fused": True} if device_type in ("cuda", "cpu") else {"foreach": True}
    return torch.optim.AdamW(groups, lr=options.learning_rate, betas=betas, eps=options.adam_eps, **extra)


def optimizer_param_names(optimizer):
    """Names of the optimizer's parameters in state-dict index order."""
    return [n for g in optimizer.param_groups for n in g["param_names"]]


# ---------------------------------------------------------------------- optimizer state of a checkpoint

# per-parameter state entries with a parameter-derived shape (AdamW's moments; Adafactor's moments,
# factored second moments and fp32 master copy)
PARAM_SHAPED_STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master", "exp_avg_sq_row", "exp_avg_sq_col")


def _state_shape(key, shape):
    if key == "exp_avg_sq_row":
        return shape[:-1]
    if key == "exp_avg_sq_col":
        return shape[:-2] + shape[-1:]
    return shape


def _unfit(detail):
    return UserError(f"the checkpoint's optimizer state does not fit this model's parameters: {detail}; start with "
                     f"a fresh optimizer instead (init_from=resume_model, without reset_progress)")


def _saved_by_name(optimizer, saved, saved_names):
    """{parameter name: (its saved per-parameter state, {} if none; the saved group it was in)} of
    a checkpoint's optimizer state dict `saved`, whose parameters `saved_names` lists in
    state-dict index order. Without names (llama2.c's checkpoints) the positions are taken as
    this optimizer's, when its groups have the same sizes."""
    if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict) and isinstance(saved.get("param_groups"), list)
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in saved["param_groups"])):
        raise _unfit("it is not a torch optimizer state dict (a 'state' dict and a 'param_groups' list of groups "
                     "with 'params')")
    groups = saved["param_groups"]
    if saved_names is None:
        sizes, now = [len(g["params"]) for g in groups], [len(g["params"]) for g in optimizer.param_groups]
        if sizes != now:
            raise _unfit(f"no param_names, and its parameter groups have sizes {sizes}, this model's {now}")
        saved_names = optimizer_param_names(optimizer)
    if not (isinstance(saved_names, (list, tuple)) and all(isinstance(n, str) for n in saved_names)):
        raise _unfit(f"param_names is a {type(saved_names).__name__}, not a list of parameter names")
    twice = sorted(n for n in set(saved_names) if saved_names.count(n) > 1)
    if twice:
        raise _unfit(f"param_names lists {twice[0]} more than once")
    # torch numbers the parameters 0, 1, ... through the groups in order: the positions of param_names
    flat = [i for g in groups for i in g["params"]]
    if not (all(type(i) is int for i in flat) and sorted(flat) == list(range(len(saved_names)))):
        raise _unfit(f"its groups hold {len(flat)} parameter indices, its param_names lists {len(saved_names)} names")
    group_of = {i: g for g in groups for i in g["params"]}
    stray = [k for k in saved["state"] if k not in group_of]
    if stray:
        raise _unfit(f"state at index {stray[0]!r:.40}, but param_names has indices 0-{len(saved_names) - 1}")
    out = {}
    for i, name in enumerate(saved_names):
        st = saved["state"].get(i, {})
        if not isinstance(st, dict):
            raise _unfit(f"the state of {name} is a {type(st).__name__}, not a dict")
        out[name] = (st, group_of[i])
    return out


def state_for(optimizer, saved, saved_names):
    """A checkpoint's optimizer state dict laid out for `optimizer` (for its load_state_dict):
    per parameter of `optimizer`, the saved state (moments, step counts) of the parameter of the
    same name; the groups and their settings are `optimizer`'s own, i.e. the config's. Mapping by
    name makes the checkpoint's group layout irrelevant (older checkpoints grouped parameters by
    their settings, so changing weight_decay to 0 changed the order). A parameter without saved
    state, a saved parameter this model lacks, or a moment of another shape is a UserError naming
    the parameter."""
    by_name = _saved_by_name(optimizer, saved, saved_names)
    names = optimizer_param_names(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    missing = [n for n in names if n not in by_name]
    if missing:
        raise _unfit(f"no state for {missing[0]} ({len(missing)} of this model's {len(names)} parameters missing)")
    extra = sorted(set(by_name) - set(names))
    if extra:
        raise _unfit(f"state for {extra[0]}, which this model does not have ({len(extra)} such)")
    state = {}
    for i, (name, p) in enumerate(zip(names, params)):
        st = by_name[name][0]
        for key in PARAM_SHAPED_STATE:
            if key not in st:
                continue
            want = _state_shape(key, tuple(p.shape))
            if not torch.is_tensor(st[key]) or tuple(st[key].shape) != want:
                got = tuple(st[key].shape) if torch.is_tensor(st[key]) else type(st[key]).__name__
                raise _unfit(f"{key} of {name} has shape {got}, the parameter needs {want}")
        if st:
            state[i] = st
    return {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}


def changed_settings(optimizer, saved, saved_names):
    """["key old -> new", ...]: the group settings of `optimizer` (weight_decay, betas, eps,
    lr_scale, ...) that differ from those of the saved group each parameter was in (sorted, each
    once; the learning rate is the schedule's and is not compared). Call it after state_for has
    accepted the state (every parameter has a saved group)."""
    by_name = _saved_by_name(optimizer, saved, saved_names)
    changed = set()
    for group in optimizer.param_groups:
        for name in group["param_names"]:
            old = by_name[name][1]
            for k, v in group.items():
                if k not in ("params", "param_names", "role", "lr", "initial_lr") and old.get(k) != v:
                    changed.add(f"{k} {old.get(k)} -> {v}")
    return sorted(changed)


LR_SCHEDULES = ("cosine", "linear", "constant")

# the cosine schedule's warmup: nanoGPT's (pos+1)/(warmup+1) already moves the weights at step 0;
# the study's train.py (as llama2.c) starts from lr 0
WARMUP_FORMULA = Key("warmup_formula", "nanogpt", "cosine schedule's warmup: nanogpt = learning_rate * (it+1) / "
                     "(warmup_iters+1) | original = learning_rate * it / warmup_iters (the study's train.py and "
                     "llama2.c: step 0 at lr 0)", choices=("nanogpt", "original"))
declare_difference(WARMUP_FORMULA, original="original", family="study",
                   behaviour="get_lr warms up with learning_rate * it / warmup_iters: the first step has lr 0",
                   source="RobertKirk/tinystories-wrappers train.py:406")


def lr_at(it, schedule, rewarmup=None):
    """Learning rate at iteration `it` (the rate of the optimizer step taken at iter_num = it) of
    `schedule` (ScheduleOptions).

    The schedule (`schedule_lr`) is read at position pos = it - shift. After growth
    (docs/growth.md §6.3) `rewarmup` = {"start": R0, "iters": R_w, "shift": k, "ramp_from": R,
    "base_lr": lr0} re-warms linearly: for R <= pos < R + R_w the rate is
    (pos - R) / R_w * schedule(R + R_w), a ramp from 0 at position R to the schedule's value at
    R + R_w, then the schedule. Target mode puts R at the growth iteration's position (S_target,
    so the first step after growth has LR 0); grow.py --restart_steps S puts R = S and the first
    step at S + 1, which is staged-training's get_restart_linear_schedule_with_warmup exactly
    (`restart_steps` in the record: its branch for steps inside the warmup included).
    `base_lr` (grow.py without --reset_lr_scheduler) keeps the small run's peak learning rate,
    as a restored LambdaLR keeps its base_lrs.
    """
    if not rewarmup:
        return schedule_lr(it, schedule)
    if rewarmup.get("base_lr") is not None:
        schedule = dataclasses.replace(schedule, learning_rate=rewarmup["base_lr"])
    shift, iters = rewarmup.get("shift", 0), rewarmup.get("iters", 0)
    pos = it - shift
    ramp_from = rewarmup.get("ramp_from", rewarmup.get("start", 0) - shift)
    if iters > 0 and ramp_from <= pos < ramp_from + iters:
        target = schedule_lr(ramp_from + iters, schedule)
        if "restart_steps" in rewarmup and pos < schedule.warmup_iters and schedule.decays \
                and schedule.lr_schedule != "cosine":
            # staged-training's restart inside the warmup ramps to the warmup line at R + R_w, extended
            # past the peak when R + R_w > warmup (gpt_pretrain.py:71-73)
            target = schedule.learning_rate * (ramp_from + iters) / schedule.warmup_iters
        return (pos - ramp_from) / iters * target
    return schedule_lr(pos, schedule)


def schedule_lr(pos, schedule):
    """The schedule at position `pos`:
      lr_scheduling=False or decay_lr=False   constant learning_rate (the *_no_lrs configs)
      cosine     linear warmup over warmup_iters (warmup_formula: nanoGPT's (pos+1)/(warmup+1), or
                 the study's and llama2.c's pos/warmup), then cosine to min_lr at lr_decay_iters
                 (0 = max_iters), min_lr after
      linear     transformers' get_linear_schedule_with_warmup: pos/warmup during the warmup, then
                 a straight line to min_lr at lr_decay_iters (staged-training's schedule)
      constant   the same linear warmup as linear, then constant learning_rate
    """
    lr = schedule.learning_rate
    if not schedule.decays:
        return lr
    kind, warmup, min_lr = schedule.lr_schedule, schedule.warmup_iters, schedule.min_lr
    decay_iters = schedule.lr_decay_iters or schedule.max_iters
    if kind == "cosine":
        if pos < warmup:
            if schedule.warmup_formula == "original":
                return lr * pos / warmup
            return lr * (pos + 1) / (warmup + 1)
        if pos > decay_iters:
            return min_lr
        ratio = (pos - warmup) / max(1, decay_iters - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
    if pos < warmup:
        return lr * pos / max(1, warmup)
    if kind == "constant":
        return lr
    return min_lr + (lr - min_lr) * max(0.0, (decay_iters - pos) / max(1, decay_iters - warmup))


def clip_grad_norm(model, max_norm, overrides=None):
    """torch.nn.utils.clip_grad_norm_, except that a parameter with an override "clip_weight" w
    adds w * |grad|^2 to the squared norm: after exact width growth the norm is measured in the
    small model's units, so clipping scales the gradients exactly as it would have there."""
    weights = {n: ov["clip_weight"] for n, ov in (overrides or {}).items() if "clip_weight" in ov}
    if not weights:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    grads = [(weights.get(n, 1.0), p.grad) for n, p in model.named_parameters() if p.grad is not None]
    total = torch.stack([w * g.detach().pow(2).sum() for w, g in grads]).sum().sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for _, g in grads:
        g.detach().mul_(coef.to(g.dtype))
    return total


def set_lr(optimizer, lr):
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)


def build_adafactor(model, options, overrides=None):
    """Adafactor over `model` from `options.adafactor` (AdafactorOptions; see adafactor.py).

    Parameter groups are param_groups' (names, lr_scale, weight decay on >= 2-D tensors); with
    relative_step=False each group's lr is learning_rate * lr_scale, with relative_step=True lr is
    None (the step size comes from the step count; learning_rate is ignored). eps is HF's pair
    (adafactor_eps1, adafactor_eps2): eps1 added to G^2, eps2 the RMS floor of the step size.
    """
    a = options.adafactor
    overrides = overrides or {}
    eps_overrides = sorted(n for n, ov in overrides.items() if ov.get("eps") is not None)
    if eps_overrides:
        raise UserError(f"per-parameter eps overrides (e.g. {eps_overrides[0]}) are AdamW-only "
                        f"(exact growth continuation); use optimizer=adamw")
    groups = param_groups(model, options.weight_decay, overrides)
    relative = bool(a.relative_step)
    lr = None if relative else options.learning_rate
    if not relative:
        for g in groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
    return Adafactor(groups, lr=lr, eps=(a.eps1, a.eps2), clip_threshold=a.clip_threshold, decay_rate=a.decay_rate,
                     beta1=a.beta1 if a.beta1 else None, scale_parameter=bool(a.scale_parameter),
                     relative_step=relative, warmup_init=bool(a.warmup_init))
