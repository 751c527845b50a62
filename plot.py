"""Draw training curves from metrics.jsonl logs into a PNG.

    python plot.py out/run1/metrics.jsonl out/run2 --metrics=loss/test,gen_feature_score --out=curves.png
    python plot.py out/sweeps/deletion/results.jsonl --metrics=loss/test     # every run of a sweep

Each input is a metrics.jsonl (one JSON record per line with "iter", written by every driver), a
run folder holding one, or a sweep summary (sweep.py's results.jsonl), which stands for all its
runs. One panel per metric, one line per run, against `iter` (or --x). Records without a numeric
value for a metric (evaluation-only keys, generation tables, "nan" strings) are skipped.
Without --metrics every numeric key found is drawn (one never logged in a record that has the --x
key is left out, with a notice). An --x or --metrics name that no run logs is an error that lists
what the runs have. matplotlib is optional for the project, so
its absence is a one-line error here rather than an import failure.
"""
from tinylab.core.config import ArgParser
from tinylab.core.errors import UserError, cli_main
from tinylab.core.outputs import guard_parsed
from tinylab.eval.plotting import SKIP_KEYS, _is_number, load_runs, series


def few(names, n=8):
    """The first n names, comma-separated (and how many more)."""
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "") if names else "none"


def main(argv=None):
    ap = ArgParser(description="Plot metrics from metrics.jsonl files, run folders or a sweep's results.jsonl.")
    ap.add_input("inputs", nargs="+", help="metrics.jsonl files, run folders, or sweep results.jsonl")
    ap.add_argument("--metrics", help="comma-separated metric names (default: every numeric metric)")
    ap.add_output("--out", kind="png", default="curves.png", help="output PNG (default curves.png; an existing one "
                  "only with --force)")
    ap.add_argument("--force", action="store_true", help="replace an existing --out PNG (never anything else)")
    ap.add_argument("--x", default="iter", help="x-axis key (default iter)")
    ap.add_argument("--labels", help="comma-separated legend labels, one per run")
    ap.add_argument("--logy", action="store_true", help="logarithmic y axes")
    ap.add_argument("--title", help="figure title")
    a = ap.parse_args(argv)
    guard_parsed(ap, a, a.force, tool="plot.py")  # before any work: --out may be written (outputs.py)

    runs = load_runs(a.inputs)
    if not runs:
        raise UserError("no runs to plot")
    if a.labels:
        labels = a.labels.split(",")
        if len(labels) != len(runs):
            raise UserError(f"--labels has {len(labels)} names for {len(runs)} runs")
        runs = [(label, recs) for label, (_, recs) in zip(labels, runs)]
    numeric = {k for _, recs in runs for rec in recs for k, v in rec.items() if _is_number(v)}
    available = sorted(numeric - SKIP_KEYS)
    if a.x not in numeric:
        raise UserError(f"--x={a.x}: no input has a numeric '{a.x}' (they have: {few(sorted(numeric))})")
    metrics = [m.strip() for m in a.metrics.split(",") if m.strip()] if a.metrics else available
    for m in metrics:
        if m not in available:
            raise UserError(f"--metrics: no input has the metric '{m}' (available: {few(available)})")
    if not metrics:
        raise UserError("the inputs hold no numeric metrics")
    # a metric the runs log only in records without the x key (eval records vs --x=tokens_seen)
    # would be an empty panel
    empty = [m for m in metrics if not any(series(recs, a.x, m)[0] for _, recs in runs)]
    if empty and a.metrics:
        raise UserError(f"--metrics: no record has both '{empty[0]}' and --x={a.x} (the runs log them in "
                        f"different records), so its panel would be empty")
    if empty:
        print(f"notice: {len(empty)} metric(s) never logged with --x={a.x} left out: {few(empty)}")
        metrics = [m for m in metrics if m not in empty]
        if not metrics:
            raise UserError(f"no metric is logged in a record with --x={a.x}")
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
    from tinylab.core.fileio import atomic_file  # a temp name + rename: never a truncated PNG
    with atomic_file(a.out, parents=True) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    print(f"wrote {a.out} ({len(metrics)} metric(s), {len(runs)} run(s))")


if __name__ == "__main__":
    cli_main(main)
