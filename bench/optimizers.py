"""Optimizer step time: Adafactor (adafactor.py) vs AdamW (optim.py) on a config-sized model.

    python bench/optimizers.py                       # dim 288, 6 layers, vocab 8192 (8.3M params)
    python bench/optimizers.py --dim=64 --n_layers=2 --vocab_size=512 --steps=5   # seconds on CPU
    python bench/optimizers.py --device=cuda --param_dtype=bfloat16

Times optimizer.step() alone (gradients are fixed random tensors, so no forward/backward), with
a device synchronize around the timed loop, and prints ms/step and the optimizer state size for
AdamW as build_optimizer makes it (fused on CUDA, foreach elsewhere) and Adafactor with the `t0`
preset, with a first moment (beta1=0.9), and with fp32 master weights when parameters are bf16.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from model import ModelArgs, Transformer  # noqa: E402
from tinylab.schema import TRAIN  # noqa: E402
from tinylab.training import optim  # noqa: E402
from tinylab.training.options import OptimizerOptions  # noqa: E402
from tinylab.training.presets import apply_optimizer_preset  # noqa: E402


def state_bytes(opt):
    return sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
               if torch.is_tensor(v))


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(opt, device, steps, warmup):
    for _ in range(warmup):
        opt.step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    sync(device)
    return (time.perf_counter() - t0) / steps * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=288)
    ap.add_argument("--n_layers", type=int, default=6)
    ap.add_argument("--n_heads", type=int, default=0, help="0: dim // 48 (6 for dim 288)")
    ap.add_argument("--vocab_size", type=int, default=8192)
    ap.add_argument("--multiple_of", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--param_dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()

    n_heads = args.n_heads or max(1, args.dim // 48)
    if args.dim % n_heads:
        ap.error(f"--dim={args.dim} is not divisible by --n_heads={n_heads}")
    torch.manual_seed(0)
    margs = ModelArgs(dim=args.dim, n_layers=args.n_layers, n_heads=n_heads,
                      vocab_size=args.vocab_size, multiple_of=args.multiple_of, max_seq_len=256)
    base = {**TRAIN.defaults(), "learning_rate": 5e-4, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
            "optimizer": "adamw", "adafactor_preset": ""}
    t0 = apply_optimizer_preset({**base, "adafactor_preset": "t0"})
    runs = [("adamw", base, {}),
            ("adafactor t0", t0, {}),
            ("adafactor t0 + beta1 0.9", {**t0, "adafactor_beta1": 0.9}, {})]
    if args.param_dtype == "bfloat16":
        runs.append(("adafactor t0 + master weights", t0, {"master_weights": True}))

    n_params = None
    print(f"device {args.device}, params {args.param_dtype}, dim {args.dim}, layers {args.n_layers}, "
          f"vocab {args.vocab_size}, {args.steps} timed steps after {args.warmup}", flush=True)
    for name, cfg, group_extra in runs:
        model = Transformer(margs).to(device=args.device, dtype=getattr(torch, args.param_dtype))
        n_params = sum(p.numel() for p in model.parameters())
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        opt = optim.build_optimizer(model, OptimizerOptions.from_config(cfg))
        for g in opt.param_groups:
            g.update(group_extra)
        ms = time_steps(opt, args.device, args.steps, args.warmup)
        print(f"  {name:32s} {ms:8.2f} ms/step   state {state_bytes(opt) / 2**20:8.2f} MiB", flush=True)
    print(f"  ({n_params / 1e6:.2f}M parameters, {n_params * 4 / 2**20:.1f} MiB in fp32)")


if __name__ == "__main__":
    main()
