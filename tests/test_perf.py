"""CPU speed settings (tinylab/core/perf.py) and bench/train.py's whole-program comparison with
llama2.c: that both programs get the same work (llama2.c's configurator accepts every value with
its default's type), and that the per-iteration lines of both are read; bench/generation.py's
whole-process runs."""
import ast
import importlib.util
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, run_cli, run_main

from tinylab.core.perf import retain_freed_memory
from tinylab.schema import TRAIN


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_train", os.path.join(REPO, "bench", "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# a fresh process: the suite's earlier tests leave big freed blocks in this one's heap
REUSE_PROBE = """
import resource, sys, torch
from tinylab.core.perf import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
n = (64 << 20) // 4
x = torch.ones(n)
del x
before = faults()
x = torch.ones(n - (1 << 18))  # 63 MB: fits in the freed block (an aligned 64 MB might not)
print(faults() - before)
"""


def reuse_faults(mode):
    out = subprocess.run([sys.executable, "-c", REUSE_PROBE, mode], cwd=REPO, capture_output=True, text=True,
                         check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.slow
def test_retain_freed_memory_reuses_big_blocks():
    """With glibc's defaults a freed 64 MB tensor goes back to the kernel (over the 32 MB mmap
    threshold), so the next big tensor faults in every page again; after retain_freed_memory the
    freed block is reused: almost no page faults."""
    if not retain_freed_memory():
        pytest.skip("no glibc mallopt here")
    default, retained = reuse_faults("default"), reuse_faults("retain")
    assert default > 1000 and retained < default / 20, (default, retained)


# llama2.c's train.py globals that bench/train.py sets, with their defaults (verbatim from its
# train.py): its configurator.py asserts type(literal_eval(value)) == type(default)
LLAMA2C_DEFAULTS = dict(
    out_dir="out", eval_interval=2000, log_interval=1, eval_iters=100, eval_only=False, always_save_checkpoint=False,
    init_from="scratch", wandb_log=False, batch_size=128, max_seq_len=256, vocab_source="llama2", vocab_size=32000,
    dim=288, n_layers=6, n_heads=6, n_kv_heads=6, multiple_of=32, dropout=0.0, gradient_accumulation_steps=4,
    learning_rate=5e-4, max_iters=100000, weight_decay=1e-1, beta1=0.9, beta2=0.95, grad_clip=1.0, decay_lr=True,
    warmup_iters=1000, device="cuda", dtype="bfloat16", compile=True)


def llama2c_configurator(argv):
    """llama2.c's configurator.py on --key=value arguments, re-implemented verbatim."""
    config = dict(LLAMA2C_DEFAULTS)
    for arg in argv:
        assert arg.startswith("--")
        key, val = arg.split("=")
        key = key[2:]
        assert key in config, f"Unknown config key: {key}"
        try:
            attempt = ast.literal_eval(val)
        except (SyntaxError, ValueError):
            attempt = val
        assert type(attempt) is type(config[key]), (key, val)
        config[key] = attempt
    return config


@pytest.mark.parametrize("llama2", [True, False])
def test_programs_get_the_same_work(llama2, tmp_path):
    bench = load_bench()
    vocab = ["--vocab_source=llama2"] if llama2 else []
    argv = [os.path.join(REPO, "configs", "base8M.py"), "--device=cpu", "--dtype=float32", "--batch_size=8", *vocab]
    cfg = TRAIN.parse(argv)
    cfg["vocab_size"] = bench.dataset_vocab(cfg)[1]
    iters = 30
    ours, theirs = bench.program_commands(cfg, argv[0], argv[1:], iters, str(tmp_path / "data"), "/l2c",
                                          str(tmp_path / "l2c"), 0 if llama2 else 8192, cfg["compile"], 0)
    assert theirs[1] == "/l2c/train.py"
    l2c = llama2c_configurator(theirs[2:])
    mine = TRAIN.parse(ours[2:])
    for key in ("batch_size", "gradient_accumulation_steps", "max_seq_len", "dim", "n_layers", "n_heads", "n_kv_heads",
                "multiple_of", "dropout", "learning_rate", "weight_decay", "beta1", "beta2", "grad_clip", "warmup_iters",
                "decay_lr", "device", "dtype", "compile", "eval_iters"):
        assert l2c[key] == mine[key], key
    # llama2.c's train.py sets lr_decay_iters = max_iters before its configurator runs: 100000
    assert mine["lr_decay_iters"] == LLAMA2C_DEFAULTS["max_iters"]
    assert (l2c["vocab_source"], l2c["vocab_size"]) == (("llama2", 32000) if llama2 else ("custom", 8192))
    assert cfg["vocab_size"] == (32000 if llama2 else 8192)
    # the same 30 iterations, two evaluations of one batch per split, one final checkpoint each
    assert mine["max_iters"] == iters and mine["eval_interval"] == iters and mine["eval_iters"] == 1
    assert mine["max_new_tokens"] == 0 and mine["export_bin"] and mine["log_interval"] == 1
    assert l2c["max_iters"] == l2c["eval_interval"] == iters - 1 and l2c["always_save_checkpoint"]
    assert mine["device"] == "cpu" and mine["dtype"] == "float32" and mine["batch_size"] == 8


def test_iteration_lines_of_both_programs(lab_corpus, tmp_path):
    """ITER_LINE reads every iteration of our train.py's output, and llama2.c's line (its format
    string, verbatim)."""
    bench = load_bench()
    args = dict(data_cache_dir=lab_corpus.cache_dir, vocab_size=1024, out_dir=tmp_path / "run", dim=32, n_layers=2,
                n_heads=4, n_kv_heads=2, multiple_of=16, max_seq_len=64, batch_size=2, gradient_accumulation_steps=1,
                max_iters=4, warmup_iters=2, eval_interval=4, eval_iters=1, log_interval=1, max_new_tokens=0, device="cpu",
                dtype="float32", export_bin=False)
    out = run_main("train.py", [f"--{k}={v}" for k, v in args.items()], check=True).stdout
    found = bench.ITER_LINE.findall(out)
    assert [int(it) for it, _ in found] == [0, 1, 2, 3], out
    assert all(float(ms) > 0 for _, ms in found)
    iter_num, lossf, lr, dt, running_mfu = 7, 2.5, 1e-4, 0.123456, -1.0
    line = f"{iter_num} | loss {lossf:.4f} | lr {lr:e} | {dt*1000:.2f}ms | mfu {running_mfu*100:.2f}%"
    assert bench.ITER_LINE.findall("step 0: train loss 1\n" + line + "\n") == [("7", "123.46")]


def test_generation_bench_runs_in_abba_order():
    """bench/generation.py's run order: the two settings alternate ABBA (generations first in even
    repeats), --old's setting after them in every repeat."""
    spec = importlib.util.spec_from_file_location("bench_generation", os.path.join(REPO, "bench", "generation.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    a, b, old = ("default generation", [], False), ("max_new_tokens=0", ["--max_new_tokens=0"], False), ("old", [], True)
    assert list(module.run_order([a, b], 2)) == [(0, a), (0, b), (1, b), (1, a)]
    assert list(module.run_order([a, b, old], 3)) == [(0, a), (0, b), (0, old), (1, b), (1, a), (1, old),
                                                      (2, a), (2, b), (2, old)]


def test_decoding_bench_times_both_products_in_abba_order():
    """bench/decoding.py (2 rows, 3 new tokens): every call of both settings printed, the medians'
    ratio."""
    out = run_cli(["bench/decoding.py", "--rows=2,3", "--repeats=2", "--new=3", "--few_rows=2"], check=True).stdout
    rows = re.findall(r"^rows +(\d+): F\.linear ([\d.]+) ([\d.]+) \(median [\d.]+\); W @ x\^T ([\d.]+) ([\d.]+) "
                      r"\(median [\d.]+\); ratio ([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["2", "3"], out
    assert all(float(t) > 0 for r in rows for t in r[1:]), out


@pytest.mark.slow
def test_generation_bench_times_whole_runs():
    """bench/generation.py runs each setting as a process of its own (a tiny model here, one pair
    of runs; their order: test_generation_bench_runs_in_abba_order): the run with generations
    reports its generated tokens and the one without reports none, and the summary prints the pair."""
    tiny = ["--max_iters=2", "--dim=32", "--n_layers=1", "--n_heads=2", "--n_kv_heads=2", "--max_new_tokens=8"]
    out = run_cli(["bench/generation.py", "--repeats=1", *tiny], check=True).stdout
    runs = re.findall(r"^\s+(\d) (default generation|max_new_tokens=0)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)", out, re.M)
    assert [(r, name) for r, name, *_ in runs] == [("0", "default generation"), ("0", "max_new_tokens=0")], out
    for _, name, wall, cpu, gen, tokens in runs:
        assert float(wall) > 0 and float(cpu) > 0
        # 2 evaluations x 16 prompts x 8 tokens at most (a row ends at BOS)
        assert (0 < int(tokens) <= 2 * 16 * 8) if name == "default generation" else (int(tokens) == 0 and float(gen) == 0)
    summary = re.search(r"vs the run without generations ([\d.]+) \(median", out)
    assert summary, out
    assert "train.py overrides --max_iters=2" in out


@pytest.mark.slow
def test_generation_bench_reports_a_failed_run():
    out = run_cli(["bench/generation.py", "--repeats=1", "--max_iters=2", "--dim=30", "--n_heads=4"])
    assert out.returncode != 0
    assert "run failed" in out.stderr and "error:" in out.stderr, out.stderr[-2000:]
