"""Draw training curves from metrics.jsonl logs into a PNG.

    python plot.py out/run1/metrics.jsonl out/run2 --metrics=loss/test,gen_feature_score --out=curves.png
    python plot.py out/sweeps/deletion/results.jsonl --metrics=loss/test     # every run of a sweep

Each input is a metrics.jsonl (one JSON record per line with "iter", written by every driver), a
run folder holding one, or a sweep summary (sweep.py's results.jsonl), which stands for all its
runs. One panel per metric, one line per run, against `iter` (or --x). Records without a numeric
value for a metric (evaluation-only keys, generation tables, "nan" strings) are skipped.
Without --metrics every numeric key found is drawn. matplotlib is optional for the project, so
its absence is a one-line error here rather than an import failure.
"""
import json
import math
import os

from errors import ArgParser, UserError, cli_main
from metrics import read_metrics

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


def main(argv=None):
    ap = ArgParser(description="Plot metrics from metrics.jsonl files, run folders or a sweep's results.jsonl.")
    ap.add_argument("inputs", nargs="+", help="metrics.jsonl files, run folders, or sweep results.jsonl")
    ap.add_argument("--metrics", help="comma-separated metric names (default: every numeric metric)")
    ap.add_argument("--out", default="curves.png", help="output PNG (default curves.png)")
    ap.add_argument("--x", default="iter", help="x-axis key (default iter)")
    ap.add_argument("--labels", help="comma-separated legend labels, one per run")
    ap.add_argument("--logy", action="store_true", help="logarithmic y axes")
    ap.add_argument("--title", help="figure title")
    a = ap.parse_args(argv)

    runs = load_runs(a.inputs)
    if not runs:
        raise UserError("no runs to plot")
    if a.labels:
        labels = a.labels.split(",")
        if len(labels) != len(runs):
            raise UserError(f"--labels has {len(labels)} names for {len(runs)} runs")
        runs = [(label, recs) for label, (_, recs) in zip(labels, runs)]
    available = sorted({k for _, recs in runs for rec in recs for k, v in rec.items() if k not in SKIP_KEYS and _is_number(v)})
    metrics = [m.strip() for m in a.metrics.split(",") if m.strip()] if a.metrics else available
    for m in metrics:
        if m not in available:
            raise UserError(f"no input has the metric '{m}' (available: {', '.join(available) or 'none'})")
    if not metrics:
        raise UserError("the inputs hold no numeric metrics")
    try:
        import matplotlib
    except ImportError:
        raise UserError("plot.py needs matplotlib, which is not installed (pip install matplotlib)")
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3 * len(metrics)), squeeze=False, sharex=True)
    for ax, metric in zip(axes[:, 0], metrics):
        for label, recs in runs:
            xs, ys = series(recs, a.x, metric)
            if xs:
                ax.plot(xs, ys, label=label, marker="." if len(xs) < 30 else None)
        ax.set_ylabel(metric)
        if a.logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if len(runs) > 1:
            ax.legend(fontsize="small")
    axes[-1, 0].set_xlabel(a.x)
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    from fileio import atomic_file  # a temp name + rename: never a truncated PNG
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with atomic_file(a.out) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    print(f"wrote {a.out} ({len(metrics)} metric(s), {len(runs)} run(s))")


if __name__ == "__main__":
    cli_main(main)
