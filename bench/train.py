"""Training throughput of a config on this device: tokens/s, ms/iter and MFU; and against llama2.c.

    python bench/train.py configs/base8M.py [--key=value ...] [--iters=20] [--warmup=3]
    python bench/train.py configs/base8M.py --llama2c_dir=PATH/TO/llama2.c   # also time llama2.c's step
    python bench/train.py configs/base8M.py --programs --llama2c_dir=PATH --vocab_source=llama2 --batch_size=8

Step mode (the default) runs the real training loop (trainer.Trainer, the one train.py uses) for a
few iterations on random tokens with the config's shapes (no dataset needed; evaluation and
checkpoints off), and reports the median of the timed iterations. With --llama2c_dir it also
times llama2.c's model.py and its configure_optimizers, driven by llama2.c's train.py inner loop
(micro-steps, clip, GradScaler, zero_grad), on the same shapes and the same random batches. With
--repeats=N the two alternate N times; every repeat is printed.

Programs mode (--programs, needs --llama2c_dir) runs both WHOLE programs as subprocesses, ours
(train.py) and llama2.c's train.py, alternating (ABAB...) --repeats times, each for --iters
iterations (default 30) on the same tokens: the built-in corpus (tinylab/data/synth_stories.py, 3
shards) pretokenized once into a temporary folder, in our layout (<cache>/llama2/<name>/ or
<cache>/tok{V}/<name>/ with a manifest) and, as links to the same uint16 shards, in llama2.c's
(data/TinyStories_all_data/*.bin for vocab_source=llama2, data/tok{V}/*.bin for custom). Both do
the same work: fp32 on the CPU (llama2.c's default dtype bfloat16 only autocasts on CUDA),
gradient_accumulation_steps from the config (llama2.c's default is 4), two loss evaluations of
one batch per split (at iteration 0 and at the end: llama2.c's eval_iters=1, eval_interval=iters-1,
ours' eval_iters=1), no generations (max_new_tokens=0), one final ckpt.pt + model.bin each
(llama2.c: always_save_checkpoint=True, as its default False would skip it). torch.compile:
llama2.c's train.py defaults to compile=True; both programs get the same setting, ours' resolved
`compile` unless --llama2c_compile says otherwise, and the compile time shows in iteration 0.
--threads=N sets OMP_NUM_THREADS for both (default: torch's own choice, the same for both). Every
run is printed (whole-process wall and CPU seconds, median ms/iter over iterations 1..iters-2,
iteration 0, the load average), then the per-pair ratios.
"""
import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.measure import run_timed  # noqa: E402
from tinylab.eval.lm_eval import dataset_vocab  # noqa: E402
from tinylab.schema import TRAIN  # noqa: E402
from tinylab.training.options import TrainerOptions  # noqa: E402
from tinylab.training.setup import Run, init_model, seed_everything  # noqa: E402
from tinylab.training.trainer import Trainer  # noqa: E402


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


class ProfileOneStep:
    """A step hook that runs torch.profiler over iteration `at` of the loop (from the end of the
    step before to the end of its own: LR, micro-steps, clip, optimizer, log)."""

    def __init__(self, at):
        self.at, self.prof = at, None

    def __call__(self, trainer, batch):
        if trainer.iter_num == self.at:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.prof.start()
        elif trainer.iter_num == self.at + 1 and self.prof is not None:
            self.prof.stop()


def bench_ours(cfg, iters, warmup, profile=None):
    run = Run.from_config(cfg)
    seed_everything(cfg["seed"])
    model, _ = init_model(cfg, run)
    with tempfile.TemporaryDirectory() as out:
        cfg = dict(cfg, out_dir=out, max_iters=warmup + iters, eval_interval=10**9, checkpoint_interval=10**9,
                   log_interval=1, init_from="scratch", wandb_log=False)
        trainer = Trainer(TrainerOptions.from_config(cfg), run, model, RandomBatches(cfg, run.device),
                          evaluate=lambda *a: {}, config=cfg)
        trainer.save = lambda *a, **k: None  # time training only
        if profile is not None:
            trainer.step_hooks["profile"] = profile
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.fit()
        from tinylab.core.metrics import read_metrics
        rows = [r for r in read_metrics(os.path.join(out, "metrics.jsonl")) if r["kind"] == "train"]
    ms = statistics.median(r["ms_per_iter"] for r in rows[warmup:])
    mfu = [r["mfu"] for r in rows[warmup:] if "mfu" in r]
    return ms, model, run, (statistics.median(mfu) if mfu else None)


