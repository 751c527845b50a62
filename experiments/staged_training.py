"""Staged training at CPU scale (docs/growth.md, "Experiment"): does growing a small model save
compute, judged at equal compute?

    python experiments/staged_training.py --threads=1                          # 3 seeds x 6 variants
    python experiments/staged_training.py --report --plots=docs/staged_training --force  # the docs' plots
    python experiments/staged_training.py --threads=1 --seeds=1337 --reuse \
        --variants=width-nojump,width-aligned,width-sb-off,width-sb-split      # the width ablations
    python experiments/staged_training.py --threads=1 --seeds=1337 --max_iters=1200 \
        --variants=width,depth --out_dir=out/staged_long --plots=''            # the longer budget
    python experiments/staged_training.py --report                             # tables + plots again (out_dir)
    python experiments/staged_training.py --max_iters=100 --seeds=1 --batch_size=4 --out_dir=/tmp/s --plots=''  # smoke

Per seed (--seed changes the data order, the initial weights and the symmetry-breaking noise),
on the built-in procedural corpus (made here with tinystories.py if missing), all runs with the
same data order:
  target        dim 128, 4 layers, 4 heads, FFN 384 (0.92M parameters) from scratch, --batch_size
                (16) sequences of 64 tokens per iteration: warmup 30 + cosine 2e-3 -> 2e-4 over
                --max_iters (600). Its total training compute C_target is the budget of every
                grown run.
  small models  "width": dim 64 / 2 heads / FFN 192; "depth": 2 layers at dim 128;
                "width+depth": dim 64 and 2 layers. The same schedule shape stretched over 10x the
                iterations (growth comes early in the small model's own schedule, as in the
                paper), trained in chunks of one evaluation interval (train.py resume_train,
                bit-exact) so the slope rule (rule.growth_point; thresholds -0.0475 width,
                -0.0575 depth, -0.03 width+depth) is checked online; if it never fires the model
                grows at the end of its budget (--max_iters), with a message saying so.
  variants      grow.py on the small checkpoint, then train.py continues on the target's config
                (lr_decay_iters kept at the target's, so the schedule is the target's; constant
                min_lr after it) until the run has spent C_target (the equal-compute protocol):
    width                 --doubling weights, target mode: position S_target = round(S_pre / 1.776),
                          re-warmup 20 (the §6.3 recipe)
    depth                 --doubling layers, S_pre / 1.412
    width+depth           the combined operator from the half-width, half-depth model at one
                          iteration: --doubling weights --c_width 2.455 (the combined constant:
                          position S_pre / 2.455), then --doubling layers --c_depth 1 on the result
                          (position unchanged; the re-warmup window is the same)
    width-restart         --restart_steps S_target --restart_warmup_steps 20 --reset_lr_scheduler
                          (the original's restart formula with the target config's LR)
    width-restart-keeplr  the same without --reset_lr_scheduler (the small checkpoint's peak LR)
    width-resetopt        the width recipe with --reset_optimizer (fresh AdamW moments)
  ablations (--variants=...)
    width-nojump          --c_width 1: no position jump (position S_pre of the target schedule)
    width-aligned         --restart_steps max_iters - N_post: the schedule anneals to min_lr exactly
                          when the run reaches C_target
    width+depth-aligned   the combined operator with position max_iters - N_post (--c_width =
                          g / (max_iters - N_post)), the same alignment
    width-sb-off / -split --symmetry_breaking off / split (the recipe's default is random)
The restart variants and the ablations reuse the width small model of the same seed.

Compute is training FLOPs: model.flops_per_token = 6N + 12·L·d·T (PaLM; N = the matmul
parameters, the tied head included) x tokens, summed over the segments before and after growth.
The grown run's iterations after growth are N_post = ceil((C_target - g·F_small) / F_target)
(F: FLOPs per iteration, g: the growth iteration). Reported per seed and variant: the trigger
(slope rule or fallback), the test loss just before and after growth (function preservation),
the final loss at equal compute against the target's, the FLOPs at which the grown run first
reaches the target's final loss (log-log interpolation between evaluations) and the saving
1 - that / C_target ("never" if it does not reach it within C_target), and for width growth the
relative half-asymmetry RMS(h1 - h2) / RMS(h) of the final hidden state (ops.width.half_asymmetry's
quantity, normalised) on fixed test windows. Every number goes to <out_dir>/seed<N>/results.json
and, over all seeds, <out_dir>/results.json; the plots to <plots>.png (operators) and
<plots>_width.png (width variants and ablations).
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
from tinylab.core.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from tinylab.core.config import ArgParser  # noqa: E402
from tinylab.core.errors import UserError, cli_main  # noqa: E402
from tinylab.core.metrics import read_metrics  # noqa: E402
from tinylab.core.outputs import guard_file, guard_folder, move_aside  # noqa: E402
from tinylab.data.pretokenized import BatchLoader, dataset_dir  # noqa: E402
from tinylab.growth.ops.base import meta_model  # noqa: E402
from tinylab.growth.ops.depth import DEPTH  # noqa: E402
from tinylab.growth.ops.width import WIDTH  # noqa: E402
from tinylab.growth.rule import growth_point, loss_slopes  # noqa: E402
from tinylab.schema import TRAIN  # noqa: E402
from tinylab.training.optim import lr_at  # noqa: E402
from tinylab.training.options import ScheduleOptions  # noqa: E402

VOCAB = 512
TARGET = dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=4, hidden_dim=384)
HALF_WIDTH = dict(dim=64, n_heads=2, n_kv_heads=2, hidden_dim=192)
SMALL = {"width": dict(TARGET, **HALF_WIDTH), "depth": dict(TARGET, n_layers=2),
         "width+depth": dict(TARGET, **HALF_WIDTH, n_layers=2)}
SMALL_DECAY = 10  # the small models' cosine runs over 10x the target's iterations
C_WIDTH, C_DEPTH, C_COMBINED = WIDTH.c, DEPTH.c, 2.455  # docs/growth.md §7
THRESHOLDS = {"width": WIDTH.slope_threshold, "depth": DEPTH.slope_threshold,
              "width+depth": -0.03}
FLOP_FORMULA = ("training FLOPs = sum over segments of model.flops_per_token x tokens, flops_per_token = "
                "6N + 12·L·d·T (PaLM; N = matmul parameters incl. the tied head, T = 64), tokens = 16 x 64 "
                "per iteration; the grown run continues until it has spent the target's total")
ASYM_OFFSETS = (20, 60, 140, 300)  # iterations after growth at which the half-asymmetry is measured


def s_target(g, c):
    return int(round(g / c))


# name: (small model, label, [(doubling, flags(g, n_post, a))], measures the half-asymmetry)
def _w(*extra):
    return [(WIDTH.name, lambda g, n, a: [f"--c_width={C_WIDTH}", f"--rewarmup_iters={a.rewarmup_iters}", *extra])]


def _restart(keep_lr=False, aligned=False):
    def flags(g, n, a):
        s = a.max_iters - n if aligned else s_target(g, C_WIDTH)
        return [f"--restart_steps={s}", f"--restart_warmup_steps={a.rewarmup_iters}"] + \
            ([] if keep_lr else ["--reset_lr_scheduler"])
    return [(WIDTH.name, flags)]


VARIANTS = {
    "width": ("width", "width (S_pre/1.776, re-warmup)", _w(), True),
    "depth": ("depth", "depth (S_pre/1.412, re-warmup)", [
        (DEPTH.name, lambda g, n, a: [f"--c_depth={C_DEPTH}", f"--rewarmup_iters={a.rewarmup_iters}"])], False),
    "width+depth": ("width+depth", "width+depth (S_pre/2.455, re-warmup)", [
        (WIDTH.name, lambda g, n, a: [f"--c_width={C_COMBINED}", f"--rewarmup_iters={a.rewarmup_iters}"]),
        (DEPTH.name, lambda g, n, a: ["--c_depth=1", f"--rewarmup_iters={a.rewarmup_iters}"])], True),
    "width-restart": ("width", "width, --restart_steps S_target --reset_lr_scheduler", _restart(), True),
    "width-restart-keeplr": ("width", "width, --restart_steps S_target (small model's LR)", _restart(True), True),
    "width-resetopt": ("width", "width, --reset_optimizer", _w("--reset_optimizer"), True),
    "width-nojump": ("width", "width, no position jump (c = 1)", [
        (WIDTH.name, lambda g, n, a: ["--c_width=1", f"--rewarmup_iters={a.rewarmup_iters}"])], True),
    "width-aligned": ("width", "width, restart at max_iters - N_post (anneals at C_target)",
                      _restart(aligned=True), True),
    "width+depth-aligned": ("width+depth", "width+depth, position max_iters - N_post (anneals at C_target)", [
        (WIDTH.name, lambda g, n, a: [f"--c_width={g / (a.max_iters - n)!r}", f"--rewarmup_iters={a.rewarmup_iters}"]),
        (DEPTH.name, lambda g, n, a: ["--c_depth=1", f"--rewarmup_iters={a.rewarmup_iters}"])], True),
    "width-sb-off": ("width", "width, --symmetry_breaking off", _w("--symmetry_breaking=off"), True),
    "width-sb-split": ("width", "width, --symmetry_breaking split", _w("--symmetry_breaking=split"), True),
}
MAIN = "width,depth,width+depth,width-restart,width-restart-keeplr,width-resetopt"


def common_config(a, seed):
    return dict(data_cache_dir=a.data_cache_dir, vocab_size=VOCAB, dataset_name="pretrain-all", multiple_of=32,
                max_seq_len=64, batch_size=a.batch_size, gradient_accumulation_steps=1, learning_rate=2e-3, min_lr=2e-4,
                warmup_iters=30, max_iters=a.max_iters, lr_decay_iters=a.max_iters, weight_decay=0.1,
                eval_interval=a.eval_interval, eval_iters=4, log_interval=50, max_new_tokens=0, dropout=0.0,
                device="cpu", dtype="float32", seed=seed)


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
    return meta_model(args).flops_per_token(cfg["max_seq_len"]) * tokens


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


def test_tokens(cfg, n=8):
    folder = dataset_dir(cfg["data_cache_dir"], VOCAB, cfg["dataset_name"])
    return next(iter(BatchLoader(folder, "test", n, cfg["max_seq_len"], seed=0)))[0]


@torch.no_grad()
def relative_asymmetry(ckpt_path, tokens):
    """RMS(h1 - h2) / RMS(h) of the final hidden state's two halves (0 = the halves still compute
    the same thing: the model is the small one in effect)."""
    model = model_from_checkpoint(load_checkpoint(ckpt_path)).eval()
    h = model._trunk(tokens)
    d = h.shape[-1] // 2
    return ((h[..., :d] - h[..., d:]).pow(2).mean().sqrt() / h.pow(2).mean().sqrt()).item()


# ---------------------------------------------------------------------- runs

def target_run(a, cfg, seed_dir):
    d = os.path.join(seed_dir, "target")
    if not (a.reuse and os.path.exists(os.path.join(d, "metrics.jsonl"))):
        train_run(dict(cfg, **TARGET), out_dir=fresh(d))
    pts = curve([(d, 0, TARGET)], cfg)
    if pts[-1][0] != a.max_iters:
        raise UserError(f"{d} is not a complete {a.max_iters}-iteration target run (rerun without --reuse)")
    return {"label": "target from scratch", "dir": d, "curve": pts, "final_loss": pts[-1][2],
            "flops": a.max_iters * flops_per_iter(TARGET, cfg)}


def small_run(key, a, cfg, seed_dir):
    """Train the small model chunk by chunk until the slope rule fires (or to --grow_at / the
    budget's end); its last checkpoint is the one to grow."""
    d = os.path.join(seed_dir, f"small_{key}")
    info_path = os.path.join(d, "small.json")
    if a.reuse and os.path.exists(info_path):
        with open(info_path) as f:
            return json.load(f)
    fresh(d)
    threshold = THRESHOLDS[key]
    small = dict(cfg, **SMALL[key], lr_decay_iters=SMALL_DECAY * a.max_iters)
    stop = a.grow_at or a.max_iters
    it, s_pre, slopes = 0, None, []
    while it < stop:
        it = min(it + a.eval_interval, stop)
        train_run(small, out_dir=d, max_iters=it, init_from="resume_train" if it > a.eval_interval else "scratch")
        if a.grow_at:
            continue
        pts = curve([(d, 0, SMALL[key])], cfg)[1:]  # iteration 0 has no compute
        compute, losses = [p[1] for p in pts], [p[2] for p in pts]
        slopes = loss_slopes(compute, losses)
        idx = growth_point(compute, losses, threshold)
        if idx is not None:
            s_pre = pts[idx][0]
            break
    late = [x for x in slopes[len(slopes) // 2:] if x is not None]
    if a.grow_at:
        trigger, message = "manual", f"{key}: growing at --grow_at={it}"
    elif s_pre is None:
        trigger = "fallback"
        message = (f"{key}: the smoothed slope never rose above {threshold} (second half: {min(late):.3f} .. "
                   f"{max(late):.3f}); growing at the end of the small model's budget, iteration {it}")
    else:
        trigger, message = "slope", f"{key}: the slope rule fired at iteration {s_pre}; growing there"
    print(message)
    info = {"dir": d, "shape": SMALL[key], "grown_at": it, "s_pre": s_pre, "trigger": trigger, "message": message,
            "threshold": threshold, "late_slopes": late, "curve": curve([(d, 0, SMALL[key])], cfg)}
    with open(info_path, "w") as f:
        json.dump(info, f, indent=1)
    return info


def grown_run(name, small, a, cfg, seed_dir, target, tokens):
    """Grow the small checkpoint as the variant says, continue on the target config until the
    run has spent the target's compute; the half-asymmetry is measured at ASYM_OFFSETS."""
    key, label, steps, asym = VARIANTS[name]
    g = small["grown_at"]
    f_small, f_target = flops_per_iter(small["shape"], cfg), flops_per_iter(TARGET, cfg)
    n_post = math.ceil((target["flops"] - g * f_small) / f_target - 1e-9)
    src, flags_used = small["dir"], []
    for k, (doubling, flags) in enumerate(steps):
        out = fresh(os.path.join(seed_dir, f"{name}_grown" if k == len(steps) - 1 else f"{name}_step{k}"))
        f = [f"--doubling={doubling}", f"--resume={src}", f"--out_dir={out}", f"--seed={cfg['seed']}", *flags(g, n_post, a)]
        flags_used.append(" ".join(f[:1] + f[3:]))
        grow_cli.main(f)
        src = out
    d = src
    ckpt = load_checkpoint(os.path.join(d, "ckpt.pt"))
    rewarmup = ckpt.get("lr_rewarmup") or {}
    shift = rewarmup.get("shift", 0)
    end = g + n_post
    run_cfg = dict(cfg, **TARGET)
    asymmetry = {0: relative_asymmetry(os.path.join(d, "ckpt.pt"), tokens)} if asym else {}
    stops = sorted({g + o for o in ASYM_OFFSETS if o < n_post} | {end}) if asym else [end]
    for stop in stops:  # train.py resume_train: chunks continue bit-exactly
        train_run(run_cfg, out_dir=d, init_from="resume_train", max_iters=stop - shift)
        if asym:
            asymmetry[stop - g] = relative_asymmetry(os.path.join(d, "ckpt.pt"), tokens)
    pts = curve([(small["dir"], 0, small["shape"]), (d, g, TARGET)], cfg)
    if pts[-1][0] != end:
        raise UserError(f"{name}: the grown run ended at iteration {pts[-1][0]}, not {end}")
    schedule = ScheduleOptions.from_config({**TRAIN.defaults(), **run_cfg})
    lrs = [lr_at(i, schedule, rewarmup) for i in range(g, end)]
    c_target, l_target = target["flops"], target["final_loss"]
    reach = flops_to_reach(pts, l_target)
    before, after = eval_loss(small["dir"], g), eval_loss(d, g)
    s_eq = iteration_reaching(target["curve"], before)  # where the target has the loss at growth
    return {"label": label, "small": key, "grow_flags": flags_used, "grown_at": g, "trigger": small["trigger"],
            "s_pre": small["s_pre"], "position_after_growth": g - shift, "lr_rewarmup": rewarmup,
            "optimizer_reset": ckpt.get("optimizer") is None, "n_post": n_post,
            "flops_small_per_iter": f_small, "flops_target_per_iter": f_target,
            "flops": g * f_small + n_post * f_target, "curve": pts,
            "loss_at_growth": [before, after], "delta_loss_at_growth": after - before,
            "final_loss": pts[-1][2], "loss_at_target_flops": loss_at(pts, c_target) or pts[-1][2],
            "target_final_loss": l_target, "target_loss_at_growth_flops": loss_at(target["curve"], g * f_small),
            "flops_to_target_loss": reach, "saving": None if reach is None else 1 - reach / c_target,
            "empirical_c": g / s_eq if s_eq else None,
            # the notebook's estimate of the saving: what the target needs to reach the loss at
            # growth minus what the small model spent, over the target's total
            "head_start": None if s_eq is None else (s_eq * f_target - g * f_small) / c_target,
            "lr_after_growth": lrs[:3], "mean_lr_after_growth": sum(lrs) / len(lrs),
            "lr_curve": [[g + i, lrs[i]] for i in range(0, len(lrs), 5)],
            "asymmetry": {str(k): v for k, v in asymmetry.items()}}


def run_seed(seed, a):
    cfg = common_config(a, seed)
    seed_dir = os.path.join(a.out_dir, f"seed{seed}")
    os.makedirs(seed_dir, exist_ok=True)
    path = os.path.join(seed_dir, "results.json")
    res = {"seed": seed, "variants": {}}
    if a.reuse and os.path.exists(path):
        with open(path) as f:
            res = json.load(f)
        # runs made with other settings would be mixed into this seed's numbers
        changed = sorted(k for k, v in res.get("config", {}).items() if k != "data_cache_dir" and cfg.get(k) != v)
        if changed:
            before = ", ".join(f"{k}={res['config'][k]}" for k in changed)
            raise UserError(f"--reuse: {seed_dir} was run with other settings ({before}); "
                            "pass the same ones or use another --out_dir")
    t0 = time.time()
    res["config"] = cfg
    res["target"] = target_run(a, cfg, seed_dir)
    tokens = test_tokens(cfg)
    smalls = res.setdefault("small", {})
    trained = set()
    for name in a.variants.split(","):
        key = VARIANTS[name][0]
        if key not in trained and not (a.reuse and key in smalls):
            smalls[key] = small_run(key, a, cfg, seed_dir)
            trained.add(key)
        if a.reuse and name in res["variants"]:
            continue  # finished in an earlier, interrupted invocation
        t = time.time()
        res["variants"][name] = grown_run(name, smalls[key], a, cfg, seed_dir, res["target"], tokens)
        res["variants"][name]["seconds"] = time.time() - t
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    print(f"seed {seed}: {time.time() - t0:.0f} s")
    return res


# ---------------------------------------------------------------------- report

def fmt_saving(r):
    return "never" if r["saving"] is None else f"{100 * r['saving']:+.1f}%"


def summarize(a):
    seeds = {}
    for entry in sorted(os.listdir(a.out_dir)):
        path = os.path.join(a.out_dir, entry, "results.json")
        if entry.startswith("seed") and os.path.exists(path):
            with open(path) as f:
                seeds[entry[4:]] = json.load(f)
    if not seeds:
        raise UserError(f"no seed*/results.json in {a.out_dir}")
    names = [n for n in VARIANTS if any(n in s["variants"] for s in seeds.values())]
    summary = {}
    print(f"\ncompute: {FLOP_FORMULA}")
    print("target: " + "; ".join(f"seed {k} final loss {s['target']['final_loss']:.4f} at {s['target']['flops']:.3e} FLOPs"
                                 for k, s in seeds.items()))
    head = f"{'variant':22s} " + " ".join(f"{'seed ' + k:>22s}" for k in seeds) + "   mean saving   mean final - target"
    print(head)
    for n in names:
        row, savings, gaps = [], [], []
        for k, s in seeds.items():
            r = s["variants"].get(n)
            if r is None:
                row.append(f"{'-':>22s}")
                continue
            gaps.append(r["loss_at_target_flops"] - r["target_final_loss"])
            savings.append(r["saving"])
            row.append(f"{fmt_saving(r):>7s} ({r['loss_at_target_flops']:.4f})".rjust(22))
        reached = [x for x in savings if x is not None]
        mean = sum(reached) / len(reached) if len(reached) == len(savings) else None
        summary[n] = {"savings": {k: s["variants"][n]["saving"] for k, s in seeds.items() if n in s["variants"]},
                      "mean_saving": mean, "reached": f"{len(reached)}/{len(savings)}",
                      "mean_final_minus_target": sum(gaps) / len(gaps)}
        m = "never" if not reached else (f"{100 * mean:+.1f}%" if mean is not None else
                                          f"{len(reached)}/{len(savings)} reach")
        print(f"{n:22s} " + " ".join(row) + f"   {m:>11s}   {summary[n]['mean_final_minus_target']:+.4f}")
    print("(saving of the target's compute to reach its final loss; in brackets the loss at equal compute)")
    for k, s in seeds.items():
        for n, r in s["variants"].items():
            before, after = r["loss_at_growth"]
            asym = ", ".join(f"+{o}: {v:.3f}" for o, v in r["asymmetry"].items())
            print(f"  seed {k} {n:21s} {r['trigger']} growth at {r['grown_at']} -> position {r['position_after_growth']}, "
                  f"test loss {before:.4f} -> {after:.4f}, N_post {r['n_post']}, final {r['final_loss']:.4f} vs "
                  f"{r['target_final_loss']:.4f}" + (f"; half-asymmetry {asym}" if asym else ""))
    out = {"protocol": FLOP_FORMULA, "summary": summary, "seeds": seeds}
    with open(os.path.join(a.out_dir, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    if a.plots:
        plot(seeds, a.plots)
    print(f"results: {os.path.join(a.out_dir, 'results.json')}" + (f"; plots: {a.plots}*.png" if a.plots else ""))
    return out


def plot(seeds, prefix):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    first = next(iter(seeds))
    groups = [("", ["width", "depth", "width+depth"], "operators (faint: the other seeds)"),
              ("_width", ["width", "width-restart", "width-restart-keeplr", "width-resetopt", "width-nojump",
                          "width-aligned", "width-sb-off", "width-sb-split", "width+depth-aligned"],
               f"width variants (seed {first})")]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for suffix, names, title in groups:
        present = [n for n in names if any(n in s["variants"] for s in seeds.values())]
        if not present:
            continue
        width_panels = suffix == "_width"
        fig, axes = plt.subplots(1, 3 if width_panels else 1, figsize=(16 if width_panels else 7.5, 4.8))
        ax = axes[0] if width_panels else axes
        for k, s in seeds.items():
            if width_panels and k != first:
                continue
            main = k == first
            t = s["target"]
            ax.plot([p[1] for p in t["curve"] if p[1] > 0], [p[2] for p in t["curve"] if p[1] > 0], color="black",
                    alpha=1 if main else 0.25, lw=1.2, label="target from scratch" if main else None)
            for j, n in enumerate(present):
                r = s["variants"].get(n)
                if r is None:
                    continue
                c = colors[j % len(colors)]
                pts = [p for p in r["curve"] if p[1] > 0]
                ax.plot([p[1] for p in pts], [p[2] for p in pts], color=c, alpha=1 if main else 0.25, lw=1,
                        ls="--" if n == "width-restart-keeplr" else "-", label=r["label"] if main else None)
                g = next(p for p in r["curve"] if p[0] >= r["grown_at"])
                ax.plot([g[1]], [g[2]], "o", color=c, alpha=1 if main else 0.25, ms=4)
        t = seeds[first]["target"]
        ax.axhline(t["final_loss"], color="gray", lw=0.8, ls=":", label=f"target's final loss (seed {first})")
        ax.axvline(t["flops"], color="gray", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        if width_panels:
            ax.set_xlim(t["flops"] * 0.25, t["flops"] * 1.05)
            ax.set_ylim(t["final_loss"] * 0.95, t["final_loss"] * 1.6)
        ax.set_xlabel("training FLOPs (6N + 12·L·d·T per token)")
        ax.set_ylabel("test loss")
        ax.set_title(f"staged training, equal compute: {title}\n(dots: growth; dotted: the target's compute and loss)",
                     fontsize=9)
        ax.legend(fontsize=7)
        if width_panels:
            s = seeds[first]
            ax2, ax3 = axes[1], axes[2]
            full = {**TRAIN.defaults(), **s["config"], **TARGET}
            schedule = ScheduleOptions.from_config(full)
            ax2.plot(range(full["max_iters"] + 1), [lr_at(i, schedule) for i in range(full["max_iters"] + 1)],
                     color="black", lw=1.2, label="target")
            for j, n in enumerate(present):
                r = s["variants"].get(n)
                if r is None:
                    continue
                c = colors[j % len(colors)]
                ls = "--" if n == "width-restart-keeplr" else "-"
                ax2.plot([x - r["grown_at"] + r["position_after_growth"] for x, _ in r["lr_curve"]],
                         [y for _, y in r["lr_curve"]], color=c, lw=1, ls=ls, label=n)
                if r["asymmetry"]:
                    ax3.plot([int(o) for o in r["asymmetry"]], list(r["asymmetry"].values()), "o-", color=c, lw=1,
                             ms=3, ls=ls, label=n)
            ax2.set_xlabel("position in the target's schedule (iterations)")
            ax2.set_ylabel("learning rate")
            ax2.set_title("LR after growth (against the target's schedule)", fontsize=9)
            ax2.legend(fontsize=7)
            ax3.set_xlabel("iterations after growth")
            ax3.set_ylabel("RMS(h1 - h2) / RMS(h)")
            ax3.set_title("half-asymmetry of the final hidden state (fixed test windows)", fontsize=9)
            ax3.legend(fontsize=7)
        fig.tight_layout()
        path = f"{prefix}{suffix}.png"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)



def guard_outputs_of(a):
    """Before any work (outputs.py): out_dir is new, continued (--reuse, --report) or moved aside
    (--force); the plots are new PNGs or replaced with --force."""
    if os.path.isdir(a.out_dir) and os.listdir(a.out_dir) and a.force and not (a.reuse or a.report):
        guard_folder(a.out_dir, "experiment", True, flag="--out_dir")
        move_aside(a.out_dir)
    guard_folder(a.out_dir, "experiment", a.force, flag="--out_dir", continues=a.reuse or a.report)
    a.plots = os.path.join(a.out_dir, "staged_training") if a.plots is None else a.plots
    outside = a.plots and not os.path.abspath(a.plots).startswith(os.path.abspath(a.out_dir) + os.sep)
    for suffix in (".png", "_width.png") if outside else ():  # its own folder's plots are its own to redraw
        guard_file(a.plots + suffix, "png", a.force, flag="--plots")


def main(argv=None):
    p = ArgParser(description="staged training experiment: width, depth and width+depth growth and the restart "
                  "variants vs a target from scratch, at equal compute, over seeds")
    p.add_argument("--data_cache_dir", default=os.path.join(REPO, "data", "staged"))
    p.add_output("--out_dir", kind="experiment", default=os.path.join(REPO, "out", "staged"),
                 help="the experiment's folder: an earlier one is continued only with --reuse / --report, "
                 "moved aside with --force")
    p.add_output("--plots", default=None, help="plot files <plots>.png and <plots>_width.png (default "
                 "<out_dir>/staged_training; docs/staged_training regenerates the docs' plots, with --force); '' = none")
    p.add_argument("--force", action="store_true", help="move an earlier --out_dir aside and replace --plots' PNGs")
    p.add_argument("--max_iters", type=int, default=600)
    p.add_argument("--eval_interval", type=int, default=20)
    p.add_argument("--rewarmup_iters", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=16,
                   help="sequences of 64 tokens per iteration, in every run (fewer for a quick smoke run)")
    p.add_argument("--variants", default=MAIN, help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--seeds", default="1337,1338,1339")
    p.add_argument("--grow_at", type=int, default=0, help="grow at this iteration instead of by the slope rule")
    p.add_argument("--reuse", action="store_true",
                   help="reuse the target and small runs and the finished variants in out_dir (resume an interrupted run)")
    p.add_argument("--report", action="store_true", help="only print the tables and plot from out_dir's results")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    if a.batch_size < 1:
        raise UserError(f"--batch_size must be at least 1, got {a.batch_size}")
    unknown = [n for n in a.variants.split(",") if n not in VARIANTS]
    if unknown:
        raise UserError(f"unknown variant(s) {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
    guard_outputs_of(a)
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.time()
    if not a.report:
        prepare_data(a.data_cache_dir)
        for seed in a.seeds.split(","):
            run_seed(int(seed), a)
    summarize(a)
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    cli_main(main)
