"""The GPU check: every CUDA path of the project, run once on one GPU, in one table.

    bash bench/gpu_check.sh                  # one CUDA GPU, no network, under 8 minutes on an H100
    bash bench/gpu_check.sh --dry            # the same sections on the CPU, tiny shapes (CI tests it)
    bash bench/gpu_check.sh --keep --work_dir=/tmp/gc   # keep the corpus, runs and logs (a new folder)
    CUDA_VISIBLE_DEVICES=3 bash bench/gpu_check.sh      # another GPU than the first

Data: the built-in corpus (`tinystories.py synthesize`, 3 shards x 300 stories, pretokenized with
the released tokenizers/tok8192.model into the work folder), as demo.sh and the tests make it.
Every training row runs the real entry points in this process (train.main, finetune_t0.main;
torchrun train.py for DDP and FSDP2) and reads their metrics.jsonl; the other rows call the model, the
optimizer builder and model.generate directly. The rows:

  throughput     configs/base8M, base30M, base91M at T = 256 and 1024 (batch scaled so a batch
                 holds the config's batch_size x 256 tokens; one micro-step), bf16, compile on:
                 tokens/s and MFU (median of the timed iterations, as train.py logs them; MFU from
                 setup.PEAK_FLOPS or --peak_flops), peak torch.cuda.max_memory_allocated
  bf16 vs fp32   base8M shape, the same 50 steps of the same batches from the same weights in
                 dtype=float32 (TF32 matmuls on CUDA, as train.py runs it) and dtype=bfloat16;
                 loss/test after the last step within REL_TOL_BF16 (2%) of each other
  fused AdamW    tinylab.training.optim.build_optimizer's AdamW has fused=True and the step runs the
                 aten::_fused_adamw_ kernel (profiler)
  fused head     a dim-64 model with a 32000-piece vocabulary under bf16 autocast + torch.compile:
                 training forward + backward never holds a (tokens x vocab) bf16 logits tensor
                 (peak memory above the start under half of one; on the CPU the largest single
                 allocation), its loss matches the plain fp32 head, no graph breaks
  SDPA flash     a training step of each config's attention shape under
                 sdpa_kernel(SDPBackend.FLASH_ATTENTION) (which raises if flash cannot run) and the
                 flash kernel in the profiler
  NCCL DDP       torchrun --standalone --nproc_per_node=1 train.py (NCCL_DEBUG=INFO shows NCCL
                 initialised); its losses equal the single-process bf16 run's first steps
  FSDP2          the same with --parallelism=fsdp (bf16 mixed-precision policy on CUDA): losses
                 within REL_TOL_BF16 of that run's
  T0 packed      finetune_t0.py --make_demo_data, then a few packed finetuning steps of a base8M model
  generation     model.generate (KV cache) of 16 rows x 256 new tokens, bf16: tokens/s
  total          the whole check's wall time, FAIL over 8 minutes (not in --dry)

A failing check prints FAIL in its row (the reason in the result, the traceback and its run's log
tail on stderr) and the script exits 1 at the end; every row still runs.

Time budget on an H100 (the `budget` column; only the total is enforced). The steps are small: by
PaLM's 6N + 12 L H Q T FLOPs per token (model.flops_per_token), the largest timed step, base91M at
T = 1024, is 32768 tokens x 0.661 GFLOP = 21.7 TFLOP: 0.22 s even at 10% of the 989 TFLOP/s bf16
peak (base8M's 131072-token steps are 7.3 and 9.3 TFLOP). Thirteen steps per row are under 3 s, so
each throughput row is dominated by torch.compile with cold caches (a guess, not a measurement:
25-50 s, growing with the layers), and the six rows take about 4 minutes. The eager runs are
launch-bound (a base8M step of 32 x 256 tokens is 0.45 TFLOP, milliseconds of compute), so bf16 vs
fp32 (2 x 50 steps), the torchrun rows (a fresh process each: CUDA and NCCL start-up), T0 and
generation (16 x 256 decoding steps) cost seconds each, mostly start-up. The budgets add up to
7.3 minutes.

--dry (automatic without CUDA) runs every section on the CPU with tiny shapes and few steps and
compile off in the training rows (Inductor's C++ compile would take minutes); the fused-head
check compiles with the aot_eager backend (Dynamo + AOT autograd, the graph capture the real
backend starts from); the T0 row writes the demo set with 40 instead of 1500 examples per task.
The flash, NCCL DDP and FSDP2 rows say "skipped (no CUDA)" and run their CPU counterparts (the CPU
flash kernel, gloo) so that the script itself is exercised. tests/test_gpu_check.py runs it.
"""
import argparse
import contextlib
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import torch  # noqa: E402

