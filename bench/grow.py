"""How long growth takes: width and depth doubling of a whole training state (weights + AdamW
state), by default of the 91M-parameter model of configs/base91M.py.

    python bench/grow.py                                    # dim 768, 12 layers, vocab 8192
    python bench/grow.py --dim=64 --n_layers=2 --vocab_size=512   # seconds on anything
    python bench/grow.py --save                             # also time the atomic checkpoint write

The training state is built in memory (random weights, AdamW moments filled as after training),
then growth/state.grow_checkpoint runs on it, as `grow.py` and in-run growth do; the time excludes loading
the input checkpoint. Prints seconds per registered operator and the parameter counts.
"""
import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from model import ModelArgs, Transformer  # noqa: E402
from tinylab.core.checkpoint import model_args_dict, save_checkpoint  # noqa: E402
from tinylab.growth.ops import OPERATORS  # noqa: E402
from tinylab.growth.ops.base import meta_model  # noqa: E402
from tinylab.growth.options import GrowthOptions  # noqa: E402
from tinylab.growth.state import grow_checkpoint  # noqa: E402
from tinylab.schema import TRAIN  # noqa: E402
from tinylab.training.optim import build_optimizer, optimizer_param_names  # noqa: E402
from tinylab.training.options import OptimizerOptions  # noqa: E402


def training_state(model):
    """A checkpoint dict with AdamW moments of the right shapes and a step count of 1000."""
    cfg = {**TRAIN.defaults(), "learning_rate": 5e-4, "weight_decay": 0.1, "optimizer": "adamw"}
    opt = build_optimizer(model, OptimizerOptions.from_config(cfg))
    for p in model.parameters():
        opt.state[p] = {"step": torch.tensor(1000.0), "exp_avg": torch.randn_like(p) * 1e-3,
                        "exp_avg_sq": torch.rand_like(p) * 1e-6}
    return {"model": model.state_dict(), "model_args": model_args_dict(model), "optimizer": opt.state_dict(),
            "optimizer_name": "adamw", "param_names": optimizer_param_names(opt), "param_overrides": None,
            "lr_rewarmup": None, "iter_num": 1000, "config": cfg}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--n_layers", type=int, default=12)
    ap.add_argument("--n_heads", type=int, default=0, help="0: dim // 64")
    ap.add_argument("--vocab_size", type=int, default=8192)
    ap.add_argument("--multiple_of", type=int, default=64)
    ap.add_argument("--save", action="store_true", help="also time writing the grown checkpoint")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=args.dim, n_layers=args.n_layers, n_heads=args.n_heads or max(1, args.dim // 64),
                                  vocab_size=args.vocab_size, multiple_of=args.multiple_of, max_seq_len=256))
    state = training_state(model)
    print(f"model: {model.num_params() / 1e6:.1f}M parameters (dim {args.dim}, {args.n_layers} layers), "
          f"torch threads {torch.get_num_threads()}")
    for doubling in OPERATORS.names():
        t0 = time.perf_counter()
        grown = grow_checkpoint(state, GrowthOptions(doubling), state["config"])
        dt = time.perf_counter() - t0
        n = meta_model(ModelArgs.from_dict(grown["model_args"])).num_params()
        line = f"{doubling:8s} -> {n / 1e6:.1f}M parameters: grow {dt:.2f} s (weights + AdamW state)"
        if args.save:
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                save_checkpoint(grown, os.path.join(d, "ckpt.pt"))
                line += f", save {time.perf_counter() - t0:.2f} s"
        print(line)
        del grown


if __name__ == "__main__":
    main()
