"""T0 finetuning speed: packed-row fill rate, packed vs plain LM training step time at the same
shapes, and Adafactor vs AdamW optimizer step time.

    python bench/t0.py                                    # dim 288, 6 layers, rows of 256, batch 8, CPU
    python bench/t0.py --dim=64 --n_layers=2 --steps=3    # seconds on a laptop
    python bench/t0.py --device=cuda --dtype=bfloat16 --batch_size=64
    python bench/t0.py --mixture=data/t0/mixture.json --tokenizer_model=tokenizers/tok8192.model

Data: the training sources of --mixture, or (default) the built-in multitask set (t0_demo.py)
written to a temp folder, tokenised with --tokenizer_model (default: the released 8192-piece
tokenizer, which ships as tokenizers/tok8192.model). Fill rate = non-pad fraction of the first 1000 packed rows, for both mixing modes. Step time = forward + backward + AdamW step of one micro-batch, median of
--steps timed steps after warm-up: "plain" is train.py's batch (causal SDPA, no mask), "packed"
is a T0Batches batch (explicit block-diagonal bool mask, per-example positions, loss weights).
Target: packed <= 1.15x plain. The optimizer comparison reuses bench/optimizers.py's timer.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from optimizers import state_bytes, sync, time_steps  # noqa: E402  (bench/optimizers.py)

from model import ModelArgs, Transformer  # noqa: E402
from tinylab import optim  # noqa: E402
from tinylab.optim import apply_optimizer_preset  # noqa: E402
from tinylab.schema import FINETUNE_T0  # noqa: E402
from tinylab.t0_data import (  # noqa: E402
    ExampleEncoder,
    PackedStream,
    T0Batches,
    load_mixture,
    read_records,
    tokenize_rows,
)
from tinylab.tokenizer import Tokenizer  # noqa: E402


def load_examples(args, row_len):
    if not os.path.isfile(args.tokenizer_model):
        sys.exit(f"error: tokenizer {args.tokenizer_model} not found; make it with python tinystories.py "
                 f"train_vocab --vocab_size=8192 or pass --tokenizer_model=PATH")
    tok = Tokenizer(args.tokenizer_model)
    if args.mixture:
        sources, _ = load_mixture(args.mixture)
    else:
        from tinylab.t0_demo import write_demo_data
        folder = tempfile.mkdtemp(prefix="bench_t0_")
        write_demo_data(folder, n_train=400, n_valid=10)
        sources, _ = load_mixture(os.path.join(folder, "mixture.json"))
    enc = ExampleEncoder(tok)
    examples = [tokenize_rows(s.name, read_records(s), enc, row_len) for s in sources]
    return tok, examples, [s.weight for s in sources]


def train_step(model, opt, batch, device):
    sync(device)
    t0 = time.perf_counter()
    batch.pop("loss_scale", None)
    model(**batch, return_logits=False)  # as the trainer: fused head + loss
    model.last_loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync(device)
    return time.perf_counter() - t0


def compare_train_steps(setups, steps, warmup, device):
    """Median ms/step of each (model, opt, make_batch), timed in alternation so that a busy
    machine slows every variant alike."""
    times = [[] for _ in setups]
    for k in range(warmup + steps):
        for t, (model, opt, make_batch) in zip(times, setups):
            dt = train_step(model, opt, make_batch(), device)
            if k >= warmup:
                t.append(dt)
    return [statistics.median(t) * 1e3 for t in times]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, default=288)
    ap.add_argument("--n_layers", type=int, default=6)
    ap.add_argument("--n_heads", type=int, default=6)
    ap.add_argument("--seq_len", type=int, default=256, help="row length L (rows hold L + 1 tokens)")
    ap.add_argument("--batch_size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prefixlm", action="store_true")
    ap.add_argument("--mixture", default="")
    ap.add_argument("--tokenizer_model", default=os.path.join(ROOT, "tokenizers", "tok8192.model"),
                    help="a sentencepiece model (default: the study's released tok8192, shipped in tokenizers/)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    row_len = args.seq_len + 1

    tok, examples, weights = load_examples(args, row_len)
    lengths = [e.lengths() for e in examples]
    print(f"data: {sum(len(e) for e in examples)} examples from {len(examples)} sources, "
          f"mean length {sum(int(l.sum()) for l in lengths) / sum(len(l) for l in lengths):.1f} tokens", flush=True)
    for mixing in ("example", "row"):
        stream = PackedStream(lengths, weights, row_len, seed=0, mixing=mixing)
        stream.next_rows(1000)
        print(f"  fill rate, rows of {row_len} tokens, mixing={mixing}: {stream.fill_rate():.4f}")

    torch.manual_seed(0)
    margs = ModelArgs(dim=args.dim, n_layers=args.n_layers, n_heads=args.n_heads, vocab_size=tok.vocab_size,
                      multiple_of=32, max_seq_len=args.seq_len)
    autocast = torch.amp.autocast(device_type=args.device.split(":")[0], dtype=torch.bfloat16) \
        if args.dtype == "bfloat16" else torch.autocast("cpu", enabled=False)
    B, L = args.batch_size, args.seq_len
    stream = PackedStream(lengths, weights, row_len, seed=0)
    packed = T0Batches(stream, examples, B, 1, 0, 1, "token", args.prefixlm, args.device)
    gen = torch.Generator().manual_seed(0)

    def plain():
        x = torch.randint(0, tok.vocab_size, (B, L + 1), generator=gen)
        return {"tokens": x[:, :-1].to(args.device), "targets": x[:, 1:].to(args.device)}

    print(f"step time (forward + backward + AdamW), batch {B} x {L}, dim {args.dim}, {args.n_layers} layers, "
          f"vocab {tok.vocab_size}, {args.device} {args.dtype}:", flush=True)
    names = ["plain LM", "packed T0" + (" prefix-LM" if args.prefixlm else "")]
    setups = []
    for make in (plain, lambda: next(packed)):
        model = Transformer(margs).to(args.device)
        setups.append((model, optim.build_optimizer(model, {**FINETUNE_T0.defaults(), "learning_rate": 1e-4, "weight_decay": 0.0}), make))
    with autocast:
        ms = compare_train_steps(setups, args.steps, args.warmup, args.device)
    for name, t in zip(names, ms):
        print(f"  {name:24s} {t:9.2f} ms/step  {B * L / t * 1e3:12,.0f} tokens/s", flush=True)
    print(f"  packed / plain time per step: {ms[1] / ms[0]:.3f} (target <= 1.15)")

    print("optimizer step alone (bench/optimizers.py's timer):")
    base = {**FINETUNE_T0.defaults(), "learning_rate": 1e-4, "weight_decay": 0.0, "optimizer": "adamw", "adafactor_preset": ""}
    for name, cfg in (("AdamW", base), ("Adafactor (t0 preset)", apply_optimizer_preset({**base, "adafactor_preset": "t0"}))):
        model = Transformer(margs).to(args.device)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        opt = optim.build_optimizer(model, cfg)
        step_ms = time_steps(opt, args.device, args.steps, args.warmup)
        print(f"  {name:24s} {step_ms:9.2f} ms/step  state {state_bytes(opt) / 2**20:8.2f} MiB")


if __name__ == "__main__":
    main()