import finetune_t0  # noqa: E402
import train  # noqa: E402
from model import ModelArgs, Transformer  # noqa: E402
from tinylab.core import checkpoint as ckpt_lib  # noqa: E402
from tinylab.core.metrics import read_metrics  # noqa: E402
from tinylab.data.dataset_spec import parse_spec  # noqa: E402
from tinylab.data.pretokenize import pretokenize  # noqa: E402
from tinylab.data.synthesize import synthesize  # noqa: E402
from tinylab.data.tokenizer import Tokenizer  # noqa: E402
from tinylab.schema import TRAIN  # noqa: E402
from tinylab.t0.demo import write_demo_data  # noqa: E402
from tinylab.training.optim import build_optimizer  # noqa: E402
from tinylab.training.options import OptimizerOptions  # noqa: E402

CONFIGS = ("base8M", "base30M", "base91M")
TOTAL_LIMIT_S = 480  # the "under 8 minutes on one CUDA GPU"
# bf16 autocast rounds every matmul input to 8 significant bits (relative error <= 2^-9), with
# fp32 accumulation, fp32 weights and optimizer state, and the softmax / loss in fp32: the two
# runs start from the same weights and batches and drift apart only by rounding noise, well under
# 1% of a loss of ~5-7 nats after 50 steps. 2% leaves room for that drift and still catches a
# broken autocast path (a wrong cast or scale shows as NaN, a loss that does not fall, or a gap of
# many percent).
REL_TOL_BF16 = 0.02
# DDP over one process: the gradient all-reduce is an identity, so its losses equal the plain
# run's up to the GPU's non-deterministic kernels (atomics in backward, ~1e-6 per step)
REL_TOL_DDP = 2e-3
# the fused head's bf16 loss vs the plain fp32 head: bf16 matmul inputs move a loss of ln(32000)
# = 10.4 by ~1e-3
ABS_TOL_HEAD = 0.02

# per-section budgets in seconds on an H100 (see the docstring); printed beside the time taken
BUDGET = {"corpus": 5, "fused AdamW": 5, "fused head": 30, "SDPA flash": 10, "bf16 vs fp32": 30, "NCCL DDP": 30,
          "FSDP2": 30, "T0 packed": 30, "generation": 15, "base8M": 35, "base30M": 40, "base91M": 50}

FULL = dict(shape={}, seq_lens=(256, 1024), batch=None, warmup=3, timed=10, compile=True, prec_steps=50,
            prec_batch=32, prec_seq=256, prec_eval_iters=4, ddp_iters=5, t0_batch=16, t0_iters=10,
            gen_batch=16, gen_new=256, head=dict(dim=64, batch=16, seq=1024, vocab=32000), flash_seq=1024,
            head_backend="inductor", ddp_timeout=300)
DRY = dict(shape=dict(dim=32, n_layers=1, n_heads=4, n_kv_heads=4, multiple_of=32), seq_lens=(32, 64), batch=2,
           warmup=1, timed=2, compile=False, prec_steps=10, prec_batch=4, prec_seq=128, prec_eval_iters=1,
           ddp_iters=3, t0_batch=4, t0_iters=3, gen_batch=4, gen_new=32,
           head=dict(dim=32, batch=8, seq=1024, vocab=4096), flash_seq=64, head_backend="aot_eager",
           ddp_timeout=180)


