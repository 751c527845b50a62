"""Staged training: double a checkpoint's width or depth, with its whole training state.

    python grow.py --doubling weights --resume out/ckpt.pt --out_dir out_wide   # width x2
    python grow.py --doubling layers  --resume out/ckpt.pt --out_dir out_deep   # depth x2
    python train.py configs/x.py --init_from=resume_train --out_dir=out_wide    # continue
    python grow.py --plan --runs out/small out/large --budget=1e18             # plan growth points (§7.1)

The staged-training repository's commands work too (docs/growth.md §6.5):

    python grow.py --doubling weights --resume out/ckpt.pt                     # -> out/ckpt.pt.doubled_weights
    python grow.py --doubling layers --doubling_layers alternate_id --resume out/ckpt.pt --out_dir out_deep
    python grow.py --doubling weights --resume out/ckpt.pt --out_dir out_wide \
        --restart_steps 3319 --restart_warmup_steps 200 --reset_lr_scheduler [--reset_optimizer]
    python grow.py --doubling layers --doubling_layers alternate_id --resume out/ckpt.pt --compat=original
                                    # what its code really does, defects included (docs/originals.md)

The operators are tinylab/growth/ops/'s (the same ones train.py's grow_schedule applies inside a
run); the math is in docs/growth.md, the flags in tinylab/growth/options.py and
tinylab/growth/plan/options.py. The loss on a batch of the run's test data (random tokens when
the checkpoint names no dataset here) is printed before and after: ~0 change for the
function-preserving operators, and the damage a plain copy (alternate_copy / append_copy) does.
"""
import os
import sys

from tinylab.core.checkpoint import load_checkpoint, save_checkpoint
from tinylab.core.errors import UserError, cli_main
from tinylab.core.outputs import guard_file
from tinylab.core.rundir import RunDir
from tinylab.growth.ops import OPERATORS
from tinylab.growth.options import GrowthOptions
from tinylab.growth.plan.cli import plan_main, refuse_plan_flags, split_multi_values
from tinylab.growth.report import growth_summary, loss_change
from tinylab.growth.state import check_restart, grow_checkpoint
from tinylab.schema import GROW, TRAIN


def options(a) -> GrowthOptions:
    placement, copies = a.placement, False
    if a.doubling_layers is not None:
        if a.doubling_layers not in OPERATORS.get(a.doubling).layer_variants:
            owner = next(op.name for op in OPERATORS if a.doubling_layers in op.layer_variants)
            raise UserError(f"--doubling_layers={a.doubling_layers} applies to --doubling {owner}")
        placement, copies = GrowthOptions.DOUBLING_LAYERS[a.doubling_layers]
        if a.placement not in (placement, GROW.keys["placement"].default):
            raise UserError(f"--doubling_layers={a.doubling_layers} places the copies {placement}, "
                            f"but --placement={a.placement} was given")
    return GrowthOptions(doubling=a.doubling, mode=a.mode, symmetry_breaking=a.symmetry_breaking,
                         sb_scale=a.sb_scale, sb_alpha=a.sb_alpha, placement=placement, seed=a.seed,
                         rewarmup_iters=a.rewarmup_iters, copy_layers=copies,
                         restart_steps=a.restart_steps, restart_warmup_steps=a.restart_warmup_steps,
                         reset_lr_scheduler=a.reset_lr_scheduler, reset_optimizer=a.reset_optimizer,
                         width_moments=a.width_moments, depth_id=a.depth_id,
                         **{op.c_flag: getattr(a, op.c_flag) for op in OPERATORS}).check()


def main(argv=None):
    argv = split_multi_values(sys.argv[1:] if argv is None else argv)  # --runs A B: one or more folders
    a = GROW.parse_args(argv, GROW.argparser("Double a checkpoint's width (weights) or depth (layers), "
                                             "function-preserving, with its optimizer state and schedule."))
    if a.plan:  # growth points planned from the runs' fitted scaling laws (docs/growth.md §7.1)
        return plan_main(a)
    refuse_plan_flags(a)
    for flag in ("doubling", "resume"):
        if getattr(a, flag) is None:
            raise UserError(f"--{flag} is required (see python grow.py --help)")
    opts = options(a)
    source = os.path.join(a.resume, "ckpt.pt") if os.path.isdir(a.resume) else a.resume
    if a.out_dir is None:  # the original's names, beside the input (one atomic file: no run folder to lock)
        out_path = source + OPERATORS.get(a.doubling).output_suffix
    else:
        out_path = os.path.join(a.out_dir, "ckpt.pt")
    with RunDir(a.out_dir, enabled=a.out_dir is not None) as run_dir:  # created, locked; removed again if unused
        # a grown checkpoint grow.py wrote earlier may be replaced with --force; a training run's never
        guard_file(out_path, "grown_checkpoint", a.force, [source], "grown checkpoint", tool="grow.py")
        ckpt = load_checkpoint(a.resume)
        # the optimizer state is rebuilt with the settings the run was trained with
        cfg = {**TRAIN.defaults(), **(ckpt.get("config") or {})}
        check_restart(opts, cfg)  # the flags against the checkpoint's schedule, before any work or write
        grown = grow_checkpoint(ckpt, opts, cfg)
        before, after, measured_on = loss_change(ckpt, grown, cfg)
        # the summary is built before the write, so nothing can fail after it
        summary = growth_summary(ckpt, grown, opts)
        grown["written_by"] = "grow.py"  # the output guard lets a later grow.py --force replace this file
        save_checkpoint(grown, out_path)
        run_dir.commit()
    print(summary)
    note = "" if not opts.plain_copies else " (plain layer copies: the function is NOT preserved)"
    print(f"loss on {measured_on}: {before:.6f} -> {after:.6f} (change {after - before:+.2e}){note}")
    if a.out_dir is None:
        print(f"wrote {out_path}; continue with: python train.py CONFIG --init_from=resume_train "
              f"--resume_ckpt={out_path} --out_dir=NEW_RUN_FOLDER")
    else:
        print(f"wrote {out_path}; continue with: python train.py CONFIG --init_from=resume_train --out_dir={a.out_dir}")


if __name__ == "__main__":
    cli_main(main)
