"""Staged training: grow a model's whole training state mid-training (docs/growth.md).

    ops/               the growth operators, one module each, in a registry (width, depth)
    options.py         GrowthOptions (one growth, typed) and the grow_* / grow.py keys
    optimizer_state.py AdamW state by parameter name, checked; the grown state dict rebuilt
    state.py           the whole grown training state: checks, schedule after growth (grow_checkpoint)
    schedule.py        train.py's grow_schedule parsed and checked (check_growth, its key rule)
    rule.py            when to grow: the paper's slope rule (grow_schedule=auto, the planner)
    hook.py            in-run growth: the Trainer hook and grow_in_run
    report.py          what grow.py prints: the summary line, the loss before and after
    plan/              grow.py --plan: growth points from fitted scaling laws
"""