class CheckFailed(Exception):
    """A check ran and its condition does not hold (the message says what was measured)."""


class Checker:
    def __init__(self, args):
        self.dry = args.dry or not torch.cuda.is_available()
        self.device = "cpu" if self.dry else "cuda"  # pick the GPU with CUDA_VISIBLE_DEVICES (torchrun uses cuda:0)
        self.cuda = self.device.startswith("cuda")
        self.plan = DRY if self.dry else FULL
        self.peak_flops = args.peak_flops
        self.work = os.path.abspath(args.work_dir or tempfile.mkdtemp(prefix="gpu_check_"))
        os.makedirs(os.path.join(self.work, "logs"), exist_ok=True)
        self.rows = []  # (order, check, setting, result, status, seconds, budget)
        self.failed = False
        self.t_start = time.perf_counter()
        self.corpus = self.base_dir = None
        self.bf16_losses = None  # the bf16 run's train losses, the DDP row's reference

    # -- running sections

    def section(self, order, check, setting, fn, budget_key=None):
        """Run fn() -> (result, status) and record its row; any exception is a FAIL row."""
        print(f"[{time.perf_counter() - self.t_start:6.1f} s] {check} {setting} ...", flush=True)
        t = time.perf_counter()
        try:
            result, status = fn()
        except (Exception, SystemExit) as e:  # every row runs: a failure is reported, not raised
            result, status = f"{type(e).__name__}: {e}".splitlines()[0][:200], "FAIL"
            if not isinstance(e, CheckFailed):
                traceback.print_exc()
        if status == "FAIL":
            self.failed = True
        seconds = time.perf_counter() - t
        self.rows.append((order, check, setting, result, status, seconds, BUDGET.get(budget_key or check)))
        print(f"[{time.perf_counter() - self.t_start:6.1f} s]   -> {status}: {result}", flush=True)
        if self.cuda:  # the section's tensors in reference cycles, then its cached blocks, back to the device
            gc.collect()
            torch.cuda.empty_cache()

    def call(self, name, main, argv):
        """An entry point's main(argv) in this process, its output into logs/<name>.log (the
        traceback and the log's tail also on stderr if it fails)."""
        log = os.path.join(self.work, "logs", f"{name}.log")
        with open(log, "w") as f:
            try:
                with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
                    return main(list(argv))
            except BaseException:
                traceback.print_exc(file=f)
                f.flush()
                with open(log) as g:
                    sys.stderr.write(f"--- last lines of {log}:\n" + "".join(g.readlines()[-15:]))
                raise

    def lm_args(self, out_name, dtype, **over):
        """train.py arguments of a short run on the built-in corpus (no generations, no wandb)."""
        keys = dict(data_cache_dir=self.corpus, dataset_name="pretrain-all", max_new_tokens=0, wandb_log=False,
                    export_bin=False, device=self.device, dtype=dtype, gradient_accumulation_steps=1,
                    eval_interval=10**6, eval_iters=1, log_interval=1, compile=False,
                    out_dir=os.path.join(self.work, "runs", out_name), **self.plan["shape"])
        keys.update(over)
        if self.peak_flops:
            keys["peak_flops"] = self.peak_flops
        return [f"--{k}={v}" for k, v in keys.items()]

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    # -- the table

    def table(self):
        lines = ["| check | setting | result | status | seconds (budget) |", "|---|---|---|---|---|"]
        for _, check, setting, result, status, seconds, budget in sorted(self.rows, key=lambda r: r[0]):
            b = f" ({budget})" if budget and not self.dry else ""
            result = result.replace("|", "/")  # a cell never splits the markdown table
            lines.append(f"| {check} | {setting} | {result} | {status} | {seconds:.1f}{b} |")
        return "\n".join(lines)


def train_rows(out_dir):
    rows = read_metrics(os.path.join(out_dir, "metrics.jsonl"), notice=False)
    return [r for r in rows if r.get("kind") == "train"], [r for r in rows if r.get("kind") == "eval"]


