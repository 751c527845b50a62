"""Planning staged training from fitted scaling laws (`python grow.py --plan`; docs/growth.md §7.1):

    runs.py     reading the runs' loss-vs-compute logs (config.json, metrics.jsonl)
    shapes.py   model shapes: keys, names, FLOPs per iteration
    law.py      the fitted form L(S) = E + (S_c/S)^alpha and its closed forms
    fit.py      fitting L(N, S) to the runs
    search.py   the candidate plans and the recommendation
    report.py   the printed table and the JSON
    options.py  grow.py --plan's keys and PlanOptions
    cli.py      grow.py --plan's main

The online rule (train.py's grow_schedule=auto) is ../rule.py's, on the same closed forms.
"""
