"""Reading runs for plots: metrics.jsonl files, run folders and sweep summaries (plot.py draws them)."""
import json
import math
import os

from tinylab.core.errors import UserError
from tinylab.core.metrics import read_metrics

SKIP_KEYS = {"iter", "time", "kind"}


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_runs(inputs):
    """[(label, records)] for every run the inputs name."""
    runs = []
    for item in inputs:
        path = os.path.join(item, "metrics.jsonl") if os.path.isdir(item) else item
        if not os.path.isfile(path):
            raise UserError(f"no metrics log at {path}")
        records = [r for r in read_metrics(path) if isinstance(r, dict)]
        if records and "params" in records[0] and "run" in records[0]:
            runs += sweep_runs(path, records)
        else:
            label = os.path.basename(os.path.dirname(os.path.abspath(path))) if os.path.basename(path) == "metrics.jsonl" else path
            runs.append((label, records))
    return runs


def sweep_runs(path, results):
    """The runs of a sweep summary, labelled by the parameters that differ between them."""
    results = list({r["run"]: r for r in results}.values())  # a re-run's record replaces the earlier one
    varying = [k for k in results[0]["params"] if len({json.dumps(r["params"].get(k), default=str) for r in results}) > 1]
    runs = []
    for r in results:
        log = os.path.join(r.get("out_dir") or "", "metrics.jsonl")
        if not r.get("out_dir") or not os.path.isfile(log):
            print(f"warning: {path}: {r['run']} has no metrics log ({log}); skipped")
            continue
        label = " ".join(f"{k}={r['params'][k]}" for k in varying) or r["run"]
        runs.append((label, read_metrics(log)))
    return runs


def series(records, x_key, metric):
    xs, ys = [], []
    for rec in records:
        if _is_number(rec.get(metric)) and _is_number(rec.get(x_key)):
            xs.append(rec[x_key])
            ys.append(rec[metric])
    return xs, ys
