"""Staged training at CPU scale (docs/growth.md): does growing a small model save compute?

    python experiments/staged_training.py --threads=1       # data, 5 runs, plot: ~4 min on 2 cores
    python experiments/staged_training.py --threads=1 --grow_at=300 --reuse_target   # manual timing
    python experiments/staged_training.py --max_iters=200   # a quick smoke run

Runs, on the built-in procedural corpus (made here with tinystories.py if missing), all with the
same data order; the target schedule is warmup + cosine over --max_iters, the small models run
the same shape over 10x as many iterations (as in the paper, growth comes early in the small
model's own schedule, so its LR is still near the peak):
  (a) target    the target model from scratch: dim 128, 4 layers, 4 heads, FFN 384;
  (b) width     dim 64 (2 heads, FFN 192) trained until the slope rule's pre-growth point
                (growth.growth_point, threshold -0.0475), grown with `grow.py --doubling weights`
                (mode target: schedule position S_pre / 1.776, LR re-warmup), continued by train.py;
  (c) depth     2 layers at dim 128, the same with `--doubling layers` (threshold -0.0575, c 1.412).
The small runs go in chunks of one evaluation interval (train.py resume_train, bit-exact), so the
slope is checked online and the growth uses the checkpoint at the detected point.
Compute is training FLOPs: model.flops_per_token (6N + 12·L·d·T, PaLM) x tokens, summed over the
segments before and after growth. Prints for each run the FLOPs it needed to reach (a)'s final
test loss (interpolated in log-log between evaluations) and the saving against (a); writes
results.json to --out_dir and the loss-vs-FLOPs plot to --plot.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402

import grow as grow_cli  # noqa: E402  (the commands, run in-process)
import train  # noqa: E402
from model import ModelArgs  # noqa: E402
from tinylab import growth  # noqa: E402
from tinylab.config import ArgParser  # noqa: E402
from tinylab.errors import cli_main  # noqa: E402
from tinylab.metrics import read_metrics  # noqa: E402

VOCAB = 512
TARGET = dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=4, hidden_dim=384)
SMALL = {"width": dict(TARGET, dim=64, n_heads=2, n_kv_heads=2, hidden_dim=192),
         "depth": dict(TARGET, n_layers=2)}
DOUBLING = {"width": "weights", "depth": "layers"}
SMALL_DECAY = 10  # the small models' cosine runs over 10x the target's iterations


def common_config(a):
    return dict(data_cache_dir=a.data_cache_dir, vocab_size=VOCAB, dataset_name="pretrain-all", multiple_of=32,
                max_seq_len=64, batch_size=16, gradient_accumulation_steps=1, learning_rate=2e-3, min_lr=2e-4,
                warmup_iters=30, max_iters=a.max_iters, lr_decay_iters=a.max_iters, weight_decay=0.1,
                eval_interval=a.eval_interval, eval_iters=4, log_interval=50, max_new_tokens=0, dropout=0.0,
                device="cpu", dtype="float32", seed=a.seed)


def train_run(cfg, **over):
    train.main([f"--{k}={v}" for k, v in {**cfg, **over}.items()])


def prepare_data(cache):
    if os.path.exists(os.path.join(cache, f"tok{VOCAB}", "pretrain-all", "manifest.json")):
        return
    for stage in (["synthesize", "--num_shards=6", "--stories_per_shard=4000", "--seed=0"],
                  ["train_vocab", f"--vocab_size={VOCAB}"],
                  ["pretokenize", f"--vocab_size={VOCAB}", "--dataset_name=pretrain-all"]):
        subprocess.run([sys.executable, os.path.join(REPO, "tinystories.py"), *stage, f"--data_cache_dir={cache}"],
                       check=True)


def flops_per_iter(shape, cfg):
    args = ModelArgs(vocab_size=VOCAB, multiple_of=cfg["multiple_of"], max_seq_len=cfg["max_seq_len"], **shape)
    tokens = cfg["batch_size"] * cfg["gradient_accumulation_steps"] * cfg["max_seq_len"]
    return growth.meta_model(args).flops_per_token(cfg["max_seq_len"]) * tokens


def curve(segments, cfg):
    """[(iteration, training FLOPs spent before it, test loss)] of a run made of segments
    [(out_dir, first iteration, shape)]: a segment contributes its evaluations until the next one
    starts, and each iteration costs the FLOPs of its segment's model."""
    per_iter = [flops_per_iter(shape, cfg) for _, _, shape in segments]
    starts = [start for _, start, _ in segments] + [float("inf")]
    points = {}
    for k, (out_dir, start, _) in enumerate(segments):
        for r in read_metrics(os.path.join(out_dir, "metrics.jsonl")):
            if r["kind"] == "eval" and start <= r["iter"] < starts[k + 1]:
                spent = sum(max(0, min(r["iter"], starts[j + 1]) - starts[j]) * per_iter[j] for j in range(len(segments)))
                points[r["iter"]] = (r["iter"], spent, r["loss/test"])
    return [points[i] for i in sorted(points)]


