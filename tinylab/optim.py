"""Optimizers, their presets and learning-rate schedules, shared by every driver.

Every function here reads a whole config (schema.py's keys; callers that build one by hand start
from `TRAIN.defaults()`). build_optimizer(model, cfg) makes AdamW (weight decay on >=2-D parameters only, as llama2.c;
fused on CUDA and CPU, foreach elsewhere) or Adafactor (adafactor.py). Parameter groups carry the
parameter *names* (`group["param_names"]`), so checkpoints can map optimizer state by name
(growth), and optional per-parameter overrides {name: {"lr_scale": s, "eps": e,
"weight_decay_scale": w, "clip_weight": c}} that exact growth needs (grow.py). lr_at(it, cfg) is
the schedule: constant, or linear warmup + cosine to min_lr, optionally moved back after growth
with a linear re-warmup from 0 (docs/growth.md §6.3). apply_optimizer_preset fills in the
settings of a named recipe (T0's Adafactor, HF's T5 Adafactor, BLOOMZ's Adam).
"""
import math
import sys

import torch

from tinylab.adafactor import Adafactor
from tinylab.errors import UserError

OPTIMIZERS = ("adamw", "adafactor")

def param_groups(model, weight_decay, overrides=None):
    """Group parameters by (decay, lr_scale, eps); each group lists its parameter names."""
    overrides = overrides or {}
    groups = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        ov = overrides.get(name, {})
        decay = weight_decay * ov.get("weight_decay_scale", 1.0) if p.dim() >= 2 else 0.0
        key = (decay, ov.get("lr_scale", 1.0), ov.get("eps"))
        g = groups.setdefault(key, {"params": [], "param_names": [], "weight_decay": decay,
                                    "lr_scale": ov.get("lr_scale", 1.0)})
        if ov.get("eps") is not None:
            g["eps"] = ov["eps"]
        g["params"].append(p)
        g["param_names"].append(name)
    return list(groups.values())


def build_optimizer(model, cfg, overrides=None):
    """The optimizer named by cfg['optimizer'] over `model`'s parameters."""
    name = cfg["optimizer"]
    if name not in OPTIMIZERS:
        raise UserError(f"unknown optimizer '{name}' (choose from {', '.join(OPTIMIZERS)})")
    lr = cfg["learning_rate"]
    if name == "adamw":
        groups = param_groups(model, cfg["weight_decay"], overrides)
        device_type = next(model.parameters()).device.type
        # fused kernels exist for CUDA and (torch >= 2.4) CPU; on CPU fused is ~4x faster than
        # foreach / for-loop for an 8M model (bench/train.py); other devices take foreach
        extra = {"fused": True} if device_type in ("cuda", "cpu") else {"foreach": True}
        return torch.optim.AdamW(groups, lr=lr, betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["adam_eps"], **extra)
    return adafactor_from_config(model, cfg, overrides)


def optimizer_param_names(optimizer):
    """Names of the optimizer's parameters in state-dict index order."""
    return [n for g in optimizer.param_groups for n in g["param_names"]]


LR_SCHEDULES = ("cosine", "linear", "constant")


def lr_at(it, cfg, rewarmup=None):
    """Learning rate at iteration `it` (the rate of the optimizer step taken at iter_num = it).

    The schedule (`schedule_lr`) is read at position pos = it - shift. After growth
    (docs/growth.md §6.3) `rewarmup` = {"start": R0, "iters": R_w, "shift": k, "ramp_from": R,
    "base_lr": lr0} re-warms linearly: for R <= pos < R + R_w the rate is
    (pos - R) / R_w * schedule(R + R_w), a ramp from 0 at position R to the schedule's value at
    R + R_w, then the schedule. Target mode puts R at the growth iteration's position (S_target,
    so the first step after growth has LR 0); grow.py --restart_steps S puts R = S and the first
    step at S + 1, which is staged-training's get_restart_linear_schedule_with_warmup exactly.
    `base_lr` (grow.py without --reset_lr_scheduler) keeps the small run's peak learning rate,
    as a restored LambdaLR keeps its base_lrs.
    """
    if not rewarmup:
        return schedule_lr(it, cfg)
    if rewarmup.get("base_lr") is not None:
        cfg = {**cfg, "learning_rate": rewarmup["base_lr"]}
    shift, iters = rewarmup.get("shift", 0), rewarmup.get("iters", 0)
    pos = it - shift
    ramp_from = rewarmup.get("ramp_from", rewarmup.get("start", 0) - shift)
    if iters > 0 and ramp_from <= pos < ramp_from + iters:
        return (pos - ramp_from) / iters * schedule_lr(ramp_from + iters, cfg)
    return schedule_lr(pos, cfg)


def schedule_lr(pos, cfg):
    """The configured schedule at position `pos`:
      lr_scheduling=False or decay_lr=False   constant learning_rate (the *_no_lrs configs)
      cosine     linear warmup over warmup_iters (llama2.c's (pos+1)/(warmup+1)), then cosine to
                 min_lr at lr_decay_iters (0 = max_iters), min_lr after
      linear     transformers' get_linear_schedule_with_warmup: pos/warmup during the warmup, then
                 a straight line to min_lr at lr_decay_iters (staged-training's schedule)
      constant   the same linear warmup as linear, then constant learning_rate
    """
    lr = cfg["learning_rate"]
    if not (cfg["lr_scheduling"] and cfg["decay_lr"]):
        return lr
    kind, warmup, min_lr = cfg["lr_schedule"], cfg["warmup_iters"], cfg["min_lr"]
    decay_iters = cfg["lr_decay_iters"] or cfg["max_iters"]
    if kind == "cosine":
        if pos < warmup:
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


