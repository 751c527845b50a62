"""The whole training state grown: weights, AdamW state, schedule position, data cursor.

    grown = grow_checkpoint(ckpt, GrowthOptions(name), cfg)     # name: a registered operator (ops/)

The operator (ops/) grows the weights and moments; this module checks the checkpoint first, keeps
everything else (iter_num, best_val_loss, rng, loader, scaler, ...) and moves the schedule:
  - mode target (docs/growth.md §6.3, default): the LR schedule moves back to S_target = S_pre / c
    with a linear re-warmup. `iter_num` keeps counting optimizer steps (the data cursor continues,
    nothing is replayed); the schedule position is iter_num - shift (`lr_rewarmup["shift"]`), so
    the run ends when the position reaches max_iters.
  - grow.py --restart_steps (staged-training's restart, §6.5): the position set explicitly.
  - mode exact (§6.2): the schedule continues; the operator's per-parameter multipliers
    (`param_overrides`) make the grown model's updates reproduce the small model's.
"""
from dataclasses import asdict

import torch

from model import ModelArgs
from tinylab.core import memory_budget
from tinylab.core.checkpoint import clean_state_dict
from tinylab.core.errors import UserError, first_line
from tinylab.growth.ops import OPERATORS
from tinylab.growth.ops.base import check_limits, meta_model
from tinylab.growth.optimizer_state import optimizer_state_by_name, optimizer_state_dict
from tinylab.training.restart import check_restart_fits, restart_rewarmup

WEIGHTS_MISMATCH = "the checkpoint's weights do not match its model_args (incompatible shapes or names)"


def check_checkpoint(ckpt):
    """The entries growth reads besides the optimizer state, checked before any work (a missing
    iter_num used to surface only after the grown checkpoint had been written)."""
    model = ckpt.get("model")
    if not isinstance(model, dict) or not all(isinstance(t, torch.Tensor) for t in model.values()):
        raise UserError("the checkpoint's 'model' entry is not a state dict of tensors")
    if not isinstance(ckpt.get("model_args"), dict):
        raise UserError("the checkpoint's 'model_args' entry is not a dict")
    if not isinstance(ckpt.get("config") or {}, dict):
        raise UserError("the checkpoint's 'config' entry is not a dict")
    if "iter_num" not in ckpt:
        raise UserError("the checkpoint has no 'iter_num' (growth continues its iteration count; "
                        "checkpoints written by train.py have it)")
    if type(ckpt["iter_num"]) is not int or ckpt["iter_num"] < 0:
        raise UserError(f"the checkpoint's iter_num must be an int >= 0, not {ckpt['iter_num']!r:.40}")
    rw = ckpt.get("lr_rewarmup")
    if rw is not None and not (isinstance(rw, dict) and type(rw.get("shift", 0)) is int):
        raise UserError(f"the checkpoint's lr_rewarmup must be None or {{'start', 'iters', 'shift'}}, not {rw!r:.60}")


def checked_small_model(args, weights):
    """The meta model `args` describes, with the weights checked against it. Runs before
    check_limits, so broken model_args (silently filled with ModelArgs' 7B defaults) are reported
    as a mismatch, not as a grown model beyond the size limits."""
    # layer count first: building the meta model costs time per layer, and n_layers may be anything
    if args.n_layers != len({k.split(".")[1] for k in weights if k.startswith("layers.")}):
        raise UserError(WEIGHTS_MISMATCH)
    try:
        small = meta_model(args)
    except (AssertionError, TypeError, ValueError, ZeroDivisionError, OverflowError, RuntimeError) as e:
        raise UserError(f"the checkpoint's model_args do not describe a model ({first_line(e)})")
    expected = small.state_dict()
    if set(weights) != set(expected) or any(tuple(weights[k].shape) != tuple(v.shape) for k, v in expected.items()):
        raise UserError(WEIGHTS_MISMATCH)
    return small


def check_fits(ckpt, new_args, opts, weights):
    """What this machine can hold of the grown model: its weights and moments, beside the checkpoint."""
    grown_shape = memory_budget.Shape.from_model_args(new_args)
    if grown_shape is not None:
        keeps_moments = ckpt.get("optimizer") is not None and not opts.reset_optimizer
        memory_budget.check(memory_budget.growth_estimate(grown_shape, keeps_moments), str(next(iter(weights.values())).device))