def eval_loss(out_dir, it):
    return next(r["loss/test"] for r in read_metrics(os.path.join(out_dir, "metrics.jsonl"))
                if r["kind"] == "eval" and r["iter"] == it)


def loss_at(points, flops):
    """The curve's loss at `flops` (log-log interpolation), or None outside it."""
    for (_, c0, l0), (_, c1, l1) in zip(points, points[1:]):
        if c0 > 0 and c0 <= flops <= c1:
            t = (math.log(flops) - math.log(c0)) / (math.log(c1) - math.log(c0))
            return math.exp(math.log(l0) + t * (math.log(l1) - math.log(l0)))
    return None


def iteration_reaching(points, loss):
    """First (linearly interpolated) iteration at which a curve reaches `loss`, or None."""
    for (i0, _, l0), (i1, _, l1) in zip(points, points[1:]):
        if l1 <= loss:
            return i0 if l0 <= loss else i0 + (l0 - loss) / (l0 - l1) * (i1 - i0)
    return None


def flops_to_reach(points, target_loss):
    """Compute at which the curve first reaches target_loss (log-log interpolation), or None."""
    for (i0, c0, l0), (i1, c1, l1) in zip(points, points[1:]):
        if l1 <= target_loss and c0 > 0:
            if l0 <= target_loss:
                return c0
            t = (math.log(l0) - math.log(target_loss)) / (math.log(l0) - math.log(l1))
            return math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0)))
    return None


def fresh(out_dir):
    # metrics.jsonl is appended to: a run must start from an empty folder
    shutil.rmtree(out_dir, ignore_errors=True)
    return out_dir