def bench_llama2c(cfg, iters, warmup, llama2c_dir, device, compile=False):
    """llama2.c's model + optimizer driven by its train.py inner loop, on the same batches."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("llama2c_model", os.path.join(llama2c_dir, "model.py"))
    l2c = importlib.util.module_from_spec(spec)  # not `import model`: that name is ours
    spec.loader.exec_module(l2c)
    torch.manual_seed(cfg["seed"])
    args = l2c.ModelArgs(dim=cfg["dim"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"], n_kv_heads=cfg["n_kv_heads"],
                         vocab_size=cfg["vocab_size"], multiple_of=cfg["multiple_of"], max_seq_len=cfg["max_seq_len"],
                         dropout=cfg["dropout"])
    raw = model = l2c.Transformer(args).to(device)
    if compile:  # as its train.py does (its default); the warmup iterations absorb the compilation
        model = torch.compile(model)
    optimizer = raw.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]), "cpu" if device == "cpu" else "cuda")
    scaler = torch.amp.GradScaler("cpu" if device == "cpu" else "cuda", enabled=False)
    batches = RandomBatches(cfg, device)
    accum = cfg["gradient_accumulation_steps"]
    X, Y = next(batches)
    times = []
    t0 = time.time()
    for it in range(warmup + iters):
        for micro_step in range(accum):
            model(X, Y)
            loss = raw.last_loss / accum
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


# ---------------------------------------------------------------------- programs mode

# both programs print "<iter> | loss <x> | lr <x> | <ms>ms | ..." once per iteration (log_interval=1)
ITER_LINE = re.compile(r"^(\d+) \| loss \S+ \| lr \S+ \| ([\d.]+)ms", re.M)


def build_corpus(root, cfg, iters):
    """The built-in corpus pretokenized for cfg's vocabulary, in our layout and (as links to the
    same shards) in llama2.c's; returns (our data_cache_dir, llama2.c's working folder, layout vocab)."""
    from tinylab.data.dataset_spec import parse_spec
    from tinylab.data.pretokenize import pretokenize
    from tinylab.data.synthesize import synthesize
    layout_vocab, _ = dataset_vocab(cfg)
    ours = os.path.join(root, "data")
    # shards 1-2 train: at least twice the windows the run reads (llama2.c drops each shard's last)
    stories = max(300, 2 * iters * cfg["batch_size"] * cfg["gradient_accumulation_steps"] * cfg["max_seq_len"] // 300)
    synthesize(ours, num_shards=3, stories_per_shard=stories, seed=0)
    if layout_vocab:  # a custom vocabulary: the shipped tok{V}.model, as train.py would find it
        shipped = os.path.join(REPO, "tokenizers", f"tok{layout_vocab}.model")
        if os.path.isfile(shipped):
            shutil.copy(shipped, os.path.join(ours, f"tok{layout_vocab}.model"))
    manifest = pretokenize(ours, layout_vocab, parse_spec(), dataset_name="bench", seed=0, workers=1)
    shard_dir = os.path.join(ours, "llama2" if layout_vocab == 0 else f"tok{layout_vocab}", "bench")
    theirs = os.path.join(root, "llama2c")
    # llama2.c's tinystories.py globs data/TinyStories_all_data/*.bin (vocab_source=llama2) or data/tok{V}/*.bin
    bins = os.path.join(theirs, "data", "TinyStories_all_data" if layout_vocab == 0 else f"tok{layout_vocab}")
    os.makedirs(bins)
    for shard in manifest["shards"]:
        os.symlink(os.path.join(shard_dir, shard["file"]), os.path.join(bins, shard["file"]))
    return ours, theirs, layout_vocab


# llama2.c's lr_decay_iters: its train.py sets it to max_iters' default before the configurator
# runs, so a --max_iters does not move it; ours gets the same schedule (the first steps of a 1000
# iteration warmup, a run that train.py would refuse as never leaving its warmup otherwise)
LLAMA2C_LR_DECAY_ITERS = 100000


def program_commands(cfg, config_path, overrides, iters, data, l2c_dir, l2c_cwd, layout_vocab, l2c_compile, r):
    """(ours, llama2.c's) command lines for run r: the same shapes, optimizer, data and work."""
    ours = [sys.executable, os.path.join(REPO, "train.py"), *([config_path] if config_path else []), *overrides,
            f"--data_cache_dir={data}", "--dataset_name=bench", f"--out_dir={os.path.join(os.path.dirname(data), f'ours-{r}')}",
            f"--max_iters={iters}", f"--lr_decay_iters={LLAMA2C_LR_DECAY_ITERS}", f"--eval_interval={iters}", "--eval_iters=1", "--max_new_tokens=0",
            "--log_interval=1", "--wandb_log=False", "--init_from=scratch", "--export_bin=True", f"--device={cfg['device']}",
            f"--dtype={cfg['dtype']}", f"--compile={cfg['compile']}"]
    f = float  # llama2.c's configurator asserts the literal's type equals the default's
    keys = dict(out_dir=f"out-{r}", device=cfg["device"], dtype=cfg["dtype"], compile=l2c_compile,
                batch_size=cfg["batch_size"], gradient_accumulation_steps=cfg["gradient_accumulation_steps"],
                max_seq_len=cfg["max_seq_len"], dim=cfg["dim"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"],
                n_kv_heads=cfg["n_kv_heads"] or cfg["n_heads"], multiple_of=cfg["multiple_of"], dropout=f(cfg["dropout"]),
                vocab_source="llama2" if layout_vocab == 0 else "custom", vocab_size=cfg["vocab_size"],
                learning_rate=f(cfg["learning_rate"]), weight_decay=f(cfg["weight_decay"]), beta1=f(cfg["beta1"]),
                beta2=f(cfg["beta2"]), grad_clip=f(cfg["grad_clip"]), warmup_iters=cfg["warmup_iters"],
                decay_lr=cfg["decay_lr"], wandb_log=False, init_from="scratch", log_interval=1, eval_iters=1,
                # iterations 0..iters-1; evaluations (and the checkpoint) at 0 and iters-1
                max_iters=iters - 1, eval_interval=iters - 1, always_save_checkpoint=True)
    # configurator.py literal_eval's each value; a bare word that is no literal stays a string
    theirs = [sys.executable, os.path.join(l2c_dir, "train.py")] + [f"--{k}={v}" for k, v in keys.items()]
    return ours, theirs


def run_program(name, cmd, cwd, env, log_path):
    """Wall s, CPU s (user + sys of the process tree), per-iteration ms list of one program run."""
    wall, cpu, text, code = run_timed(cmd, cwd, env, log_path)
    if code != 0:
        raise SystemExit(f"{name} failed (exit {code}); the end of its output:\n{text[-3000:]}")
    return wall, cpu, [float(ms) for _, ms in ITER_LINE.findall(text)]


def bench_programs(cfg, args, config_path, overrides):
    if not args.llama2c_dir or not os.path.isfile(os.path.join(args.llama2c_dir, "train.py")):
        raise SystemExit("--programs needs --llama2c_dir=PATH, a llama2.c checkout (its train.py, model.py, tinystories.py)")
    l2c_dir = os.path.abspath(args.llama2c_dir)
    iters = args.iters if args.iters_given else 30
    if iters < 4:
        raise SystemExit("--programs needs --iters >= 4 (iterations 1..iters-2 are timed)")
    l2c_compile = cfg["compile"] if args.llama2c_compile == "" else args.llama2c_compile == "True"
    env = dict(os.environ, WANDB_MODE="disabled")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = tmp
        if args.keep_dir:  # the corpus, both programs' logs and run folders stay there
            if os.path.lexists(args.keep_dir):
                raise SystemExit(f"error: --keep_dir={args.keep_dir} exists; name a new folder")
            os.makedirs(args.keep_dir)
            root = os.path.abspath(args.keep_dir)
        data, l2c_cwd, layout_vocab = build_corpus(root, cfg, iters)
        os.symlink(os.path.join(l2c_dir, "configurator.py"), os.path.join(l2c_cwd, "configurator.py"))
        print(f"{iters} iterations each, batch {cfg['batch_size']}x{cfg['gradient_accumulation_steps']}, T={cfg['max_seq_len']}, "
              f"vocab {cfg['vocab_size']}, dim {cfg['dim']}, {cfg['n_layers']} layers, "
              f"{cfg['device']} {cfg['dtype']}, compile ours={cfg['compile']} llama2.c={l2c_compile}, "
              f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', '(unset: torch default ' + str(torch.get_num_threads()) + ')')}")
        print(f"{'run':>3} {'program':10s} {'wall s':>7} {'CPU s':>7} {'ms/iter':>8} {'iter 0 ms':>9} {'load':>5}", flush=True)
        for r in range(max(1, args.repeats)):
            ours_cmd, l2c_cmd = program_commands(cfg, config_path, overrides, iters, data, l2c_dir, l2c_cwd, layout_vocab,
                                                 l2c_compile, r)
            pair = {}
            for name, cmd, cwd in (("ours", ours_cmd, root), ("llama2.c", l2c_cmd, l2c_cwd)):
                load = os.getloadavg()[0]
                wall, cpu, its = run_program(name, cmd, cwd, env, os.path.join(root, f"{name}-{r}.log"))
                if len(its) != iters:
                    raise SystemExit(f"{name} logged {len(its)} iterations, expected {iters}")
                ms = statistics.median(its[1:-1])
                pair[name] = (wall, ms)
                print(f"{r:>3} {name:10s} {wall:7.1f} {cpu:7.1f} {ms:8.1f} {its[0]:9.0f} {load:5.1f}", flush=True)
            rows.append(pair)
    walls = [p["llama2.c"][0] / p["ours"][0] for p in rows]
    its = [p["llama2.c"][1] / p["ours"][1] for p in rows]
    print("llama2.c / ours, per pair: wall " + " ".join(f"{x:.2f}" for x in walls)
          + f" (median {statistics.median(walls):.2f}); ms/iter " + " ".join(f"{x:.2f}" for x in its)
          + f" (median {statistics.median(its):.2f})")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default="configs/base8M.py")
    p.add_argument("--iters", type=int, default=None, help="step mode: timed iterations (10); programs: iterations per run (30)")
    p.add_argument("--warmup", type=int, default=3, help="step mode: untimed iterations first")
    p.add_argument("--llama2c_dir", default="", help="a llama2.c checkout: also time its model.py (or, --programs, its train.py)")
    p.add_argument("--repeats", type=int, default=2, help="alternate ours / llama2.c this many times (every repeat is printed)")
    p.add_argument("--programs", action="store_true", help="time both whole train.py programs as subprocesses")
    p.add_argument("--threads", type=int, default=0, help="torch threads for both (programs: OMP_NUM_THREADS); 0 = torch's default")
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="step mode: print torch.profiler's per-op table (ROWS rows) of one iteration of ours")
    p.add_argument("--keep_dir", default="", help="programs: work in this new folder and keep it (logs, runs)")
    p.add_argument("--llama2c_compile", default="", choices=("", "True", "False"),
                   help="torch.compile llama2.c's model; '' = the same as ours")
    args, overrides = p.parse_known_args()
    args.iters_given = args.iters is not None
    if args.threads and not args.programs:
        torch.set_num_threads(args.threads)
    device = "cpu" if not torch.cuda.is_available() else "cuda"
    base = {"device": device, "dtype": "float32"} if device == "cpu" else {"device": device}
    cfg = TRAIN.parse([args.config] + [f"--{k}={v}" for k, v in base.items()] + overrides)
    cfg["vocab_size"] = dataset_vocab(cfg)[1]  # vocab_source=llama2: 32000, as train.py sets it
    if args.programs:
        return bench_programs(cfg, args, os.path.abspath(args.config), [f"--{k}={v}" for k, v in base.items()] + overrides)
    iters = args.iters if args.iters_given else 10
    if args.profile:
        prof = ProfileOneStep(args.warmup)
        ms, model, run, _ = bench_ours(cfg, max(iters, 2), args.warmup, prof)
        print(f"one training iteration after {args.warmup} warmup iterations (median of {max(iters, 2)}: {ms:.0f} ms/iter), "
              f"batch {cfg['batch_size']}x{cfg['gradient_accumulation_steps']}, vocab {cfg['vocab_size']}, "
              f"compile={cfg['compile']}, torch threads {torch.get_num_threads()}:")
        print(prof.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile))
        return
    l2c_compile = cfg["compile"] if args.llama2c_compile == "" else args.llama2c_compile == "True"
    tokens = cfg["batch_size"] * cfg["max_seq_len"] * cfg["gradient_accumulation_steps"]
    # CPU timings drift by +-20% between runs on shared machines: alternate the two and print
    # every repeat; the per-pair ratios are the comparison
    ours, theirs = [], []
    for r in range(max(1, args.repeats)):
        ms, model, run, mfu = bench_ours(cfg, iters, args.warmup)
        ours.append(ms)
        line = f"repeat {r}: tinystories-lab {ms:.1f} ms/iter ({tokens / ms * 1000:,.0f} tokens/s)"
        if args.llama2c_dir:
            theirs.append(bench_llama2c(cfg, iters, args.warmup, args.llama2c_dir, run.device, l2c_compile))
            line += f", llama2.c {theirs[-1]:.1f} ms/iter: {theirs[-1] / ms:.2f}x"
        print(line, flush=True)
    print(f"config {args.config}: {model.num_params() / 1e6:.2f}M params, dim {cfg['dim']}, {cfg['n_layers']} layers, "
          f"batch {cfg['batch_size']}x{cfg['gradient_accumulation_steps']}, T={cfg['max_seq_len']}, "
          f"{run.device} {run.dtype}, compile ours={cfg['compile']} llama2.c={l2c_compile}, torch threads {torch.get_num_threads()}")
    ms = statistics.median(ours)
    mfu_s = f", MFU {mfu * 100:.1f}%" if mfu is not None else " (MFU: device peak unknown; pass --peak_flops=...)"
    print(f"tinystories-lab: median {ms:.1f} ms/iter, {tokens / ms * 1000:,.0f} tokens/s{mfu_s}")
    if args.llama2c_dir:
        ratios = [t / o for o, t in zip(ours, theirs)]
        print(f"llama2.c      : median {statistics.median(theirs):.1f} ms/iter; llama2.c / ours per repeat "
              + " ".join(f"{x:.2f}" for x in ratios) + f" (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
