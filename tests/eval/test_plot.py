"""plot.py: curves from metrics.jsonl logs (and sweep summaries) into a PNG."""
import json
import struct
import sys

from conftest import assert_one_line_error, run_main

from tinylab.eval import plotting as plot


def plot_cli(*argv):
    return run_main("plot.py", list(argv))


def write_log(path, scale=1.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for it in range(0, 50, 5):
        rows.append({"iter": it, "kind": "train", "loss/train": scale * (5 - it / 20), "lr": 1e-3, "tokens_per_s": 1000.0 + it})
        if it % 10 == 0:
            rows.append({"iter": it, "kind": "eval", "loss/test": scale * (5.5 - it / 25), "loss/filter-Twist": 6.0,
                         "gen_feature_score": it / 50, "mfu": "nan"})
    rows.append({"iter": 45, "kind": "table", "generations/id": [{"prefix": "Once", "generation": "upon"}]})
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.write('{"iter": 50, "loss/tr')  # a run killed mid-write leaves a torn last line
    return path


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_png_from_small_logs(tmp_path):
    a = write_log(tmp_path / "run_a" / "metrics.jsonl")
    write_log(tmp_path / "run_b" / "metrics.jsonl", scale=0.5)
    out = tmp_path / "figs" / "curves.png"
    proc = plot_cli(str(a), str(tmp_path / "run_b"), "--metrics=loss/test,gen_feature_score,loss/train", f"--out={out}")
    assert proc.returncode == 0, proc.stderr
    width, height = png_size(out)
    assert width == 800 and height == 900  # 8 x (3 per metric) inches at 100 dpi
    # without --metrics: every numeric metric (mfu is "nan" everywhere, generations are tables)
    proc = plot_cli(str(a), f"--out={tmp_path / 'all.png'}")
    assert proc.returncode == 0, proc.stderr
    assert "6 metric(s)" in proc.stdout and png_size(tmp_path / "all.png")[1] == 1800


def test_series_skip_non_numeric_values(tmp_path):
    records = plot.read_metrics(write_log(tmp_path / "m.jsonl"))
    xs, ys = plot.series(records, "iter", "loss/test")
    assert xs == [0, 10, 20, 30, 40] and ys == [5.5, 5.1, 4.7, 4.3, 3.9]
    assert plot.series(records, "iter", "mfu") == ([], [])


def test_sweep_summary_expands_to_its_runs(tmp_path):
    results = []
    for i, lr in enumerate([1e-3, 1e-4]):
        write_log(tmp_path / f"run-{i}" / "metrics.jsonl")
        results.append({"run": f"run-{i:03d}", "params": {"learning_rate": lr, "wandb_log": True},
                        "out_dir": str(tmp_path / f"run-{i}"), "exit_code": 0})
    results.append(dict(results[1], exit_code=0))  # a re-run replaces the earlier record
    summary = tmp_path / "results.jsonl"
    summary.write_text("".join(json.dumps(r) + "\n" for r in results))
    runs = plot.load_runs([str(summary)])
    assert [label for label, _ in runs] == ["learning_rate=0.001", "learning_rate=0.0001"]
    proc = plot_cli(str(summary), "--metrics=loss/test", f"--out={tmp_path / 's.png'}")
    assert proc.returncode == 0, proc.stderr
    assert "2 run(s)" in proc.stdout and png_size(tmp_path / "s.png")


def test_bad_input(tmp_path):
    log = write_log(tmp_path / "metrics.jsonl")
    out = tmp_path / "x.png"
    proc = plot_cli(str(log), "--metrics=loss/test,loss/nope", f"--out={out}")
    assert_one_line_error(proc, "loss/nope", "available: gen_feature_score")
    assert_one_line_error(plot_cli(str(tmp_path / "missing.jsonl"), f"--out={out}"), "missing.jsonl")
    assert not out.exists()


def test_missing_matplotlib_is_a_clear_message(tmp_path, monkeypatch):
    # a matplotlib that cannot be imported (None in sys.modules: `import matplotlib` raises
    # ImportError) stands in for the installed one
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    log = write_log(tmp_path / "metrics.jsonl")
    proc = plot_cli(str(log), f"--out={tmp_path / 'x.png'}")
    assert_one_line_error(proc, "needs matplotlib", "pip install matplotlib")
    assert not (tmp_path / "x.png").exists()
