"""The output head + cross-entropy alone: the plain head (F.linear + F.cross_entropy, what
`model(x, y)` computes) against the fused one (tinylab.nn.fused_head.linear_cross_entropy, what the training
loop uses), eager and under torch.compile; time per forward + backward and peak memory.

    python bench/head.py [--tokens=4096] [--vocab=32000] [--dim=288] [--iters=5] [--repeats=1]
                         [--dtype=float32|bfloat16] [--modes=plain,fused,plain_compiled,fused_compiled]

Each mode runs in a fresh process (so one mode's memory peak cannot hide another's), the modes
alternate when --repeats > 1, and every run is printed. Peak memory: torch.cuda.max_memory_allocated
on CUDA; on the CPU the process's peak RSS (getrusage ru_maxrss) minus its RSS just before the
first step (inputs and weights already allocated). bfloat16 means autocast with fp32 weights.
The first (compiling) step is not timed.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.measure import peak_rss_mib, rss_mib  # noqa: E402
from tinylab.nn.fused_head import linear_cross_entropy  # noqa: E402

MODES = ("plain", "fused", "plain_compiled", "fused_compiled")


def plain_head(h, weight, targets):
    logits = F.linear(h, weight)
    return F.cross_entropy(logits.float(), targets, ignore_index=-1)


def child(args, mode):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    h = torch.randn(args.tokens, args.dim, generator=g).to(device).requires_grad_()
    weight = (torch.randn(args.vocab, args.dim, generator=g) * 0.02).to(device).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=g).to(device)
    fn = linear_cross_entropy if mode.startswith("fused") else plain_head
    if mode.endswith("compiled"):
        fn = torch.compile(fn, fullgraph=True)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")

    def step():
        h.grad = weight.grad = None
        with autocast:
            loss = fn(h, weight, targets)
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return loss.item()

    base = rss_mib()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    loss = step()  # compiles, when compiled
    times = []
    for _ in range(args.iters):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else peak_rss_mib()
    print(json.dumps({"ms": statistics.median(times) * 1000, "peak_mib": peak - base, "loss": loss,
                      "device": device, "threads": torch.get_num_threads()}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dim", type=int, default=288)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    modes = args.modes.split(",")
    if any(m not in MODES for m in modes):
        sys.exit(f"error: --modes takes a comma-separated list of {', '.join(MODES)}")
    if args.child:
        return child(args, args.child)
    logits_mib = args.tokens * args.vocab * 4 / 2**20
    print(f"head: {args.tokens} tokens x vocab {args.vocab}, dim {args.dim}, {args.dtype}; one fp32 "
          f"(tokens, vocab) tensor is {logits_mib:.0f} MiB")
    print(f"{'mode':>16}  {'ms/step':>8}  {'peak MiB':>8}  loss")
    for _ in range(max(1, args.repeats)):
        for mode in modes:
            cmd = [sys.executable, os.path.abspath(__file__), f"--child={mode}"] + [
                f"--{k}={getattr(args, k)}" for k in ("tokens", "vocab", "dim", "iters", "dtype")]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode:
                sys.exit(f"error: mode {mode} failed:\n{proc.stderr[-2000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{mode:>16}  {r['ms']:8.0f}  {r['peak_mib']:8.0f}  {r['loss']:.6f}", flush=True)


if __name__ == "__main__":
    main()
