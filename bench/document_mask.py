"""What document_mask (and document_positions) change in pretraining on the built-in corpus: the
losses, the generation score and the speed, side by side with the same runs without them.

    python bench/document_mask.py [--iters=300] [--repeats=2] [--threads=N] [--key=value ...]

The corpus is the README Quickstart's (`tinystories.py synthesize`, 8 shards x 3000 stories;
`train_vocab` 512 pieces; `pretokenize`), built in a temporary folder. Each run is
configs/tiny_demo.py (0.80M parameters, max_seq_len 256, batch 16 x 2 micro-steps) for --iters
iterations on the CPU, with one evaluation at the end: the losses on 10 batches and the generation
score (`feature_eval=Twist`, the corpus's classifier judge, trained once before the runs) of 64
generations from test headers. The three settings train on the same windows with the same
schedule; repeat r uses seed r for all three.

After training, each run's final model is also evaluated on the same test windows both ways:
`masked` (each story attends within itself: the loss of the stories alone, what generation sees)
and `unmasked` (the whole window before each token), so models trained with and without the mask
are compared on the same quantity.

Every run is a process of its own (this script with --child: train.py's main(), then the two
losses), timed from outside as `time python train.py ...` would. The settings alternate in ABBA
order (off, mask, mask+positions, then the reverse), so that the machine's drift falls on all;
tokens/s is the median of the run's logged iterations after the first five.
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
from tinylab.core.errors import cli_main  # noqa: E402
from tinylab.core.metrics import read_metrics  # noqa: E402
from tinylab.data.dataset_spec import parse_spec  # noqa: E402
from tinylab.data.pretokenize import pretokenize  # noqa: E402
from tinylab.data.pretokenized import BatchLoader  # noqa: E402
from tinylab.data.records import dataset_dir  # noqa: E402
from tinylab.data.synthesize import synthesize  # noqa: E402
from tinylab.data.tokenizer import Tokenizer  # noqa: E402
from tinylab.data.vocab import train_vocab  # noqa: E402
from tinylab.eval.feature_judge import asks_for, make_judge  # noqa: E402
from tinylab.nn.attention import bos_segments  # noqa: E402

SETTINGS = [("off", []), ("mask", ["--document_mask=True"]),
            ("mask+positions", ["--document_mask=True", "--document_positions=True"])]
DATASET = parse_spec().name()
EVAL_BATCHES, EVAL_ROWS = 10, 16


def quickstart_corpus(root):
    synthesize(root, num_shards=8, stories_per_shard=3000, seed=0)
    train_vocab(root, 512, seed=0)
    pretokenize(root, 512, parse_spec(), seed=0)
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
    cli_main(train.main, argv)  # train.py's own error boundary: one line, its exit code
    rows = read_metrics(os.path.join(out_dir, "metrics.jsonl"), notice=False)
    evals = [r for r in rows if r.get("kind") == "eval"]
    speed = [r["tokens_per_s"] for r in rows if r.get("kind") == "train"][5:]
    tables = [r for r in rows if r.get("kind") == "table" and "generations/id" in r]
    asked = sum(asks_for(g["prefix"], "Twist") for g in tables[-1]["generations/id"])
    masked, unmasked = both_losses(out_dir, data_root, seed)
    last = evals[-1]
    print("bench-document-mask: " + json.dumps({
        "loss/test": last["loss/test"], "loss/train": last["loss/train"], "masked": masked, "unmasked": unmasked,
        "score": last.get("gen_feature_score"), "asked": asked, "tokens_per_s": statistics.median(speed)}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=300, help="training iterations of every run")
    p.add_argument("--repeats", type=int, default=2, help="rounds of the three settings (ABBA order), seed = round")
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS of every run (0: torch's default)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one run: a JSON [argv, out_dir, data, seed]
    args, overrides = p.parse_known_args()
    if args.child is not None:
        return child(*json.loads(args.child))
    if args.repeats < 1 or args.iters < 10:
        raise SystemExit("error: --repeats must be at least 1 and --iters at least 10")
    env = dict(os.environ, WANDB_MODE="disabled")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    results = {name: [] for name, _ in SETTINGS}
    with tempfile.TemporaryDirectory() as root:
        data = os.path.join(root, "data")
        quickstart_corpus(data)
        print(f"{'run':>3} {'setting':15s} {'loss/test':>9} {'masked':>7} {'unmasked':>8} {'score':>11} "
              f"{'tok/s':>7} {'wall s':>7} {'load':>5}", flush=True)
        for r in range(args.repeats):
            for name, extra in (SETTINGS if r % 2 == 0 else SETTINGS[::-1]):
                out = os.path.join(root, f"run-{r}-{name}")
                argv = [os.path.join(REPO, "configs", "tiny_demo.py"), f"--data_cache_dir={data}", f"--out_dir={out}",
                        f"--max_iters={args.iters}", f"--lr_decay_iters={args.iters}", f"--warmup_iters={args.iters // 10}",
                        f"--eval_interval={args.iters}", f"--eval_iters={EVAL_BATCHES}", "--log_interval=1",
                        "--feature_eval=Twist", "--generation_batch_size=16", "--generation_eval_iters=4",
                        f"--seed={r}", "--export_bin=False", *overrides, *extra]
                cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps([argv, out, data, r])]
                load = os.getloadavg()[0]
                wall, _, text, code = run_timed(cmd, REPO, env, out + ".log")
                found = [line for line in text.splitlines() if line.startswith("bench-document-mask: ")]
                if code != 0 or not found:
                    raise SystemExit(f"the {name!r} run failed (exit {code}); the end of its output:\n{text[-3000:]}")
                res = dict(json.loads(found[-1].split(": ", 1)[1]), wall=wall)
                results[name].append(res)
                score = "-" if res["score"] is None else f"{res['score']:.3f} ({res['asked']})"
                print(f"{r:>3} {name:15s} {res['loss/test']:9.4f} {res['masked']:7.4f} {res['unmasked']:8.4f} "
                      f"{score:>11} {res['tokens_per_s']:7.0f} {wall:7.1f} {load:5.1f}", flush=True)
                shutil.rmtree(out, ignore_errors=True)
    report(results, args, env, overrides)


def report(results, args, env, overrides):
    threads = env.get("OMP_NUM_THREADS", f"(unset: torch default {torch.get_num_threads()})")
    print(f"\nconfigs/tiny_demo.py, {args.iters} iterations, seeds 0..{args.repeats - 1}, OMP_NUM_THREADS={threads}"
          + (f"; train.py overrides {' '.join(overrides)}" if overrides else "")
          + "; mean over seeds (score: judged Twist among the prompts asking for it, pooled), tokens/s median:")
    print("| setting | loss/test (as trained) | masked loss | unmasked loss | generation score (n) | tokens/s | "
          "tokens/s vs off (per round) |")
    print("|---|---|---|---|---|---|---|")
    base = results["off"]
    for name, runs in results.items():
        mean = lambda k: statistics.mean(x[k] for x in runs)  # noqa: E731
        asked = sum(x["asked"] for x in runs)
        judged = sum((x["score"] or 0.0) * x["asked"] for x in runs)
        ratios = " ".join(f"{x['tokens_per_s'] / b['tokens_per_s']:.2f}" for x, b in zip(runs, base))
        print(f"| {name} | {mean('loss/test'):.4f} | {mean('masked'):.4f} | {mean('unmasked'):.4f} | "
              f"{judged / max(asked, 1):.3f} ({asked}) | {statistics.median(x['tokens_per_s'] for x in runs):,.0f} | "
              f"{ratios} |")


if __name__ == "__main__":
    main()
