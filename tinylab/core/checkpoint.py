"""Checkpoint files: one format for every driver, written atomically.

A checkpoint is a dict saved with torch.save, with llama2.c's keys
    model, optimizer, model_args, iter_num, best_val_loss, config
plus what exact resume and growth need:
    format_version      int, this module's FORMAT_VERSION
    optimizer_name      "adamw" | "adafactor"
    param_names         names of the optimizer's parameters in state-dict index order, so that
                        optimizer state is mapped by name (resume, growth), never by position
    param_overrides     {name: {"lr_scale", "eps", "weight_decay_scale", "clip_weight"}} per-parameter
                        optimizer settings (exact-mode growth, grow.py)
    lr_rewarmup         {"start": iter, "iters": n, "shift": k} or None: after target-mode growth the
                        LR schedule is read at iter_num - k, with a linear re-warmup from `start`
    rng                 python / numpy / torch (/ cuda) generator states
    loader              the training data loader's position (data.BatchLoader.state_dict())
    scaler              GradScaler state (fp16) or None
    wandb_run_id        the wandb run this run logs to (or None): resume_train continues it
    written_by          "grow.py" on a grown checkpoint (absent on a run's own): the output guard
                        (outputs.py) lets a later grow.py --force replace it, never a run's checkpoint
Only plain Python values and tensors are stored, so files load with torch.load(weights_only=True).

The original study's checkpoints (RobertKirk/tinystories-wrappers' train.py) have llama2.c's six
keys only, and its model.py can hold per-layer feature probes (`probes.{i}.weight`) and tuned
lenses (`lenses.{i}.weight`) in the model's state dict. Those are not model.py's weights: loading
keeps them aside (`aux_state`). A run that trains heads of that kind (train.py probes=True /
lenses=True, tinylab/eval/probes.py) starts its heads from them; any other resumed run writes them
back unchanged.
"""
import os
import random

import numpy as np
import torch

from model import ModelArgs, Transformer
from tinylab.core.errors import UserError, first_line
from tinylab.core.fileio import atomic_file

FORMAT_VERSION = 1


def save_checkpoint(ckpt: dict, path: str):
    """torch.save through a temp file beside `path`, fsync'd and renamed: a kill at any moment
    leaves either the old file or the new one, never a truncated one."""
    with atomic_file(path, parents=True) as f:  # a folder it creates is removed again if the write fails
        try:
            torch.save(ckpt, f)
        except RuntimeError as e:
            # torch's writer reports a failed write (a full disk) as a RuntimeError; the OSError
            # underneath is what the user needs to see
            if isinstance(e.__context__, OSError):
                raise OSError(e.__context__.errno, e.__context__.strerror, path) from None
            raise


def load_checkpoint(path: str, map_location="cpu") -> dict:
    """Load a checkpoint dict; a missing or unreadable file is a one-line UserError."""
    if os.path.isdir(path):
        path = os.path.join(path, "ckpt.pt")
    if not os.path.exists(path):
        raise UserError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001  any parse failure of a user's file (the unpickler raises many kinds)
        raise UserError(f"{path} is not a readable checkpoint ({first_line(e, 120)})")
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise UserError(f"{path} is not a model checkpoint (no 'model' / 'model_args' entries)")
    return ckpt


def clean_state_dict(state_dict):
    """Strip wrapper prefixes left by torch.compile ('_orig_mod.') and DDP ('module.')."""
    out = {}
    for k, v in state_dict.items():
        for prefix in ("_orig_mod.", "module."):
            while k.startswith(prefix):
                k = k[len(prefix):]
        out[k] = v
    return out


AUX_PREFIXES = ("probes.", "lenses.")  # the original model.py's extra heads (module docstring)


def split_aux_state(state: dict):
    """(this model's weights, the original's probe / lens entries) of a state dict."""
    aux = {k: v for k, v in state.items() if k.startswith(AUX_PREFIXES)}
    return {k: v for k, v in state.items() if k not in aux}, aux


def aux_state(ckpt: dict) -> dict:
    """The checkpoint's probe / lens state-dict entries (empty for this project's own)."""
    return split_aux_state(clean_state_dict(ckpt["model"]))[1]


def trains_aux_heads(ckpt: dict) -> bool:
    """A checkpoint of the original's probe / lens training: it froze the model and optimised
    only those heads, so its optimizer state is not this model's."""
    args = ckpt.get("model_args") or {}
    return bool(args.get("probes") or args.get("lenses"))


def model_from_checkpoint(ckpt: dict, **arg_overrides) -> Transformer:
    """Build the model described by `model_args` and load its weights (strictly; the original's
    probe / lens entries are not this model's and are left out)."""
    args = ModelArgs.from_dict({**ckpt["model_args"], **arg_overrides})
    state = split_aux_state(clean_state_dict(ckpt["model"]))[0]
    if "output.weight" not in state and "tok_embeddings.weight" in state and args.tie_embeddings:
        state["output.weight"] = state["tok_embeddings.weight"]
    model = Transformer(args)
    if state["tok_embeddings.weight"].dtype == torch.float64:
        model = model.double()  # loading fp64 weights into an fp32 model would round them
    load_weights(model, state)
    return model


def load_weights(model: Transformer, state: dict):
    """load_state_dict with a one-line error naming the first mismatching tensor."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise UserError(f"checkpoint weights do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise UserError(f"checkpoint tensor {k} has shape {tuple(state[k].shape)}, the model expects {tuple(v.shape)}")
    model.load_state_dict(state)


def model_args_dict(model: Transformer) -> dict:
    """The model's ModelArgs as a plain dict, with the FFN hidden size made explicit."""
    from dataclasses import asdict
    d = asdict(model.params)
    d["hidden_dim"] = model.params.ffn_hidden_dim()
    return d


# ---------------------------------------------------------------------- RNG state

def rng_state() -> dict:
    """All global generator states, as tensors / plain values (weights_only-loadable)."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]), int(np_state[3]), float(np_state[4])),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict):
    random.setstate(_tuplify(state["python"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x):
    # torch.load may hand back lists where random.setstate wants tuples
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x
