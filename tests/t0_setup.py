"""Shared by the finetune_t0 end-to-end tests: a small built-in multitask set and a tiny random
base checkpoint that names the released 8192-piece tokenizer."""
import json
import os

import torch
from conftest import TOK8192

from model import ModelArgs, Transformer
from tinylab import checkpoint as ckpt_lib


def make_t0_setup(root):
    """root/demo/mixture.json (+ task files) and root/base/ckpt.pt; returns (mixture, base_dir)."""
    from tinylab.t0_demo import write_demo_data
    demo, base = os.path.join(root, "demo"), os.path.join(root, "base")
    write_demo_data(demo, seed=0, n_train=40, n_valid=10)
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=8192, multiple_of=16,
                                  max_seq_len=128))
    ckpt_lib.save_checkpoint({"model": model.state_dict(), "model_args": ckpt_lib.model_args_dict(model), "iter_num": 0,
                              "config": {"tokenizer_model": TOK8192, "vocab_size": 8192}}, os.path.join(base, "ckpt.pt"))
    return os.path.join(demo, "mixture.json"), base


def t0_args(mixture, base, out_dir, **over):
    cfg = dict(mixture=mixture, model_dir=base, out_dir=out_dir, batch_size=4, gradient_accumulation_steps=2,
               learning_rate=3e-3, max_iters=12, eval_interval=6, eval_iters=1, log_interval=1, rank_eval_examples=6,
               device="cpu", dtype="float32")
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()]


def read_metrics(out_dir):
    return [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]


def train_losses(out_dir):
    return {r["iter"]: r["loss/train"] for r in read_metrics(out_dir) if r["kind"] == "train"}
