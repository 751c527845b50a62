"""What document_mask (and document_positions) change in pretraining on the built-in corpus: the
losses, the generation score and the speed, side by side with the same runs without them.

    python bench/document_mask.py [--iters=200 (0: speed only)] [--speed_iters=30] [--repeats=2] [--threads=N] [--key=value ...]

The corpus is the README Quickstart's (`tinystories.py synthesize`, 8 shards x 3000 stories;
`train_vocab` 512 pieces; `pretokenize`), built in a temporary folder. Every run is
configs/tiny_demo.py (0.80M parameters, max_seq_len 256) with batch 16 and one micro-step
(4096 tokens per iteration) on the CPU, seed 0: the three settings train on the same windows
with the same schedule. Extra --key=value arguments go to train.py.

Quality: one run per setting of --iters iterations, evaluated at the start (losses only) and
at the end: the losses on 10 batches and the generation score (`feature_eval=Twist`, the
corpus's classifier judge, trained once before the runs) of 64 generations from test headers.
Each final model is also evaluated on the same test windows both ways: `masked` (each story
attends within itself: the loss of the stories alone, what generation sees) and `unmasked` (the
whole window before each token), so models trained with and without the mask are compared on
the same quantity.

Speed: --repeats rounds of --speed_iters-iteration runs without generations, the settings in
ABBA order (off, mask, mask+positions, then the reverse) so that the machine's drift falls on
all; tokens/s is the median of a run's logged iterations after the first five, wall time the
whole process's from outside, as `time python train.py ...` would measure it.

Every run is a process of its own (this script with --child: train.py's main(), then the two
losses).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import train  # noqa: E402
from bench.measure import run_timed  # noqa: E402
from tinylab.core import checkpoint as ckpt_lib  # noqa: E402
from tinylab.core.errors import cli_main, leave_program  # noqa: E402
from tinylab.core.metrics import read_metrics  # noqa: E402
from tinylab.data.dataset_spec import parse_spec  # noqa: E402
from tinylab.data.pretokenize import pretokenize  # noqa: E402
from tinylab.data.pretokenized import BatchLoader  # noqa: E402
from tinylab.data.records import dataset_dir  # noqa: E402
from tinylab.data.synthesize import synthesize  # noqa: E402
from tinylab.data.tokenizer import Tokenizer  # noqa: E402
from tinylab.data.vocab import train_vocab  # noqa: E402
from tinylab.eval.feature_judge import asks_for, make_judge  # noqa: E402
from tinylab.eval.lm_eval import LMEvaluator  # noqa: E402
from tinylab.nn.attention import bos_segments  # noqa: E402

SETTINGS = [("off", []), ("mask", ["--document_mask=True"]),
            ("mask+positions", ["--document_mask=True", "--document_positions=True"])]
DATASET = parse_spec().name()
EVAL_BATCHES, EVAL_ROWS = 10, 16


def quickstart_corpus(root, judge):
    synthesize(root, num_shards=8, stories_per_shard=3000, seed=0)
    train_vocab(root, 512, seed=0)
    pretokenize(root, 512, parse_spec(), seed=0)
    if judge:
        make_judge("Twist", root)  # trained and cached in root/judges/ before any run is timed


@torch.no_grad()
def both_losses(out_dir, data_root, seed):
    """(masked, unmasked) mean loss of the run's final model on the same test windows."""
    model = ckpt_lib.model_from_checkpoint(ckpt_lib.load_checkpoint(out_dir)).eval()
    bos = Tokenizer(os.path.join(data_root, "tok512.model")).bos_id
    windows = BatchLoader(dataset_dir(data_root, 512, DATASET), "test", EVAL_ROWS, model.params.max_seq_len, seed)
    sums = [0.0, 0.0]
    for _ in range(EVAL_BATCHES):
        x, y = next(windows)
        for i, extra in enumerate(({"segment_ids": bos_segments(x, bos)}, {})):
            model(x, y, return_logits=False, **extra)
            sums[i] += model.last_loss.item()
    return [s / EVAL_BATCHES for s in sums]


def child(argv, out_dir, data_root, seed):
    real_call = LMEvaluator.__call__  # (the timed runs generate nothing: max_new_tokens=0)

    def evaluate(self, model, iter_num, generations):  # the untrained model's generations measure nothing
        return real_call(self, model, iter_num, generations and iter_num > 0)

    LMEvaluator.__call__ = evaluate
    try:
        cli_main(train.main, argv)  # train.py's own error boundary: one line, its exit code
    finally:
        leave_program()  # the process ends here, as `python train.py` does (its exit is timed too)
    rows = read_metrics(os.path.join(out_dir, "metrics.jsonl"), notice=False)
    evals = [r for r in rows if r.get("kind") == "eval"]
    speed = [r["tokens_per_s"] for r in rows if r.get("kind") == "train"][5:]
    tables = [r for r in rows if r.get("kind") == "table" and "generations/id" in r]
    asked = sum(asks_for(g["prefix"], "Twist") for g in tables[-1]["generations/id"]) if tables else 0
    masked, unmasked = both_losses(out_dir, data_root, seed)
    last = evals[-1]
    print("bench-document-mask: " + json.dumps({
        "loss/test": last["loss/test"], "loss/train": last["loss/train"], "masked": masked, "unmasked": unmasked,
        "score": last.get("gen_feature_score"), "asked": asked, "tokens_per_s": statistics.median(speed)}))


