"""A checkpoint's AdamW state by parameter name (docs/growth.md §6), and back.

Growth maps moments by name (the operators in ops/ say how each parameter's state grows); the
grown state dict is then rebuilt with exactly the parameter groups train.py will build.
"""
import torch

from tinylab.core.errors import UserError
from tinylab.growth.ops.base import meta_model
from tinylab.training.optim import build_optimizer, optimizer_param_names
from tinylab.training.options import OptimizerOptions

ADAM_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def optimizer_state_by_name(ckpt, shapes):
    """{parameter name: AdamW state} of a checkpoint, checked against the model's parameters
    (`shapes`: {name: shape}). Structure and every moment's shape are checked here: a malformed
    state would otherwise be grown, written, and fail only inside AdamW when train.py resumes."""
    opt = ckpt.get("optimizer")
    if opt is None:
        return {}
    saved = checked_param_names(ckpt, shapes)
    if not (isinstance(opt, dict) and isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list)
            and opt["param_groups"] and all(isinstance(g, dict) for g in opt["param_groups"])):
        raise UserError("the checkpoint's optimizer entry is not a torch optimizer state dict "
                        "(it needs a 'state' dict and a non-empty 'param_groups' list)")
    by_name = {}
    for index, st in opt["state"].items():
        # torch keys the state by int position in param_groups; other keys would be dropped on load
        if type(index) is not int or not 0 <= index < len(saved):
            raise UserError(f"the checkpoint's optimizer state has index {index!r:.40} but only {len(saved)} "
                            f"param_names (indices 0-{len(saved) - 1})")
        name = saved[index]
        check_adam_state(name, st, shapes[name])
        by_name[name] = st
    return by_name


def checked_param_names(ckpt, shapes):
    """The checkpoint's param_names (the names of its optimizer state's positions), which must be
    exactly the model's parameters, of a state grow.py can map."""
    opt_name = ckpt.get("optimizer_name", "adamw")
    if opt_name != "adamw":
        raise UserError(f"the checkpoint's optimizer state is {opt_name}; grow.py maps AdamW state only "
                        "(grow the weights of a resume_model copy, or train the small model with AdamW)")
    saved = ckpt.get("param_names")
    if saved is None:
        raise UserError("the checkpoint has optimizer state but no param_names, so its state cannot be mapped "
                        "by name (checkpoints written by this project's train.py have them)")
    if not isinstance(saved, (list, tuple)):
        raise UserError(f"the checkpoint's param_names is a {type(saved).__name__}, not a list of names")
    if sorted(map(str, saved)) != sorted(shapes):
        unknown = sorted(set(map(str, saved)) - set(shapes))[:3] or sorted(set(shapes) - set(map(str, saved)))[:3]
        raise UserError(f"the checkpoint's optimizer state does not match the model's parameters "
                        f"(unknown or missing parameter names: {', '.join(unknown) or 'a name listed twice'})")
    return saved


def check_adam_state(name, st, shape):
    """One parameter's AdamW state: known keys, complete, tensors of the parameter's shape."""
    if not isinstance(st, dict):
        raise UserError(f"the optimizer state of {name} is not a dict")
    unknown = [k for k in st if k not in ADAM_STATE_KEYS]
    if unknown:
        raise UserError(f"unknown optimizer state '{unknown[0]}' for {name}; grow.py maps AdamW's "
                        f"{', '.join(ADAM_STATE_KEYS)}")
    missing = [k for k in ("step", "exp_avg", "exp_avg_sq") if st and k not in st]
    if missing:  # AdamW initialises only an empty state; a partial one fails at its first step
        raise UserError(f"the optimizer state of {name} has no {missing[0]}")
    if st and not (isinstance(st["step"], torch.Tensor) and st["step"].numel() == 1):
        raise UserError(f"the optimizer state of {name}: step must be a one-element tensor")
    for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        if key in st and not isinstance(st[key], torch.Tensor):
            raise UserError(f"the optimizer state of {name}: {key} is a {type(st[key]).__name__}, not a tensor")
        if key in st and tuple(st[key].shape) != shape:
            raise UserError(f"the checkpoint's optimizer state is inconsistent: {key} of {name} has shape "
                            f"{tuple(st[key].shape)}, the parameter {shape}")


def optimizer_state_dict(args, cfg, overrides, by_name, old):
    """A torch AdamW state dict for the model `args` describes: the parameter groups exactly as
    train.py will build them (same grouping, names, hyperparameters), the state filled by name.
    Implementation flags (fused on CUDA, foreach) are taken from the old state dict `old`, since
    the structure is built on the meta device."""
    opt = build_optimizer(meta_model(args), OptimizerOptions.from_config(cfg), overrides)
    names = optimizer_param_names(opt)
    sd = opt.state_dict()
    flags = {k: v for k, v in old["param_groups"][0].items() if k in ("foreach", "fused", "capturable")}
    for group in sd["param_groups"]:
        group.update(flags)
    sd["state"] = {i: by_name[n] for i, n in enumerate(names) if by_name.get(n)}
    return sd, names
