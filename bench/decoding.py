"""Generation's decoding steps with the model's projections as they are (tinylab/nn/linear.py:
W @ x^T for at most FEW_ROWS rows without autograd) against plain F.linear (x @ W^T, what
nn.Linear computes), side by side in one process.

    python bench/decoding.py [--rows=4,16,32,64] [--threads=N] [--repeats=4] [--new=350] [--few_rows=N]

The model is configs/base8M.py's shape (dim 288, 6 layers, vocab 8192, max_seq_len 256) with
random weights in fp32; each batch is `rows` left-padded prompts of 25-69 random tokens, sampled
for --new tokens (past max_seq_len: the windows restart, so refills are timed too). The two
settings alternate in ABBA order; every generate call is printed, then the medians and their
ratio. --threads sets torch's thread count (0: its default); --few_rows=N moves the threshold for
this run (to time W @ x^T at more rows than the module gives it).
"""
import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from model import ModelArgs, Transformer  # noqa: E402
from tinylab.nn import linear  # noqa: E402


def prompts(rows, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(25, 70, (rows,), generator=g).tolist()
    width = max(lengths)
    idx = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        idx[i, width - n:] = torch.randint(2, 8192, (n,), generator=g)
        mask[i, width - n:] = True
    return idx, mask


def timed_generate(model, idx, mask, new, few_rows):
    linear.FEW_ROWS = few_rows
    t = time.perf_counter()
    model.generate(idx, new, prompt_mask=mask, generator=torch.Generator().manual_seed(0))
    return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="4,16,32,64", help="batch sizes (comma-separated)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=4, help="generate calls per setting (ABBA order)")
    p.add_argument("--new", type=int, default=350, help="tokens generated per call")
    p.add_argument("--few_rows", type=int, default=linear.FEW_ROWS, help="W @ x^T up to this many rows")
    args = p.parse_args()
    if args.repeats < 1 or args.new < 1 or args.few_rows < 1:
        raise SystemExit("error: --repeats, --new and --few_rows must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=288, n_layers=6, n_heads=6, vocab_size=8192, multiple_of=32,
                                  max_seq_len=256)).eval()
    settings = {"F.linear": 0, "W @ x^T": args.few_rows}
    print(f"8M shape, fp32, {args.new} new tokens per row, {torch.get_num_threads()} threads; seconds per generate call")
    for rows in [int(r) for r in args.rows.split(",")]:
        idx, mask = prompts(rows, seed=rows)
        timed_generate(model, idx[:, -8:], None, 20, settings["W @ x^T"])  # warm-up: unpadded prompts
        times = {name: [] for name in settings}
        for r in range(args.repeats):
            for name in (list(settings) if r % 2 == 0 else list(settings)[::-1]):
                times[name].append(timed_generate(model, idx, mask, args.new, settings[name]))
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"rows {rows:3d}: " + "; ".join(f"{name} " + " ".join(f"{t:.2f}" for t in times[name])
                                              + f" (median {med[name]:.2f})" for name in settings)
              + f"; ratio {med['W @ x^T'] / med['F.linear']:.2f}", flush=True)


if __name__ == "__main__":
    main()