def target_schedule(ckpt, opts):
    """Mode target (§6.3): the schedule position jumps back from S_pre to S_target = S_pre / c and
    the LR re-warms linearly over rewarmup_iters; iteration counting (and data) continue."""
    it = ckpt["iter_num"]
    shift = (ckpt.get("lr_rewarmup") or {}).get("shift", 0)
    s_pre = it - shift
    s_target = int(round(s_pre / opts.c[opts.doubling]))
    return {"start": it, "iters": opts.rewarmup_iters, "shift": shift + s_pre - s_target}


def check_restart(opts, cfg):
    """--restart_steps S and --restart_warmup_steps R against the checkpoint's config `cfg`: the
    grown run trains from position S + 1 until its position reaches max_iters, so S must lie
    before the schedule's end and the re-warmup (positions S .. S + R) must end by max_iters."""
    check_restart_fits(opts.restart_steps, opts.restart_warmup_steps, cfg["max_iters"], cfg["lr_decay_iters"])


def restart_schedule(ckpt, opts, cfg):
    """grow.py --restart_steps S [--restart_warmup_steps R] (staged-training's restart): the grown
    run's first step is at schedule position S + 1, re-warming linearly from position S over R
    steps (optim.lr_at); iteration counting and data continue. Without --reset_lr_scheduler the
    checkpoint's peak learning rate stays (a restored LambdaLR keeps its base_lrs). The same
    record as train.py's restart of a resumed run (tinylab/training/restart.py)."""
    check_restart(opts, cfg)
    base_lr = None if opts.reset_lr_scheduler else cfg["learning_rate"]
    return restart_rewarmup(ckpt["iter_num"], opts.restart_steps, opts.restart_warmup_steps, base_lr)


def grow_checkpoint(ckpt: dict, opts, cfg: dict) -> dict:
    """The grown training state as a new checkpoint dict (the input is not modified); `opts` is a
    GrowthOptions. `cfg` is the whole training config whose optimizer settings the grown optimizer
    state must match (grow.py: the checkpoint's own config over the schema's defaults)."""
    opts.check()
    op = OPERATORS.get(opts.doubling)
    check_checkpoint(ckpt)
    args = ModelArgs.from_dict(ckpt["model_args"])
    weights = clean_state_dict(ckpt["model"])
    if args.tie_embeddings and "output.weight" not in weights and "tok_embeddings.weight" in weights:
        weights["output.weight"] = weights["tok_embeddings.weight"]
    small = checked_small_model(args, weights)
    new_args = op.grown_args(args)
    check_limits(new_args)
    check_fits(ckpt, new_args, opts, weights)
    if opts.mode == "exact" and (args.dropout > 0 or cfg["dropout"] > 0):
        raise UserError("mode=exact needs dropout=0 (dropout masks differ between the halves)")
    opt_state = optimizer_state_by_name(ckpt, {n: tuple(p.shape) for n, p in small.named_parameters()})
    with torch.no_grad():
        gen = torch.Generator().manual_seed(opts.seed)  # symmetry-breaking noise, the same on every device
        weights, opt_state, info = op.grow(weights, args, opt_state, opts, gen)
    overrides = op.exact(info, ckpt.get("param_overrides"), cfg["adam_eps"]) if opts.mode == "exact" else None
    return grown_state(ckpt, new_args, weights, opt_state, overrides, opts, cfg)


def grown_state(ckpt, new_args, weights, opt_state, overrides, opts, cfg):
    """The checkpoint dict of the grown model: the input's entries carried over, the shape, the
    weights, the schedule after growth and the optimizer state replaced."""
    grown = dict(ckpt)  # iter_num, best_val_loss, rng, loader, scaler, ... carry over unchanged
    model_args = asdict(new_args)
    grown["model"] = weights
    grown["model_args"] = model_args
    grown["config"] = {**(ckpt.get("config") or {}),
                       **{k: model_args[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim")}}
    grown["param_overrides"] = overrides
    if opts.restart_steps is not None:
        grown["lr_rewarmup"] = restart_schedule(ckpt, opts, cfg)
    elif opts.mode == "target":
        grown["lr_rewarmup"] = target_schedule(ckpt, opts)
    if opts.reset_optimizer:
        grown["optimizer"], grown["param_names"] = None, None
    elif ckpt.get("optimizer") is not None:
        grown["optimizer"], grown["param_names"] = optimizer_state_dict(new_args, cfg, overrides, opt_state,
                                                                         ckpt["optimizer"])
    return grown