# ---------------------------------------------------------------------- presets

_ADAFACTOR_HF = {"adafactor_clip_threshold": 1.0, "adafactor_decay_rate": -0.8,
                 "adafactor_beta1": 0.0, "adafactor_warmup_init": False,
                 "adafactor_relative_step": False, "adafactor_eps1": 1e-30, "adafactor_eps2": 1e-3}


ADAFACTOR_PRESETS = {
    # T0 (Mesh-TF): constant 1e-3 relative to each tensor's RMS, no warmup, no weight decay, no
    # global grad-norm clipping (update clipping replaces it).
    "t0": {**_ADAFACTOR_HF, "optimizer": "adafactor", "adafactor_scale_parameter": True,
           "learning_rate": 1e-3, "lr_scheduling": False, "warmup_iters": 0,
           "weight_decay": 0.0, "grad_clip": 0.0},
    # HF's T5 finetuning recipe: absolute steps of 1e-3 (about 50x t0's on std-0.02 matrices),
    # reached by the config's linear warmup (warmup_iters is left as configured) and then held
    # constant (min_lr = learning_rate turns the cosine into a constant), no extra clipping.
    "hf_t5": {**_ADAFACTOR_HF, "optimizer": "adafactor", "adafactor_scale_parameter": False,
              "learning_rate": 1e-3, "lr_scheduling": True, "decay_lr": True,
              "weight_decay": 0.0, "grad_clip": 0.0},
}


OPTIMIZER_PRESETS = {
    **ADAFACTOR_PRESETS,
    # BLOOMZ finetuning (tr13-mtf): Adam(0.9, 0.95) eps 1e-8, constant 2e-5, no warmup,
    # weight decay 1e-4 (matrices only), grad-norm clip 1.0.
    "bloomz_adam": {"optimizer": "adamw", "learning_rate": 2e-5, "lr_scheduling": False,
                    "warmup_iters": 0, "weight_decay": 1e-4, "grad_clip": 1.0,
                    "beta1": 0.9, "beta2": 0.95, "adam_eps": 1e-8},
}


def apply_optimizer_preset(cfg, defaults=None):
    """A new config with the preset named by cfg['adafactor_preset'] filled in ("" = no preset).

    Sets exactly the keys of OPTIMIZER_PRESETS[name] (optimizer, learning_rate, lr_scheduling,
    warmup_iters (not hf_t5), decay_lr (hf_t5), weight_decay, grad_clip, the adafactor_* keys or
    AdamW's beta1/beta2/adam_eps) and, for hf_t5, min_lr = learning_rate.
    With `defaults` (the driver's default config), a key whose value differs from its default
    was chosen by the user (config file or --key=value) and is kept, e.g.
    `--adafactor_preset=t0 --learning_rate=3e-4`; `optimizer` must then agree with the preset.
    Without `defaults` the preset overwrites every key it names.
    """
    name = cfg["adafactor_preset"]
    out = dict(cfg)
    if not name:
        return out
    if name not in OPTIMIZER_PRESETS:
        raise UserError(f"unknown adafactor_preset '{name}' (choose from "
                        f"{', '.join(OPTIMIZER_PRESETS)}, or '' for none)")
    preset = OPTIMIZER_PRESETS[name]
    for key, value in preset.items():
        user_set = defaults is not None and key in cfg and key in defaults and cfg[key] != defaults[key]
        if user_set and key == "optimizer" and cfg[key] != value:
            raise UserError(f"adafactor_preset={name} uses optimizer={value}, "
                            f"but optimizer={cfg[key]} was set")
        if not user_set:
            out[key] = value
    if name == "hf_t5":
        out["min_lr"] = out["learning_rate"]
        print("notice: adafactor_preset=hf_t5 takes absolute steps (scale_parameter=False), about 50x larger "
              f"than t0's on std-0.02 matrices; keep a warmup (warmup_iters={out['warmup_iters']})", file=sys.stderr)
    return out


def adafactor_from_config(model, cfg, overrides=None):
    """Adafactor over `model` from the adafactor_* config keys (see the module docstring).

    Parameter groups are optim.param_groups' (names, lr_scale, weight decay on >= 2-D tensors);
    with relative_step=False each group's lr is learning_rate * lr_scale, with relative_step=True
    lr is None (the step size comes from the step count; learning_rate is ignored). eps is HF's
    pair (adafactor_eps1, adafactor_eps2): eps1 added to G^2, eps2 the RMS floor of the step size.
    """
    c = cfg
    overrides = overrides or {}
    eps_overrides = sorted(n for n, ov in overrides.items() if ov.get("eps") is not None)
    if eps_overrides:
        raise UserError(f"per-parameter eps overrides (e.g. {eps_overrides[0]}) are AdamW-only "
                        f"(exact growth continuation); use optimizer=adamw")
    groups = param_groups(model, c["weight_decay"], overrides)
    relative = bool(c["adafactor_relative_step"])
    lr = None if relative else c["learning_rate"]
    if not relative:
        for g in groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
    beta1 = c["adafactor_beta1"]
    return Adafactor(groups, lr=lr, eps=(c["adafactor_eps1"], c["adafactor_eps2"]),
                     clip_threshold=c["adafactor_clip_threshold"],
                     decay_rate=c["adafactor_decay_rate"], beta1=beta1 if beta1 else None,
                     scale_parameter=bool(c["adafactor_scale_parameter"]), relative_step=relative,
                     warmup_init=bool(c["adafactor_warmup_init"]))
