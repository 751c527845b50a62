"""Staged training: double a checkpoint's width or depth, with its whole training state.

    python grow.py --doubling weights --resume out/ckpt.pt --out_dir out_wide   # width x2
    python grow.py --doubling layers  --resume out/ckpt.pt --out_dir out_deep   # depth x2
    python train.py configs/x.py --init_from=resume_train --out_dir=out_wide    # continue

The operators are tinylab/growth.py's (the same ones train.py's grow_schedule applies inside a
run); the math is in docs/growth.md.
"""
import os

from model import ModelArgs
from tinylab.checkpoint import load_checkpoint, save_checkpoint
from tinylab.config import ArgParser
from tinylab.errors import UserError, cli_main
from tinylab.growth import (
    DOUBLINGS,
    MODES,
    PLACEMENTS,
    SYMMETRY_BREAKING,
    GrowthOptions,
    grow_checkpoint,
)


def check_out_dir(out_dir, force):
    """The path of the grown ckpt.pt, checked before loading or growing anything (a bad out_dir
    used to fail only at the write, after all the work)."""
    out_path = os.path.join(out_dir, "ckpt.pt")
    if os.path.isdir(out_path):
        raise UserError(f"{out_path} is a folder; cannot write the grown checkpoint there")
    if os.path.lexists(out_path) and not force:
        raise UserError(f"{out_path} already exists (use --force to overwrite it)")
    # the nearest existing folder on the way must be a writable folder (save creates the rest)
    existing = os.path.abspath(out_dir)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UserError(f"--out_dir {out_dir}: {existing} exists and is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--out_dir {out_dir}: {existing} is not writable")
    return out_path


def main(argv=None):
    p = ArgParser(prog="grow.py", description="Double a checkpoint's width (weights) or depth (layers), "
                  "function-preserving, with its optimizer state and schedule.")
    p.add_argument("--doubling", required=True, choices=DOUBLINGS)
    p.add_argument("--resume", required=True, help="checkpoint file or a folder holding ckpt.pt")
    p.add_argument("--out_dir", required=True, help="folder for the grown ckpt.pt")
    p.add_argument("--mode", default="target", choices=MODES)
    p.add_argument("--symmetry_breaking", default="", choices=("",) + SYMMETRY_BREAKING,
                   help="how the duplicated halves split each matrix (default: random; off in exact mode)")
    p.add_argument("--sb_scale", type=float, default=0.5)
    p.add_argument("--sb_alpha", type=float, default=0.8)
    p.add_argument("--placement", default="interleave", choices=PLACEMENTS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--c_width", type=float, default=1.776)
    p.add_argument("--c_depth", type=float, default=1.412)
    p.add_argument("--rewarmup_iters", type=int, default=150)
    p.add_argument("--force", action="store_true", help="overwrite a checkpoint already in out_dir")
    a = p.parse_args(argv)
    opts = GrowthOptions(**{k: v for k, v in vars(a).items() if k not in ("resume", "out_dir", "force")}).check()
    out_path = check_out_dir(a.out_dir, a.force)
    ckpt = load_checkpoint(a.resume)
    grown = grow_checkpoint(ckpt, opts)
    # the summary is built before the write, so nothing can fail after it
    old, new = ModelArgs.from_dict(ckpt["model_args"]), grown["model_args"]
    sched = grown.get("lr_rewarmup") or {}
    where = (f"; schedule position {grown['iter_num'] - sched['shift']} (was {ckpt['iter_num'] - (ckpt.get('lr_rewarmup') or {}).get('shift', 0)}), "
             f"LR re-warmup over {sched['iters']} iterations" if opts.mode == "target" else "; exact continuation")
    summary = (f"grew {opts.doubling} ({opts.mode}, symmetry breaking {opts.split}): dim {old.dim} -> {new['dim']}, "
               f"layers {old.n_layers} -> {new['n_layers']}, heads {old.n_heads} -> {new['n_heads']}, "
               f"hidden {old.ffn_hidden_dim()} -> {new['hidden_dim']}; iteration {grown['iter_num']}{where}")
    save_checkpoint(grown, out_path)
    print(summary)
    print(f"wrote {out_path}; continue with: python train.py CONFIG --init_from=resume_train --out_dir={a.out_dir}")


if __name__ == "__main__":
    cli_main(main)