def run_one(root, data, name, tag, extra, env, seed):
    """One train.py run as a process of its own: its result dict (with `wall`, seconds)."""
    out = os.path.join(root, f"run-{tag}-{name}")
    argv = [os.path.join(REPO, "configs", "tiny_demo.py"), f"--data_cache_dir={data}", f"--out_dir={out}",
            "--gradient_accumulation_steps=1", "--log_interval=1", f"--seed={seed}", "--export_bin=False", *extra]
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps([argv, out, data, seed])]
    wall, _, text, code = run_timed(cmd, REPO, env, out + ".log")
    found = [line for line in text.splitlines() if line.startswith("bench-document-mask: ")]
    if code != 0 or not found:
        raise SystemExit(f"the {name!r} run failed (exit {code}); the end of its output:\n{text[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return dict(json.loads(found[-1].split(": ", 1)[1]), wall=wall)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=200, help="training iterations of the quality runs (0: none)")
    p.add_argument("--speed_iters", type=int, default=30, help="training iterations of the timed runs")
    p.add_argument("--repeats", type=int, default=2, help="rounds of the timed runs (ABBA order)")
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS of every run (0: torch's default)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one run: a JSON [argv, out_dir, data, seed]
    args, overrides = p.parse_known_args()
    if args.child is not None:
        return child(*json.loads(args.child))
    if args.repeats < 1 or args.speed_iters < 10 or 0 < args.iters < 10:
        raise SystemExit("error: --repeats must be at least 1, --speed_iters at least 10, --iters 0 or at least 10")
    env = dict(os.environ, WANDB_MODE="disabled")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    quality, speed = {}, {name: [] for name, _ in SETTINGS}
    with tempfile.TemporaryDirectory() as root:
        data = os.path.join(root, "data")
        quickstart_corpus(data, judge=args.iters > 0)
        print(f"{'run':12s} {'setting':15s} {'loss/test':>9} {'masked':>7} {'unmasked':>8} {'score (n)':>11} "
              f"{'tok/s':>7} {'wall s':>7} {'load':>5}", flush=True)
        runs = [("quality", name, extra + [f"--max_iters={args.iters}", f"--lr_decay_iters={args.iters}",
                                           f"--warmup_iters={args.iters // 10}", f"--eval_interval={args.iters}",
                                           f"--eval_iters={EVAL_BATCHES}", "--feature_eval=Twist",
                                           "--generation_batch_size=16", "--generation_eval_iters=4"])
                for name, extra in SETTINGS if args.iters]
        for r in range(args.repeats):
            for name, extra in (SETTINGS if r % 2 == 0 else SETTINGS[::-1]):
                runs.append((f"speed {r}", name, extra + [
                    f"--max_iters={args.speed_iters}", "--lr_decay_iters=100000", "--warmup_iters=5",
                    f"--eval_interval={args.speed_iters}", "--eval_iters=1", "--max_new_tokens=0"]))
        for tag, name, extra in runs:
            load = os.getloadavg()[0]
            res = run_one(root, data, name, tag.replace(" ", ""), extra + overrides, env, seed=0)
            (speed[name].append(res) if tag.startswith("speed") else quality.__setitem__(name, res))
            score = "-" if res["score"] is None else f"{res['score']:.3f} ({res['asked']})"
            print(f"{tag:12s} {name:15s} {res['loss/test']:9.4f} {res['masked']:7.4f} {res['unmasked']:8.4f} "
                  f"{score:>11} {res['tokens_per_s']:7.0f} {res['wall']:7.1f} {load:5.1f}", flush=True)
    report(quality, speed, args, env, overrides)


def report(quality, speed, args, env, overrides):
    threads = env.get("OMP_NUM_THREADS", f"(unset: torch default {torch.get_num_threads()})")
    print(f"\nconfigs/tiny_demo.py with gradient_accumulation_steps=1 (16 x 256 tokens per iteration), seed 0, "
          f"OMP_NUM_THREADS={threads}" + (f"; train.py overrides {' '.join(overrides)}" if overrides else ""))
    if not quality:
        return speed_table(speed, args)
    print(f"\nquality after {args.iters} iterations (losses on the same 10 x 16 test windows; score: judged Twist "
          f"among the n prompts asking for it, of 64):")
    print("| setting | loss/test (as trained) | masked loss | unmasked loss | generation score (n) |")
    print("|---|---|---|---|---|")
    for name, x in quality.items():
        score = "-" if x["score"] is None else f"{x['score']:.3f} ({x['asked']})"
        print(f"| {name} | {x['loss/test']:.4f} | {x['masked']:.4f} | {x['unmasked']:.4f} | {score} |")
    speed_table(speed, args)


def speed_table(speed, args):
    print(f"\nspeed: {args.repeats} rounds of {args.speed_iters}-iteration runs in ABBA order (tokens/s: the median of "
          "each run's iterations after the first five; wall: the whole process):")
    print("| setting | tokens/s (per round) | vs off (per round) | wall s (per round) |")
    print("|---|---|---|---|")
    base = speed["off"]
    for name, runs in speed.items():
        print(f"| {name} | " + " ".join(f"{x['tokens_per_s']:,.0f}" for x in runs) + " | "
              + " ".join(f"{x['tokens_per_s'] / b['tokens_per_s']:.3f}" for x, b in zip(runs, base))
              + f" (median {statistics.median(x['tokens_per_s'] / b['tokens_per_s'] for x, b in zip(runs, base)):.3f}) | "
              + " ".join(f"{x['wall']:.1f}" for x in runs) + " |")


if __name__ == "__main__":
    main()
