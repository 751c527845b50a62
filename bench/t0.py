"""T0 finetuning speed: packed-row fill rate, packed vs plain LM training step time at the same
shapes, and Adafactor vs AdamW optimizer step time.

    python bench/t0.py                                    # dim 288, 6 layers, rows of 256, batch 8, CPU
    python bench/t0.py --dim=64 --n_layers=2 --steps=3    # seconds on a laptop
    python bench/t0.py --device=cuda --dtype=bfloat16 --batch_size=64
    python bench/t0.py --mixture=data/t0/mixture.json --tokenizer_model=tokenizers/tok8192.model
    python bench/t0.py --seq_lens=512,1024,2048 --dim=128 --n_layers=4 --n_heads=4 --steps=3   # attention table
    python bench/t0.py --packing_only                     # fill rates and packer speed only

Data: the training sources of --mixture, or (default) the built-in multitask set (t0_demo.py)
written to a temp folder, tokenised with --tokenizer_model (default: the released 8192-piece
tokenizer, which ships as tokenizers/tok8192.model). Fill rate = non-pad fraction of the first 1000 packed rows, for both
mixing modes and both packers (next_fit, best_fit), with each packer's speed in examples/s, and the
same on generated lognormal lengths with mean T/6 (packing_report; --packing_only stops there). Step time = forward + backward + AdamW step of one micro-batch, median of
--steps timed steps after warm-up: "plain" is train.py's batch (causal SDPA, no mask), "packed"
is a T0Batches batch (segment ids, from which the model builds the mask; per-example positions,
loss weights). Target: packed <= 1.15x plain. The optimizer comparison reuses bench/optimizers.py's
timer.

--seq_lens=T1,T2,...: instead of that one comparison, a table per row length T with
--tokens_per_step tokens per step (batch = tokens / T): plain LM, packed rows with the dense
(B, T, T) bool mask made per batch by the loader (what the batches carried before), and packed rows
from segment ids under each attention_impl (sdpa; flex where it trains: CUDA); each with the
training step time and its peak memory, and the no-grad forward (evaluation) time and peak
memory, where flex also runs on the CPU (eager, unfused). Peak memory on the CPU: the most bytes of
torch allocations live at once during one step, batch making included, from torch.profiler's
memory events (profile_memory=True; allocations minus frees in time order, parameters and
optimizer state excluded); on CUDA torch.cuda.max_memory_allocated over the step minus before it.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from optimizers import state_bytes, sync, time_steps  # noqa: E402  (bench/optimizers.py)

from model import ModelArgs, Transformer  # noqa: E402
from tinylab.data.tokenizer import Tokenizer  # noqa: E402
from tinylab.nn.attention import document_mask  # noqa: E402
from tinylab.schema import FINETUNE_T0  # noqa: E402
from tinylab.t0.batches import T0Batches, model_inputs  # noqa: E402
from tinylab.t0.encode import ExampleEncoder, tokenize_rows  # noqa: E402
from tinylab.t0.mixture import load_mixture  # noqa: E402
from tinylab.t0.packing import PackedStream, rows_to_arrays  # noqa: E402
from tinylab.t0.sources import read_records  # noqa: E402
from tinylab.training import optim  # noqa: E402
from tinylab.training.options import OptimizerOptions  # noqa: E402
from tinylab.training.presets import apply_optimizer_preset  # noqa: E402


def load_examples(args, row_len):
    if not os.path.isfile(args.tokenizer_model):
        sys.exit(f"error: tokenizer {args.tokenizer_model} not found; make it with python tinystories.py "
                 f"train_vocab --vocab_size=8192 or pass --tokenizer_model=PATH")
    tok = Tokenizer(args.tokenizer_model)
    if args.mixture:
        sources, _ = load_mixture(args.mixture)
    else:
        from tinylab.t0.demo import write_demo_data
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


def peak_memory(fn, device):
    """Peak bytes allocated by torch while fn() runs, over what was live before (docstring)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # each op's own allocations (self_cpu_memory_usage > 0) and the frees ([memory] events, < 0)
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def alternate(fns, steps, warmup, device):
    """Median ms of each fn(), the fns timed in alternation (a busy machine slows them alike)."""
    times = [[] for _ in fns]
    for k in range(warmup + steps):
        for t, fn in zip(times, fns):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            if k >= warmup:
                t.append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


def forward_only(model, batch):
    """An evaluation forward: no grad, fused head + loss, as T0Evaluator's loss."""
    with torch.no_grad():
        model(**batch, return_logits=False)


