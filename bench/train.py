"""Training throughput of a config on this device: tokens/s, ms/iter and MFU.

    python bench/train.py configs/base8M.py [--key=value ...] [--iters=20] [--warmup=3]
    python bench/train.py configs/base8M.py --llama2c_dir=PATH/TO/llama2.c   # also time llama2.c

It runs the real training loop (trainer.Trainer, the one train.py uses) for a few iterations on
random tokens with the config's shapes (no dataset needed; evaluation and checkpoints off), and
reports the median of the timed iterations. With --llama2c_dir it also times llama2.c's model.py
and its configure_optimizers, driven by llama2.c's train.py inner loop (micro-steps, clip,
GradScaler, zero_grad), on the same shapes and the same random batches, for a like-for-like
comparison. The CPU default compares fp32 without torch.compile, as llama2.c's train.py would run.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tinylab.schema import TRAIN  # noqa: E402
from tinylab.trainer import Run, Trainer, init_model, seed_everything  # noqa: E402


class RandomBatches:
    """Random token batches on the device: isolates the model/optimizer loop from data I/O."""

    def __init__(self, cfg, device, seed=0):
        g = torch.Generator().manual_seed(seed)
        shape = (cfg["batch_size"], cfg["max_seq_len"] + 1)
        windows = [torch.randint(0, cfg["vocab_size"], shape, generator=g) for _ in range(4)]
        self.pool = [(w[:, :-1].contiguous().to(device), w[:, 1:].contiguous().to(device)) for w in windows]
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self):
        x, y = self.pool[self.i % len(self.pool)]
        self.i += 1
        return x, y

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


def bench_ours(cfg, iters, warmup):
    run = Run(cfg)
    seed_everything(cfg["seed"])
    model, _ = init_model(cfg, run)
    with tempfile.TemporaryDirectory() as out:
        cfg = dict(cfg, out_dir=out, max_iters=warmup + iters, eval_interval=10**9, checkpoint_interval=10**9,
                   log_interval=1, init_from="scratch", wandb_log=False)
        trainer = Trainer(cfg, run, model, RandomBatches(cfg, run.device), evaluate=lambda *a: {})
        trainer.save = lambda *a, **k: None  # time training only
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.fit()
        from tinylab.metrics import read_metrics
        rows = [r for r in read_metrics(os.path.join(out, "metrics.jsonl")) if r["kind"] == "train"]
    ms = statistics.median(r["ms_per_iter"] for r in rows[warmup:])
    mfu = [r["mfu"] for r in rows[warmup:] if "mfu" in r]
    return ms, model, run, (statistics.median(mfu) if mfu else None)


def bench_llama2c(cfg, iters, warmup, llama2c_dir, device):
    """llama2.c's model + optimizer driven by its train.py inner loop, on the same batches."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("llama2c_model", os.path.join(llama2c_dir, "model.py"))
    l2c = importlib.util.module_from_spec(spec)  # not `import model`: that name is ours
    spec.loader.exec_module(l2c)
    torch.manual_seed(cfg["seed"])
    args = l2c.ModelArgs(dim=cfg["dim"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"], n_kv_heads=cfg["n_kv_heads"],
                         vocab_size=cfg["vocab_size"], multiple_of=cfg["multiple_of"], max_seq_len=cfg["max_seq_len"],
                         dropout=cfg["dropout"])
    model = l2c.Transformer(args).to(device)
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]), "cpu" if device == "cpu" else "cuda")
    scaler = torch.amp.GradScaler("cpu" if device == "cpu" else "cuda", enabled=False)
    batches = RandomBatches(cfg, device)
    accum = cfg["gradient_accumulation_steps"]
    X, Y = next(batches)
    times = []
    t0 = time.time()
    for it in range(warmup + iters):
        for micro_step in range(accum):
            model(X, Y)
            loss = model.last_loss / accum
            X, Y = next(batches)
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # llama2.c logs every iteration (log_interval=1): one sync per step
        t1 = time.time()
        times.append(t1 - t0)
        t0 = t1
    return statistics.median(times[warmup:]) * 1000


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default="configs/base8M.py")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--llama2c_dir", default="", help="a llama2.c checkout: also time its model.py")
    p.add_argument("--repeats", type=int, default=2, help="alternate ours / llama2.c this many times; report the best")
    args, overrides = p.parse_known_args()
    device = "cpu" if not torch.cuda.is_available() else "cuda"
    base = {"device": device, "compile": False} if device == "cpu" else {}
    cfg = TRAIN.parse([args.config] + [f"--{k}={v}" for k, v in base.items()] + overrides)
    # CPU timings drift by +-20% between runs on shared machines: alternate the two programs and
    # keep each one's best median, so a slow phase does not decide the comparison
    best, best2 = None, None
    for _ in range(max(1, args.repeats)):
        ms, model, run, mfu = bench_ours(cfg, args.iters, args.warmup)
        best = ms if best is None else min(best, ms)
        if args.llama2c_dir:
            ms2 = bench_llama2c(cfg, args.iters, args.warmup, args.llama2c_dir, run.device)
            best2 = ms2 if best2 is None else min(best2, ms2)
    ms, ms2 = best, best2
    tokens = cfg["batch_size"] * cfg["max_seq_len"] * cfg["gradient_accumulation_steps"]
    print(f"config {args.config}: {model.num_params() / 1e6:.2f}M params, dim {cfg['dim']}, {cfg['n_layers']} layers, "
          f"batch {cfg['batch_size']}x{cfg['gradient_accumulation_steps']}, T={cfg['max_seq_len']}, "
          f"{run.device} {run.dtype}, compile={cfg['compile']}, torch threads {torch.get_num_threads()}")
    mfu_s = f", MFU {mfu * 100:.1f}%" if mfu is not None else " (MFU: device peak unknown; pass --peak_flops=...)"
    print(f"tinystories-lab: {ms:.1f} ms/iter, {tokens / ms * 1000:,.0f} tokens/s{mfu_s}")
    if args.llama2c_dir:
        print(f"llama2.c      : {ms2:.1f} ms/iter, {tokens / ms2 * 1000:,.0f} tokens/s  (ours is {ms2 / ms:.2f}x its speed)")


if __name__ == "__main__":
    main()
