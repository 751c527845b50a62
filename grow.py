"""Staged training: double a checkpoint's width or depth, with its whole training state.

    python grow.py --doubling weights --resume out/ckpt.pt --out_dir out_wide   # width x2
    python grow.py --doubling layers  --resume out/ckpt.pt --out_dir out_deep   # depth x2
    python train.py configs/x.py --init_from=resume_train --out_dir=out_wide    # continue

The operators are tinylab/growth.py's (the same ones train.py's grow_schedule applies inside a
run); the math is in docs/growth.md, the flags in tinylab/schema.py (GROW).
"""
import os

from tinylab.checkpoint import load_checkpoint, save_checkpoint
from tinylab.errors import cli_main
from tinylab.growth import GrowthOptions, grow_checkpoint
from tinylab.rundir import RunDir, check_output_file
from tinylab.schema import GROW, TRAIN


def main(argv=None):
    a = GROW.parse_args(argv, GROW.argparser("Double a checkpoint's width (weights) or depth (layers), "
                                             "function-preserving, with its optimizer state and schedule."))
    opts = GrowthOptions(doubling=a.doubling, mode=a.mode, symmetry_breaking=a.symmetry_breaking, sb_scale=a.sb_scale,
                         sb_alpha=a.sb_alpha, placement=a.placement, seed=a.seed, c_width=a.c_width,
                         c_depth=a.c_depth, rewarmup_iters=a.rewarmup_iters).check()
    with RunDir(a.out_dir) as run_dir:  # created, locked; removed again if nothing is written
        out_path = check_output_file(os.path.join(a.out_dir, "ckpt.pt"), a.force, "grown checkpoint")
        ckpt = load_checkpoint(a.resume)
        # the optimizer state is rebuilt with the settings the run was trained with
        cfg = {**TRAIN.defaults(), **(ckpt.get("config") or {})}
        grown = grow_checkpoint(ckpt, opts, cfg)
        # the summary is built before the write, so nothing can fail after it
        from model import ModelArgs  # not at the top: tinylab loads first (its Ctrl-C hook, errors.py)

        old, new = ModelArgs.from_dict(ckpt["model_args"]), grown["model_args"]
        sched = grown.get("lr_rewarmup") or {}
        was = ckpt["iter_num"] - (ckpt.get("lr_rewarmup") or {}).get("shift", 0)
        where = (f"; schedule position {grown['iter_num'] - sched['shift']} (was {was}), LR re-warmup over "
                 f"{sched['iters']} iterations" if opts.mode == "target" else "; exact continuation")
        summary = (f"grew {opts.doubling} ({opts.mode}, symmetry breaking {opts.split}): dim {old.dim} -> {new['dim']}, "
                   f"layers {old.n_layers} -> {new['n_layers']}, heads {old.n_heads} -> {new['n_heads']}, "
                   f"hidden {old.ffn_hidden_dim()} -> {new['hidden_dim']}; iteration {grown['iter_num']}{where}")
        save_checkpoint(grown, out_path)
        run_dir.commit()
    print(summary)
    print(f"wrote {out_path}; continue with: python train.py CONFIG --init_from=resume_train --out_dir={a.out_dir}")


if __name__ == "__main__":
    cli_main(main)