def gib(n):
    return f"{n / 2**30:.2f} GiB"


def mib(n):
    return f"{n / 2**20:.1f} MiB"


def random_batch(vocab, batch, seq, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return w[:, :-1].contiguous().to(device), w[:, 1:].contiguous().to(device)


def config_shape(name):
    """configs/<name>.py as train.py reads it."""
    return TRAIN.parse([os.path.join(REPO, "configs", f"{name}.py")])


# ---------------------------------------------------------------------- sections

def make_corpus(c: Checker):
    c.corpus = os.path.join(c.work, "data")
    with open(os.path.join(c.work, "logs", "corpus.log"), "w") as f, contextlib.redirect_stdout(f):
        synthesize(c.corpus, num_shards=3, stories_per_shard=300, seed=0)
        shutil.copy(os.path.join(REPO, "tokenizers", "tok8192.model"), os.path.join(c.corpus, "tok8192.model"))
        manifest = pretokenize(c.corpus, 8192, parse_spec(), dataset_name="pretrain-all", seed=0,
                               workers=1)
    # the base model of the T0 and generation rows: base8M's shape, random weights (speed, not quality)
    shape = {**config_args(config_shape("base8M")), **c.plan["shape"]}
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**shape, vocab_size=8192, max_seq_len=c.plan["prec_seq"]))
    c.base_dir = os.path.join(c.work, "base")
    ckpt_lib.save_checkpoint({"model": model.state_dict(), "model_args": ckpt_lib.model_args_dict(model),
                              "iter_num": 0, "config": {"tokenizer_model": os.path.join(c.corpus, "tok8192.model"),
                                                        "vocab_size": 8192}},
                             os.path.join(c.base_dir, "ckpt.pt"))
    return f"{manifest['tokens']:,} tokens, 3 shards; base model {model.num_params() / 1e6:.2f}M", "ok"


def config_args(cfg):
    return {k: cfg[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "multiple_of")}