def attention_table(args, tok, lengths, weights, examples, margs_for, autocast):
    """Per row length T: plain vs packed (dense mask in the batch | segment ids under each
    attention_impl), training step and no-grad forward, time and peak memory (module docstring)."""
    dev = args.device
    print(f"packed attention: {args.tokens_per_step} tokens per step, dim {args.dim}, {args.n_layers} layers, "
          f"{args.n_heads} heads, vocab {tok.vocab_size}, {dev} {args.dtype}, {torch.get_num_threads()} threads; "
          f"times are medians of {args.steps} steps after {args.warmup} warm-up", flush=True)
    print(f"  {'T':>5} {'B':>3}  {'variant':34s} {'train ms':>9} {'peak MiB':>9} {'forward ms':>11} {'peak MiB':>9}")
    gen = torch.Generator().manual_seed(0)
    for T in args.seq_lens:
        B = max(1, args.tokens_per_step // T)
        stream = PackedStream(lengths, weights, T + 1, seed=0)

        def plain():
            x = torch.randint(0, tok.vocab_size, (B, T + 1), generator=gen)
            return {"tokens": x[:, :-1].to(dev), "targets": x[:, 1:].to(dev)}

        def packed(dense):
            def make():
                arrays = rows_to_arrays(stream.next_rows(B), examples, T + 1)
                batch, label_mask, _ = model_inputs(*arrays, args.prefixlm, dev)
                batch["loss_weights"] = (label_mask / label_mask.sum().clamp_min(1)).to(dev)
                if dense:  # the (B, T, T) mask the loader used to make for every batch
                    batch["attn_mask"] = document_mask(batch.pop("segment_ids"), batch.pop("prefix_mask", None))
                return batch
            return make

        variants = [("plain LM (causal, no mask)", "sdpa", plain),
                    ("packed, dense mask in the batch", "sdpa", packed(True)),
                    ("packed, segment ids, sdpa", "sdpa", packed(False)),
                    ("packed, segment ids, flex", "flex", packed(False))]
        setups, trains = [], []
        for name, impl, make in variants:
            torch.manual_seed(0)
            model = Transformer(margs_for(T)).to(dev)
            model.attention_impl = impl
            opt = optim.build_optimizer(model, OptimizerOptions.from_config(
                {**FINETUNE_T0.defaults(), "learning_rate": 1e-4, "weight_decay": 0.0}))
            trains.append(impl != "flex" or dev.startswith("cuda"))  # torch has no flex backward elsewhere
            setups.append((model, opt, make))
        # batch making (the dense mask of the loader) counts in both times and memories
        steps = [(lambda m=m, o=o, mk=mk: train_step(m, o, mk(), dev)) if ok else None
                 for (m, o, mk), ok in zip(setups, trains)]
        forwards = [lambda m=m, mk=mk: forward_only(m, mk()) for m, _, mk in setups]
        with autocast:
            train_ms = iter(alternate([f for f in steps if f], args.steps, args.warmup, dev))
            forward_ms = alternate(forwards, args.steps, args.warmup, dev)
            for (name, _, _), step, forward, f_ms in zip(variants, steps, forwards, forward_ms):
                # torch has no FlexAttention backward off CUDA
                train = f"{next(train_ms):9.1f} {peak_memory(step, dev) / 2**20:9.1f}" if step else f"{'n/a':>9} {'':>9}"
                print(f"  {T:5d} {B:3d}  {name:34s} {train} {f_ms:11.1f} {peak_memory(forward, dev) / 2**20:9.1f}",
                      flush=True)
        print(f"  {T:5d}      packed rows' fill rate {stream.fill_rate():.3f}", flush=True)


def lognormal_lengths(n, row_len, seed=0, sigma=1.0):
    """Long-tailed example lengths: lognormal with mean row_len / 6 (sigma 1: a tenth of the
    examples longer than twice the mean), cut at the row."""
    rng = np.random.default_rng(seed)
    x = np.ceil(rng.lognormal(np.log(row_len / 6) - sigma ** 2 / 2, sigma, n)).astype(np.int64)
    return np.clip(x, 1, row_len)


def packing_report(lengths, weights, row_len, n_lognormal):
    """Fill rate (non-pad fraction) of each packer and the packer's speed (examples packed per
    second, rows included), on the data's lengths (first 1000 rows, both mixing modes) and on
    generated lognormal lengths with mean T/6 at T = row_len - 1, 1024 and 2048 (two sources)."""
    def measure(lens, w, row_len, mixing, packing, n_rows):
        stream = PackedStream(lens, w, row_len, seed=0, mixing=mixing, packing=packing)
        t0 = time.perf_counter()
        rows = stream.next_rows(n_rows)
        dt = time.perf_counter() - t0
        return stream.fill_rate(), sum(len(r) for r in rows) / dt

    print(f"packing (best_fit: pack_buffer={FINETUNE_T0.defaults()['pack_buffer']}):", flush=True)
    for mixing in ("example", "row"):
        for packing in ("next_fit", "best_fit"):
            fill, speed = measure(lengths, weights, row_len, mixing, packing, 1000)
            print(f"  data, rows of {row_len} tokens, mixing={mixing:7s} packing={packing:8s}: fill rate "
                  f"{fill:.4f}  {speed:10,.0f} examples/s", flush=True)
    for T in sorted({row_len - 1, 1024, 2048}):
        lens = lognormal_lengths(n_lognormal, T + 1, seed=T)
        halves = [lens[: len(lens) // 2], lens[len(lens) // 2:]]
        n_rows = int(lens.sum() * 0.9 / (T + 1))  # about one pass
        for packing in ("next_fit", "best_fit"):
            fill, speed = measure(halves, [1.0, 1.0], T + 1, "example", packing, n_rows)
            print(f"  lognormal lengths, mean {lens.mean():6.1f} of rows of {T + 1}, {n_rows} rows, packing={packing:8s}: "
                  f"fill rate {fill:.4f}  {speed:10,.0f} examples/s", flush=True)


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
    ap.add_argument("--seq_lens", type=lambda v: [int(x) for x in v.split(",")], default=[],
                    help="row lengths T for the packed-attention table (e.g. 512,1024,2048); instead of --seq_len's "
                         "single comparison")
    ap.add_argument("--tokens_per_step", type=int, default=8192, help="--seq_lens: batch = tokens_per_step / T")
    ap.add_argument("--mixture", default="")
    ap.add_argument("--tokenizer_model", default=os.path.join(ROOT, "tokenizers", "tok8192.model"),
                    help="a sentencepiece model (default: the study's released tok8192, shipped in tokenizers/)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--packing_only", action="store_true", help="stop after the packing report")
    ap.add_argument("--lognormal_examples", type=int, default=300_000,
                    help="examples of the generated long-tailed length distribution of the packing report")
    args = ap.parse_args()
    row_len = (min(args.seq_lens) if args.seq_lens else args.seq_len) + 1  # examples must fit every row length

    tok, examples, weights = load_examples(args, row_len)
    lengths = [e.lengths() for e in examples]
    print(f"data: {sum(len(e) for e in examples)} examples from {len(examples)} sources, "
          f"mean length {sum(int(l.sum()) for l in lengths) / sum(len(l) for l in lengths):.1f} tokens", flush=True)
    packing_report(lengths, weights, row_len, args.lognormal_examples)
    if args.packing_only:
        return

    def margs_for(T):
        return ModelArgs(dim=args.dim, n_layers=args.n_layers, n_heads=args.n_heads, vocab_size=tok.vocab_size,
                         multiple_of=32, max_seq_len=T)

    autocast = torch.amp.autocast(device_type=args.device.split(":")[0], dtype=torch.bfloat16) \
        if args.dtype == "bfloat16" else torch.autocast("cpu", enabled=False)
    if args.seq_lens:
        attention_table(args, tok, lengths, weights, examples, margs_for, autocast)
    else:
        plain_vs_packed(args, tok, lengths, weights, examples, margs_for(args.seq_len), autocast)

    print("optimizer step alone (bench/optimizers.py's timer):")
    margs = margs_for(args.seq_len)
    base = {**FINETUNE_T0.defaults(), "learning_rate": 1e-4, "weight_decay": 0.0, "optimizer": "adamw", "adafactor_preset": ""}
    for name, cfg in (("AdamW", base), ("Adafactor (t0 preset)", apply_optimizer_preset({**base, "adafactor_preset": "t0"}))):
        model = Transformer(margs).to(args.device)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        opt = optim.build_optimizer(model, OptimizerOptions.from_config(cfg))
        step_ms = time_steps(opt, args.device, args.steps, args.warmup)
        print(f"  {name:24s} {step_ms:9.2f} ms/step  state {state_bytes(opt) / 2**20:8.2f} MiB")


def plain_vs_packed(args, tok, lengths, weights, examples, margs, autocast):
    """train.py's batch vs a T0Batches batch at --seq_len, step time in alternation."""
    torch.manual_seed(0)
    B, L = args.batch_size, args.seq_len
    row_len = L + 1
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
        adamw = OptimizerOptions.from_config({**FINETUNE_T0.defaults(), "learning_rate": 1e-4, "weight_decay": 0.0})
        setups.append((model, optim.build_optimizer(model, adamw), make))
    with autocast:
        ms = compare_train_steps(setups, args.steps, args.warmup, args.device)
    for name, t in zip(names, ms):
        print(f"  {name:24s} {t:9.2f} ms/step  {B * L / t * 1e3:12,.0f} tokens/s", flush=True)
    print(f"  packed / plain time per step: {ms[1] / ms[0]:.3f} (target <= 1.15)")


if __name__ == "__main__":
    main()
