"""Peak memory and step time of training with and without activation checkpointing.

    python bench/memory.py [configs/base8M.py] [--key=value ...] [--iters=3] [--warmup=1] [--repeats=1]

Defaults: the config's shapes at T = 1024 (max_seq_len=1024), batch 8, fp32 on the CPU (the
device's default dtype on CUDA). Each measurement runs bench/train.py's timing of the real
training loop (trainer.Trainer on random tokens) in a fresh process, so that one setting's
memory peak cannot hide another's. Peak memory is, on CUDA, torch.cuda.max_memory_allocated
(tensors only); on the CPU, the process's peak resident set size (getrusage ru_maxrss: tensors,
allocator slack, the Python process and torch's libraries), next to the same process's RSS once
the model was built, so the difference is what training added (optimizer state, activations,
gradients). Settings alternate when --repeats > 1; every run is printed.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.measure import peak_rss_mib, rss_mib  # noqa: E402
from tinylab.schema import TRAIN  # noqa: E402


def bench_train():
    # bench/train.py's loop timing; loaded by path, since `train` is the root script's name
    spec = importlib.util.spec_from_file_location("bench_train", os.path.join(ROOT, "bench", "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child(cfg, iters, warmup):
    """One measurement in this process: a JSON line with ms/iter and memory."""
    bench = bench_train()
    built = {}
    init_model = bench.init_model

    def init_and_note(*a, **k):  # the RSS once the model exists, before any training step
        out = init_model(*a, **k)
        built["rss"] = rss_mib()
        return out

    bench.init_model = init_and_note
    cuda = cfg["device"].startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    ms, model, run, _ = bench.bench_ours(cfg, iters, warmup)
    if cuda:
        peak, base = torch.cuda.max_memory_allocated() / 2**20, None
    else:
        peak, base = peak_rss_mib(), built.get("rss")
    print(json.dumps({"ms": ms, "peak_mib": peak, "built_mib": base, "params": model.num_params(),
                      "device": run.device, "dtype": run.dtype, "threads": torch.get_num_threads()}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default="configs/base8M.py")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1, help="alternate the two settings this many times")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args, overrides = p.parse_known_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = {"device": device, "max_seq_len": 1024, "batch_size": 8, "gradient_accumulation_steps": 1,
            "compile": False, "wandb_log": False}
    cfg = TRAIN.parse([args.config] + [f"--{k}={v}" for k, v in base.items()] + overrides)
    if args.child:
        return child(dict(cfg, activation_checkpointing=args.child == "on"), args.iters, args.warmup)
    results = {False: [], True: []}
    for _ in range(max(1, args.repeats)):
        for on in (False, True):
            cmd = [sys.executable, os.path.abspath(__file__), args.config, f"--child={'on' if on else 'off'}",
                   f"--iters={args.iters}", f"--warmup={args.warmup}"] + overrides
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode:
                sys.exit(f"error: the measurement failed:\n{proc.stderr[-2000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            results[on].append(r)
    r = results[False][0]
    print(f"config {args.config}: {r['params'] / 1e6:.2f}M params, batch {cfg['batch_size']} x T={cfg['max_seq_len']}, "
          f"{r['device']} {r['dtype']}, compile={cfg['compile']}, torch threads {r['threads']}")
    what = "torch.cuda.max_memory_allocated" if r["built_mib"] is None else "peak RSS (after the model was built)"
    print(f"{'activation_checkpointing':>24}  {'ms/iter':>8}  peak MiB: {what}")
    for on in (False, True):
        for r in results[on]:
            extra = "" if r["built_mib"] is None else f" ({r['built_mib']:.0f}; +{r['peak_mib'] - r['built_mib']:.0f})"
            print(f"{str(on):>24}  {r['ms']:8.0f}  {r['peak_mib']:.0f}{extra}")


if __name__ == "__main__":
    main()