def throughput(c: Checker, name, seq):
    p = c.plan
    cfg = config_shape(name)
    batch = p["batch"] or max(1, cfg["batch_size"] * 256 // seq)  # the config's tokens per micro-batch
    iters = p["warmup"] + p["timed"]
    torch._dynamo.reset()  # a fresh compile, as a new train.py process gets (and the last run's graphs freed)
    held = 0
    if c.cuda:  # the peak below is the run's own: the earlier sections' memory freed first
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(c.device)
        held = torch.cuda.memory_allocated(c.device)
    out = f"{name}-T{seq}"
    c.call(out, train.main, [os.path.join(REPO, "configs", f"{name}.py"),
                             *c.lm_args(out, "bfloat16", max_seq_len=seq, batch_size=batch, max_iters=iters,
                                        # the first steps of the config's own schedule (its warmup)
                                        lr_decay_iters=cfg["lr_decay_iters"] or cfg["max_iters"],
                                        compile=p["compile"])])
    rows, _ = train_rows(os.path.join(c.work, "runs", out))
    if len(rows) != iters:
        raise CheckFailed(f"{len(rows)} train records, expected {iters}")
    timed = rows[p["warmup"]:]
    losses = [r["loss/train"] for r in rows]
    if not all(math.isfinite(x) for x in losses):
        raise CheckFailed(f"non-finite training loss: {losses}")
    tok_s = statistics.median(r["tokens_per_s"] for r in timed)
    mfu = [r["mfu"] for r in timed if "mfu" in r]
    if mfu:
        mfu_s = f"MFU {statistics.median(mfu) * 100:.1f}%"
    else:
        mfu_s = "MFU n/a (" + ("no peak FLOP/s for the cpu" if not c.cuda else "device not in PEAK_FLOPS: --peak_flops") + ")"
    if c.cuda:
        peak = f"peak memory {gib(torch.cuda.max_memory_allocated(c.device))}"
        if held > 2**20:
            peak += f" ({gib(held)} held before the run)"
    else:
        peak = "peak memory n/a (cpu)"
    first = f"first step {rows[0]['ms_per_iter'] / 1000:.1f} s" + (" (compile)" if p["compile"] else "")
    return (f"{tok_s:,.0f} tok/s, {mfu_s}, {peak}; batch {batch}x{seq}, {first}, "
            f"loss {losses[0]:.2f} -> {losses[-1]:.2f}"), "ok"


def short_run_keys(c: Checker, iters):
    """The bf16 vs fp32 runs' settings (the torchrun rows run their first steps): base8M's shape,
    a schedule that does not depend on max_iters (so a shorter run takes the same first steps)."""
    p = c.plan
    return dict(max_seq_len=p["prec_seq"], batch_size=p["prec_batch"], max_iters=iters, learning_rate=1e-3,
                warmup_iters=max(1, p["prec_steps"] // 5), lr_decay_iters=p["prec_steps"], min_lr=1e-4,
                eval_iters=p["prec_eval_iters"])


def precision(c: Checker):
    p = c.plan
    n = p["prec_steps"]
    results = {}
    for dtype in ("float32", "bfloat16"):
        out = f"precision-{dtype}"
        c.call(out, train.main, [os.path.join(REPO, "configs", "base8M.py"), *c.lm_args(out, dtype, **short_run_keys(c, n))])
        rows, evals = train_rows(os.path.join(c.work, "runs", out))
        by_iter = {e["iter"]: e["loss/test"] for e in evals}
        if 0 not in by_iter or n not in by_iter:
            raise CheckFailed(f"{dtype}: no evaluation at iterations 0 and {n}")
        results[dtype] = (by_iter[0], by_iter[n])
        if dtype == "bfloat16":
            c.bf16_losses = {r["iter"]: r["loss/train"] for r in rows}
    (a0, a), (b0, b) = results["float32"], results["bfloat16"]
    rel = abs(a - b) / abs(a)
    text = (f"loss/test fp32 {a:.4f}, bf16 {b:.4f} (from {a0:.3f}): diff {abs(a - b):.4f} = {rel * 100:.2f}% "
            f"(tolerance {REL_TOL_BF16 * 100:.0f}%)")
    if not (math.isfinite(a) and math.isfinite(b)) or rel > REL_TOL_BF16:
        raise CheckFailed(text)
    if not (a < a0 and b < b0):
        raise CheckFailed(text + "; the loss did not fall")
    return text, "ok"


def fused_adamw(c: Checker):
    shape = {**config_args(config_shape("base8M")), **c.plan["shape"]}
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**shape, vocab_size=8192, max_seq_len=64)).to(c.device)
    opt = build_optimizer(model, OptimizerOptions.from_config({**TRAIN.defaults(), "learning_rate": 1e-3}))  # the trainer's
    x, y = random_batch(8192, 2, 64, c.device)
    model(x, y, return_logits=False)
    model.last_loss.backward()
    flags = sorted({str(g.get("fused")) for g in opt.param_groups})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
        c.sync()
    kernels = sorted({e.name for e in prof.events() if "adam" in e.name.lower() and e.name.startswith("aten::")})
    text = f"param groups fused={','.join(flags)}; kernels {', '.join(kernels) or 'none'}"
    if flags != ["True"] or not any("_fused_adamw" in k for k in kernels):
        raise CheckFailed(text)
    return text, "ok"


