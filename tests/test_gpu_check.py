"""bench/gpu_check.sh: the GPU check's CPU dry mode runs every section and prints the one table
(the real check needs CUDA; docs/gpu_check.md), and a failing row makes the script exit 1 after
all rows ran."""
import importlib.util
import os
import re
import subprocess
import types

import pytest
from conftest import REPO

ROWS = ["built-in corpus"] + [f"throughput {c}" for c in ("base8M", "base30M", "base91M") for _ in (0, 1)] + [
    "bf16 vs fp32", "fused AdamW", "fused head", "SDPA flash", "NCCL DDP", "FSDP2", "T0 packed", "generation", "total"]
NEEDS_CUDA = {"SDPA flash", "NCCL DDP", "FSDP2"}


def table(stdout):
    """The table's body rows as (check, setting, result, status, seconds) tuples."""
    lines = [line for line in stdout.splitlines() if line.startswith("| ")][1:]  # without the header
    return [tuple(cell.strip() for cell in line.strip("|").split(" | ")) for line in lines]


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(REPO, "bench", "gpu_check.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_dry_mode_runs_every_section(tmp_path):
    work = tmp_path / "work"
    proc = subprocess.run(["bash", os.path.join(REPO, "bench", "gpu_check.sh"), "--dry", f"--work_dir={work}"],
                          cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout
    rows = table(out)
    assert [r[0] for r in rows] == ROWS, out + proc.stderr[-3000:]
    for check, setting, result, status, seconds in rows:
        want = "skipped (no CUDA)" if check in NEEDS_CUDA else "ok"
        assert status == want, (check, result, proc.stderr[-3000:])
        float(seconds)
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert "GPU check: all rows ok" in out and "dry: tiny shapes on the CPU" in out
    assert not work.exists()  # removed after a passing run (kept with --keep or after a FAIL)
    by = {r[0]: r for r in rows}
    # the dry shapes, and the numbers each row measured
    assert [r[1].split(",")[0] for r in rows if r[0].startswith("throughput")] == ["T=32", "T=64"] * 3
    for r in rows:
        if r[0].startswith("throughput") or r[0] in ("NCCL DDP", "FSDP2", "T0 packed", "generation"):
            assert re.search(r"[\d,]+ tok/s", r[2]), r
    assert "fused=True" in by["fused AdamW"][2] and "_fused_adamw" in by["fused AdamW"][2]
    assert re.search(r"largest allocation [\d.]+ MiB vs \(N,V\) bf16 logits 64\.0 MiB", by["fused head"][2])
    assert "graph breaks 0" in by["fused head"][2]
    for name in ("NCCL DDP", "FSDP2"):  # run on gloo, compared with the single-process run
        assert "gloo" in by[name][2] and "max rel diff" in by[name][2], by[name]
    assert "the CPU flash kernel" in by["SDPA flash"][2]
    assert re.search(r"fp32 [\d.]+, bf16 [\d.]+ .*tolerance 2%", by["bf16 vs fp32"][2])


@pytest.mark.slow
def test_a_failing_row_fails_the_script_and_every_row_runs(tmp_path, monkeypatch, capsys):
    gc = load_gpu_check()
    ran = []

    def sections(c):
        c.section(2, "broken", "raises", lambda: 1 / 0)
        c.section(1, "below tolerance", "a check that does not hold",
                  lambda: (_ for _ in ()).throw(gc.CheckFailed("measured 3 > 2")))
        c.section(3, "fine", "runs after the failures", lambda: ran.append(1) or ("measured 1", "ok"))

    monkeypatch.setattr(gc, "run_all", sections)
    work = tmp_path / "work"
    assert gc.main(["--dry", f"--work_dir={work}"]) == 1
    out = capsys.readouterr().out
    assert [r[:4] for r in table(out)] == [
        ("below tolerance", "a check that does not hold", "CheckFailed: measured 3 > 2", "FAIL"),
        ("broken", "raises", "ZeroDivisionError: division by zero", "FAIL"),
        ("fine", "runs after the failures", "measured 1", "ok")]
    assert ran == [1] and "GPU check: FAILED" in out
    assert work.is_dir()  # kept for its logs
    # a second check into that folder is refused (it would be removed after a passing run)
    assert gc.main(["--dry", f"--work_dir={work}"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --work_dir={work} is not empty")


def test_no_cuda_means_dry_mode(tmp_path):
    gc = load_gpu_check()
    if gc.torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    c = gc.Checker(types.SimpleNamespace(dry=False, peak_flops=0.0, work_dir=str(tmp_path), keep=False))
    assert c.dry and c.device == "cpu" and c.plan is gc.DRY