def staged_run(name, a, cfg):
    """Train the small model chunk by chunk until the slope rule fires (or to --grow_at), grow it
    with grow.py, continue with train.py on the target's config."""
    tag = f"{name}_at{a.grow_at}" if a.grow_at else name
    small_dir, grown_dir = (fresh(os.path.join(a.out_dir, f"{tag}_{s}")) for s in ("small", "grown"))
    doubling = DOUBLING[name]
    threshold = growth.SLOPE_THRESHOLDS[doubling]
    # the small model's own, long schedule (the paper grows early in it): its LR is still near the
    # peak at growth, and the grown run re-warms to the target schedule's LR at S_target
    small = dict(cfg, **SMALL[name], lr_decay_iters=SMALL_DECAY * a.max_iters)
    it, s_pre, slopes = 0, None, []
    while it < (a.grow_at or a.max_iters):
        it = min(it + a.eval_interval, a.grow_at or a.max_iters)
        train_run(small, out_dir=small_dir, max_iters=it, init_from="resume_train" if it > a.eval_interval else "scratch")
        if a.grow_at:
            continue
        pts = curve([(small_dir, 0, SMALL[name])], cfg)[1:]  # iteration 0 has no compute
        compute, losses = [p[1] for p in pts], [p[2] for p in pts]
        slopes = growth.loss_slopes(compute, losses)
        idx = growth.growth_point(compute, losses, threshold)
        if idx is not None:
            s_pre = pts[idx][0]
            break
    if s_pre is None and not a.grow_at:
        late = [x for x in slopes[len(slopes) // 2:] if x is not None]
        print(f"{name}: the smoothed slope never rose above {threshold} (second half: {min(late):.3f} .. {max(late):.3f}); "
              f"growing at the end of the small model's budget, iteration {it}")
    g = it  # the checkpoint of the chunk that detected the point (S_pre rounded up to an evaluation)
    grow_cli.main([f"--doubling={doubling}", f"--resume={small_dir}", f"--out_dir={grown_dir}",
               f"--rewarmup_iters={a.rewarmup_iters}", f"--seed={a.seed}"])
    train_run(dict(cfg, **TARGET), out_dir=grown_dir, init_from="resume_train")
    return {"s_pre": s_pre, "grown_at": g, "threshold": threshold, "rule": "manual" if a.grow_at else "slope",
            "late_slopes": [x for x in slopes[len(slopes) // 2:] if x is not None],
            "curve": curve([(small_dir, 0, SMALL[name]), (grown_dir, g, TARGET)], cfg),
            "loss_at_growth": [eval_loss(small_dir, g), eval_loss(grown_dir, g)]}


def plot(results, path, target_loss):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        c = [p[1] for p in r["curve"] if p[1] > 0]
        loss = [p[2] for p in r["curve"] if p[1] > 0]
        ax.plot(c, loss, label=r["label"])
        if "grown_at" in r:
            g = next(p for p in r["curve"] if p[0] >= r["grown_at"])
            ax.plot([g[1]], [g[2]], "o", color=ax.lines[-1].get_color())
    ax.axhline(target_loss, color="gray", lw=0.8, ls="--", label="(a) final loss")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training FLOPs (6N + 12·L·d·T per token)")
    ax.set_ylabel("test loss")
    ax.set_title("staged training on the built-in corpus (dots: growth)")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = ArgParser(description="staged training experiment (width and depth growth vs a target from scratch)")
    p.add_argument("--data_cache_dir", default=os.path.join(REPO, "data", "staged"))
    p.add_argument("--out_dir", default=os.path.join(REPO, "out", "staged"))
    p.add_argument("--plot", default="", help="default: docs/staged_training.png (_at<N> with --grow_at)")
    p.add_argument("--max_iters", type=int, default=600)
    p.add_argument("--eval_interval", type=int, default=20)
    p.add_argument("--rewarmup_iters", type=int, default=20)
    p.add_argument("--variants", default="width,depth")
    p.add_argument("--grow_at", type=int, default=0, help="grow at this iteration instead of by the slope rule")
    p.add_argument("--reuse_target", action="store_true", help="reuse the target run already in out_dir")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    tag = f"_at{a.grow_at}" if a.grow_at else ""
    a.plot = a.plot or os.path.join(REPO, "docs", f"staged_training{tag}.png")
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.time()
    prepare_data(a.data_cache_dir)
    cfg = common_config(a)
    target_dir = os.path.join(a.out_dir, "target")
    if not a.reuse_target:
        train_run(dict(cfg, **TARGET), out_dir=fresh(target_dir))
    results = {"target": {"label": "(a) target from scratch", "curve": curve([(target_dir, 0, TARGET)], cfg)}}
    for k, name in enumerate(a.variants.split(",")):
        results[name] = staged_run(name, a, cfg)
        results[name]["label"] = f"({'bc'[k]}) {name}-grown at {results[name]['grown_at']}"
    final = results["target"]["curve"][-1]
    print(f"\n(a) target from scratch: final test loss {final[2]:.4f} after {final[1]:.3e} FLOPs ({final[0]} iterations)")
    for name, r in results.items():
        c = flops_to_reach(r["curve"], final[2])
        r["flops_to_target_loss"] = c
        r["saving"] = None if c is None else 1 - c / final[1]
        last = r["curve"][-1]
        extra = ""
        if name != "target":
            # the empirical constant: S_pre over the iteration at which (a) reaches the small model's loss
            s_eq = iteration_reaching(results["target"]["curve"], r["loss_at_growth"][0])
            r["empirical_c"] = r["grown_at"] / s_eq if s_eq else None
            before, after = r["loss_at_growth"]
            r["target_loss_at_same_flops"] = loss_at(results["target"]["curve"], last[1])
            same = r["target_loss_at_same_flops"]
            extra = (f"; (a) at the same FLOPs: {'-' if same is None else f'{same:.4f}'}; slope-rule point {r['s_pre']}, "
                     f"grown at iteration {r['grown_at']} (test loss {before:.4f} -> {after:.4f}), "
                     f"empirical c = {r['empirical_c'] or float('nan'):.2f}")
        reach = "never reached" if c is None else f"{c:.3e} FLOPs, saving {100 * r['saving']:+.1f}%"
        print(f"  {name:7s} final loss {last[2]:.4f} at {last[1]:.3e} FLOPs; reaches {final[2]:.4f} at: {reach}{extra}")
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, f"results{tag}.json"), "w") as f:
        json.dump(results, f, indent=1)
    plot(results, a.plot, final[2])
    print(f"plot: {a.plot}; results: {os.path.join(a.out_dir, f'results{tag}.json')}; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    cli_main(main)