def fused_head(c: Checker):
    h = c.plan["head"]
    B, T, V = h["batch"], h["seq"], h["vocab"]
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=h["dim"], n_layers=1, n_heads=4, n_kv_heads=4, vocab_size=V, multiple_of=32,
                                  max_seq_len=T)).to(c.device)
    x, y = random_batch(V, B, T, c.device)
    with torch.no_grad():
        model(x, y)  # the plain head (F.linear + F.cross_entropy) in fp32: the reference
        ref = model.last_loss.item()
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    compiled = torch.compile(model, backend=c.plan["head_backend"])
    autocast = torch.autocast(device_type="cuda" if c.cuda else "cpu", dtype=torch.bfloat16)

    def step():
        with autocast:
            compiled(x, y, return_logits=False)  # as the trainer calls it
            loss = model.last_loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.item()

    step()  # compile
    logits_bytes = B * T * V * 2  # one (tokens, vocab) bf16 tensor
    if c.cuda:
        c.sync()
        torch.cuda.reset_peak_memory_stats(c.device)
        start = torch.cuda.memory_allocated(c.device)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            loss = step()
        used, what = torch.cuda.max_memory_allocated(c.device) - start, "peak memory above the start"
    else:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            loss = step()
        used, what = max(e.self_cpu_memory_usage for e in prof.events()), "largest allocation"
    ops = sorted({e.name for e in prof.events() if "linear_cross_entropy" in e.name})
    breaks = sum(counters["graph_break"].values())
    text = (f"{what} {mib(used)} vs (N,V) bf16 logits {mib(logits_bytes)}; loss {loss:.4f} vs plain fp32 "
            f"{ref:.4f}; graph breaks {breaks}; op {', '.join(ops) or 'none seen'}")
    if used >= logits_bytes / 2 or abs(loss - ref) > ABS_TOL_HEAD or breaks:
        raise CheckFailed(text)
    return text, "ok"


def flash(c: Checker):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    T = c.plan["flash_seq"]
    autocast = torch.autocast(device_type="cuda" if c.cuda else "cpu", dtype=torch.bfloat16)
    seen = []
    for name in CONFIGS:
        cfg = config_shape(name)
        torch.manual_seed(0)
        model = Transformer(ModelArgs(dim=cfg["dim"], n_layers=1, n_heads=cfg["n_heads"], n_kv_heads=cfg["n_kv_heads"],
                                      vocab_size=8192, multiple_of=cfg["multiple_of"], max_seq_len=T)).to(c.device)
        x, y = random_batch(8192, 2, T, c.device)
        # only the flash backend allowed: SDPA raises if it cannot run this call
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), autocast, \
                torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model(x, y, return_logits=False)
            model.last_loss.backward()
            c.sync()
        kernels = {e.name for e in prof.events() if "flash" in e.name}
        if not kernels:
            raise CheckFailed(f"{name}: no flash kernel in the profile")
        seen.append(f"{name} head dim {cfg['dim'] // cfg['n_heads']}")
    text = f"flash forward + backward ran ({', '.join(seen)}; T={T})"
    if c.cuda:
        return text, "ok"
    return f"the CPU flash kernel: {text}", "skipped (no CUDA)"


def torchrun(c: Checker, parallelism):
    """torchrun --nproc_per_node=1 train.py with parallelism=ddp or fsdp, on the bf16 row's
    settings: its losses are compared with the in-process bf16 run's first steps."""
    p = c.plan
    name = f"torchrun-{parallelism}"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
            os.path.join(REPO, "train.py"), os.path.join(REPO, "configs", "base8M.py"),
            *c.lm_args(name, "bfloat16", parallelism=parallelism, **short_run_keys(c, p["ddp_iters"]))]
    env = dict(os.environ, NCCL_DEBUG="INFO", WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    log = os.path.join(c.work, "logs", f"{name}.log")
    with open(log, "w") as f:
        proc = subprocess.run(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=p["ddp_timeout"])
    with open(log) as f:
        output = f.read()
    if proc.returncode != 0:
        sys.stderr.write(f"--- last lines of {log}:\n" + "".join(output.splitlines(True)[-15:]))
        raise CheckFailed(f"torchrun exited {proc.returncode} (log {log})")
    rows, _ = train_rows(os.path.join(c.work, "runs", name))
    losses = {r["iter"]: r["loss/train"] for r in rows}
    if len(losses) != p["ddp_iters"] or not all(math.isfinite(v) for v in losses.values()):
        raise CheckFailed(f"train records {losses}")
    if c.cuda and "NCCL INFO" not in output:
        raise CheckFailed("no NCCL INFO lines in the log: the process group did not use NCCL")
    tok_s = statistics.median(r["tokens_per_s"] for r in rows[1:] or rows)
    text = f"{'NCCL' if c.cuda else 'gloo'}, 1 process, {len(losses)} steps, {tok_s:,.0f} tok/s"
    # DDP computes exactly what one process does; FSDP2 on CUDA computes in bf16 parameters (its
    # mixed-precision policy) instead of under autocast: the same 8 bits, rounded elsewhere
    tol = REL_TOL_DDP if parallelism == "ddp" else REL_TOL_BF16
    if c.bf16_losses is None:
        text += "; no single-process reference (the bf16 vs fp32 row failed)"
    else:
        worst = max(abs(v - c.bf16_losses[i]) / abs(c.bf16_losses[i]) for i, v in losses.items())
        text += f"; losses vs the single-process bf16 run: max rel diff {worst:.1e} (tolerance {tol:.0e})"
        if worst > tol:
            raise CheckFailed(text)
    if c.cuda:
        return text, "ok"
    return f"the same torchrun on {text}", "skipped (no CUDA)"


def t0_packed(c: Checker):
    p = c.plan
    demo = os.path.join(c.work, "t0_demo")
    if c.dry:  # what --make_demo_data writes, with 40 instead of 1500 training examples per task
        write_demo_data(demo, seed=0, n_train=40, n_valid=10)
    else:
        c.call("t0-demo-data", finetune_t0.main, [f"--make_demo_data={demo}"])
    out = os.path.join(c.work, "runs", "t0")
    c.call("t0", finetune_t0.main, [f"--mixture={os.path.join(demo, 'mixture.json')}", f"--model_dir={c.base_dir}",
                                    f"--out_dir={out}", f"--batch_size={p['t0_batch']}", f"--max_iters={p['t0_iters']}",
                                    "--eval_interval=1000000", "--eval_iters=1", "--log_interval=1",
                                    "--rank_eval_examples=8", "--learning_rate=1e-4", f"--device={c.device}",
                                    "--dtype=bfloat16", "--wandb_log=False"])
    rows, _ = train_rows(out)
    losses = [r["loss/train"] for r in rows]
    if len(losses) != p["t0_iters"] or not all(math.isfinite(x) for x in losses):
        raise CheckFailed(f"train losses {losses}")
    tok_s = statistics.median(r["tokens_per_s"] for r in rows[1:] or rows)
    with open(os.path.join(out, "config.json")) as f:
        row_len = json.load(f)["max_seq_len"] + 1
    return (f"{len(losses)} steps of {p['t0_batch']} packed rows x {row_len}, bf16: "
            f"{tok_s:,.0f} tok/s, loss {losses[0]:.3f} -> {losses[-1]:.3f}"), "ok"


def generation(c: Checker):
    p = c.plan
    ckpt = ckpt_lib.load_checkpoint(os.path.join(c.base_dir, "ckpt.pt"))
    model = ckpt_lib.model_from_checkpoint(ckpt).to(c.device).eval()
    tok = Tokenizer(os.path.join(c.corpus, "tok8192.model"))
    prompt = tok.encode("Words: fix, lamp, plain\nFeatures: Dialogue, Twist\nStory:", bos=True, eos=False)
    idx = torch.tensor([prompt] * p["gen_batch"], device=c.device)
    autocast = torch.autocast(device_type="cuda" if c.cuda else "cpu", dtype=torch.bfloat16)
    gen = torch.Generator(device=c.device).manual_seed(0)
    with autocast:  # as the generation evaluation runs (trainer.run_eval)
        model.generate(idx, 8, temperature=1.0, top_k=40, generator=gen)  # warm-up
        c.sync()
        t = time.perf_counter()
        out = model.generate(idx, p["gen_new"], temperature=1.0, top_k=40, generator=gen)
        c.sync()
        dt = time.perf_counter() - t
    new = out[:, idx.shape[1]:]
    if tuple(new.shape) != (p["gen_batch"], p["gen_new"]) or int(new.min()) < 0 or int(new.max()) >= 8192:
        raise CheckFailed(f"generated {tuple(new.shape)}, ids {int(new.min())}..{int(new.max())}")
    return (f"{new.numel() / dt:,.0f} tok/s ({p['gen_batch']} rows x {p['gen_new']} new tokens after "
            f"{idx.shape[1]}, KV cache, {dt:.2f} s)"), "ok"


# ---------------------------------------------------------------------- main

def run_all(c: Checker):
    c.section(0, "built-in corpus", "synthesize 3 x 300 stories, tok8192", lambda: make_corpus(c), "corpus")
    mode = "bf16 autocast + compile" + (f" ({c.plan['head_backend']})" if c.dry else "")
    c.section(30, "fused AdamW", "build_optimizer on " + c.device, lambda: fused_adamw(c))
    c.section(40, "fused head", f"{mode}, vocab {c.plan['head']['vocab']}", lambda: fused_head(c))
    c.section(50, "SDPA flash", "sdpa_kernel(FLASH_ATTENTION), bf16", lambda: flash(c))
    c.section(20, "bf16 vs fp32", f"base8M shape, {c.plan['prec_steps']} steps, same batches", lambda: precision(c))
    c.section(60, "NCCL DDP", "torchrun --nproc_per_node=1 train.py", lambda: torchrun(c, "ddp"))
    c.section(65, "FSDP2", "the same, --parallelism=fsdp", lambda: torchrun(c, "fsdp"))
    c.section(70, "T0 packed", "finetune_t0.py on --make_demo_data", lambda: t0_packed(c))
    c.section(80, "generation", "model.generate, bf16", lambda: generation(c))
    compile_s = "compile on" if c.plan["compile"] else "compile off (dry)"
    for k, name in enumerate(CONFIGS):
        for j, seq in enumerate(c.plan["seq_lens"]):
            c.section(1 + 2 * k + j, f"throughput {name}", f"T={seq}, bf16, {compile_s}",
                      lambda name=name, seq=seq: throughput(c, name, seq), name)
    total = time.perf_counter() - c.t_start
    if c.dry:
        c.rows.append((90, "total", "dry run", f"{total:.1f} s (no limit in --dry)", "ok", total, None))
    else:
        ok = total <= TOTAL_LIMIT_S
        c.failed |= not ok
        c.rows.append((90, "total", f"limit {TOTAL_LIMIT_S} s", f"{total:.1f} s", "ok" if ok else "FAIL", total,
                       sum(BUDGET.values()) + sum(BUDGET[n] for n in CONFIGS)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="the CPU dry mode (automatic without CUDA)")
    ap.add_argument("--peak_flops", type=float, default=0.0, help="peak FLOP/s for MFU on a GPU not in PEAK_FLOPS")
    ap.add_argument("--work_dir", default="", help="folder for the corpus, runs and logs (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (kept anyway when a check fails)")
    args = ap.parse_args(argv)
    if args.work_dir and os.path.isdir(args.work_dir) and os.listdir(args.work_dir):
        print(f"error: --work_dir={args.work_dir} is not empty (the check removes it after a passing run): "
              f"remove it or name a new folder", file=sys.stderr)
        return 2
    c = Checker(args)
    name = "cpu (dry run)" if c.dry else torch.cuda.get_device_name(c.device)
    if not args.dry and c.dry:
        print("no CUDA device: running the dry mode (--dry)")
    print(f"GPU check on {name}: torch {torch.__version__}, CUDA {torch.version.cuda}, work folder {c.work}", flush=True)
    run_all(c)
    print()
    print(f"GPU check on {name}, torch {torch.__version__}, CUDA {torch.version.cuda}"
          f"{' (dry: tiny shapes on the CPU)' if c.dry else ''}:")
    print(c.table())
    if c.failed or args.keep:
        print(f"work folder (corpus, runs, logs) kept: {c.work}")
    else:
        shutil.rmtree(c.work, ignore_errors=True)
    if c.failed:
        print("GPU check: FAILED (see the FAIL rows)")
        return 1
    print("GPU check: all rows ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
