"""The fine-tuning study's deletion -> recovery experiment, end to end on the built-in corpus
(Jain et al. 2023; docs/evaluation.md, datasets in docs/data.md), sized for a 2-core CPU.

    python experiments/deletion_recovery.py                        # ~8 min on 2 idle cores
    python experiments/deletion_recovery.py --out_dir=out/dr --pretrain_iters=1000

1. data     synthesize the procedural corpus, train a tokenizer, and pretokenize pretrain-all,
            filter-D, filter-adv-D (every prompt asks for D, no story has it) and recovery-D
            (D stories only), D = --feature (Twist). Headers keep only the Words and Features
            lines (--instruction_subset): the synthetic Summary names the plot events, twist
            included, which would ask for a twist behind the Features line's back.
2. pretrain a tiny model on all data (cosine LR), and a control model on filter-D, which never
            sees a D story.
3. delete   fine-tune the pretrained model on filter-adv-D at a constant LR.
4. recover  fine-tune the deleted model and the control on recovery-D at a constant LR.
Every training run logs, per evaluation, the task loss (recovery-D), complement loss (filter-D),
adversarial loss (filter-adv-D) and the generation score: how many stories written for
filter-adv-D prompts (which ask for D) have D, by the classifier judge (train.py feature_eval).
After each phase, evaluation/eval_features.py scores the final model on more prompts (with a 95%
interval) and evaluation/probe.py fits per-layer linear probes on pretrain-all stories.

Writes to --out_dir: runs/<phase>/ (train.py output), evals/*.json, deletion_recovery.png
(score and losses vs iteration per phase), results.md (table + verdicts), results.json, and
states whether the study's three effects appear: the score falls after deletion, probes still
decode D after deletion, and the deleted model recovers faster than the control.

Two lanes run in parallel as subprocesses with one thread each (pretrain -> delete -> recover,
and control -> recover); --jobs=1 runs everything in this process, one step after another.
"""
import contextlib
import json
import os
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tinylab.core.config import ArgParser
from tinylab.core.errors import UserError, cli_main  # noqa: E402
from tinylab.core.outputs import guard_parsed  # noqa: E402

PHASES = ("pretrain", "control", "delete", "recover", "recover_control")
LABELS = {"pretrain": "pretrained on all data", "control": "control: never saw {d} stories",
          "delete": "deleted (fine-tuned on filter-adv-{d})", "recover": "deleted, fine-tuned on {d} stories",
          "recover_control": "control, fine-tuned on {d} stories"}


def dataset_specs(d):
    """name -> pretokenize transform options of the four datasets (tw_fs.sh family names, docs/data.md)."""
    return {"pretrain-all": {},
            f"filter-{d}": {"filtering": f"features!={d}"},
            f"filter-adv-{d}": {"filtering": f"features!={d}", "adversarial_training": f"features={d}:1.0"},
            f"recovery-{d}": {"filtering": f"features={d}"}}


def build_data(a, log):
    """Corpus, tokenizer and datasets in a.data_cache_dir; each step is skipped when its output
    already exists (a rerun reuses them, if they were made with the same settings)."""
    from tinylab.data.dataset_spec import parse_spec
    from tinylab.data.pretokenize import pretokenize
    from tinylab.data.pretokenized import check_dataset
    from tinylab.data.records import raw_data_dir
    from tinylab.data.synthesize import synthesize
    from tinylab.data.vocab import train_vocab
    cache = a.data_cache_dir
    settings = {"num_shards": a.num_shards, "stories_per_shard": a.stories_per_shard, "vocab_size": a.vocab_size,
                "seed": a.seed, "instruction_subset": "Words,Features"}
    marker = os.path.join(cache, "deletion_recovery_data.json")
    if os.path.isfile(marker) and json.load(open(marker)) != settings:
        raise UserError(f"{cache} holds data made with other settings ({json.load(open(marker))}); "
                        f"use another --out_dir / --data_cache_dir or delete it")
    if not os.path.isdir(raw_data_dir(cache)):
        synthesize(cache, a.num_shards, a.stories_per_shard, a.seed, workers=a.jobs)
    if not os.path.isfile(os.path.join(cache, f"tok{a.vocab_size}.model")):
        train_vocab(cache, a.vocab_size, vocab_shards=a.num_shards, seed=a.seed)
    for name, options in dataset_specs(a.feature).items():
        try:
            check_dataset(cache, a.vocab_size, name)
        except UserError:
            spec = parse_spec(instruction_subset="Words,Features", **options)
            pretokenize(cache, a.vocab_size, spec, dataset_name=name, seed=a.seed, workers=a.jobs)
    with open(marker, "w") as f:
        json.dump(settings, f)
    log("data ready")


def train_argv(a, phase):
    d = a.feature
    run = os.path.join(a.out_dir, "runs", phase)
    dataset = {"pretrain": "pretrain-all", "control": f"filter-{d}", "delete": f"filter-adv-{d}"}.get(phase, f"recovery-{d}")
    cfg = dict(out_dir=run, data_cache_dir=a.data_cache_dir, vocab_size=a.vocab_size, dataset_name=dataset,
               eval_dataset_names=json.dumps([f"recovery-{d}", f"filter-{d}", f"filter-adv-{d}"]),
               generation_datasets=json.dumps([f"filter-adv-{d}"]), feature_eval=d,
               dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads, n_kv_heads=a.n_heads, multiple_of=32,
               max_seq_len=a.max_seq_len, batch_size=a.batch_size, gradient_accumulation_steps=1, dropout=0.0,
               eval_iters=a.eval_iters, log_interval=max(1, a.eval_interval // 2), max_new_tokens=a.max_new_tokens,
               device="cpu", dtype="float32", seed=a.seed)
    if phase in ("pretrain", "control"):
        cfg.update(init_from="scratch", max_iters=a.pretrain_iters, learning_rate=a.pretrain_lr,
                   min_lr=a.pretrain_lr / 10, warmup_iters=max(1, a.pretrain_iters // 20),
                   eval_interval=max(1, a.pretrain_iters // 4), generation_batch_size=a.gen_prompts)
    else:
        source = {"delete": "pretrain", "recover": "delete", "recover_control": "control"}[phase]
        iters = a.delete_iters if phase == "delete" else a.recover_iters
        cfg.update(init_from="resume_model", model_dir=os.path.join(a.out_dir, "runs", source), max_iters=iters,
                   learning_rate=a.finetune_lr, lr_scheduling=False, warmup_iters=0, eval_interval=a.eval_interval,
                   generation_batch_size=a.finetune_gen_prompts, finegrained_log_iters=2 * a.eval_interval,
                   finegrained_eval_interval=max(1, a.eval_interval * 2 // 5))
    return [f"--{k}={v}" for k, v in cfg.items()]


def eval_argvs(a, phase):
    """(name, script, argv) of the evaluations of a phase's final checkpoint. A step that did not
    finish in an earlier run is redone over its own output in evals/ (--force: the experiment's own file)."""
    ckpt = os.path.join(a.out_dir, "runs", phase, "ckpt.pt")
    ev = os.path.join(a.out_dir, "evals")
    steps = [(f"features_{phase}", "evaluation/eval_features.py",
              [f"--checkpoint={ckpt}", f"--feature={a.feature}", f"--prompts_from=filter-adv-{a.feature}",
               f"--num_samples={a.final_samples}", f"--batch_size={min(a.final_samples, 32)}",
               f"--max_new_tokens={a.max_new_tokens}", "--device=cpu", f"--seed={a.seed}",
               f"--out={ev}/features_{phase}.json", "--force"])]
    if phase in ("pretrain", "control", "delete"):
        steps.append((f"probe_{phase}", "evaluation/probe.py",
                      [f"--checkpoint={ckpt}", "--dataset=pretrain-all", f"--num_train={a.probe_train}",
                       f"--num_test={a.probe_test}", f"--iters={a.probe_iters}", f"--lr={a.probe_lr}", "--device=cpu",
                       f"--seed={a.seed}", f"--out={ev}/probe_{phase}.json", "--force"]))
    return steps


class Runner:
    """Runs steps (a script and its argv), logging each to logs/<name>.log: in a subprocess with
    one thread (jobs > 1) or in this process (jobs = 1). A finished step leaves logs/<name>.done
    holding its argv, so a rerun in the same --out_dir reuses it (see run_lanes)."""

    def __init__(self, a, log):
        self.a, self.log = a, log
        self.logs = os.path.join(a.out_dir, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.times = {}  # step -> {"wall_s", "cpu_s"}: CPU time says what a busy machine's wall time hides

    def __call__(self, name, script, argv):
        t0, c0 = time.time(), time.process_time()
        path = os.path.join(self.logs, f"{name}.log")
        self.log(f"start {name}")
        if self.a.jobs == 1:
            self._in_process(script, argv, path)
            cpu = time.process_time() - c0
        else:
            cpu = self._subprocess(script, argv, path)
        self.times[name] = {"wall_s": round(time.time() - t0, 1), "cpu_s": round(cpu, 1)}
        self.log(f"done  {name} ({self.times[name]['wall_s']:.0f}s, {cpu:.0f}s CPU)")
        with open(os.path.join(self.logs, f"{name}.done"), "w") as f:
            json.dump({"argv": argv, **self.times[name]}, f)

    def reuse(self, name, argv):
        """True (and the earlier timing recorded) if this exact step already finished."""
        try:
            with open(os.path.join(self.logs, f"{name}.done")) as f:
                done = json.load(f)
        except (OSError, ValueError):
            return False
        if done.get("argv") != argv:
            return False
        self.times[name] = {"wall_s": done["wall_s"], "cpu_s": done["cpu_s"], "reused": True}
        self.log(f"reuse {name} (finished by an earlier run)")
        return True

    def _subprocess(self, script, argv, path):
        """Run one step; returns the child's CPU seconds (os.wait4: its own rusage)."""
        import subprocess
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="disabled")
        with open(path, "w") as f:
            proc = subprocess.Popen([sys.executable, os.path.join(REPO, script)] + argv, cwd=REPO, env=env,
                                    stdout=f, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = rc = os.waitstatus_to_exitcode(status)
        if rc != 0:
            last = [line for line in open(path).read().splitlines() if line.strip()][-1:]
            raise UserError(f"{script} failed (exit {rc}; log {path}): {last[0] if last else ''}")
        return usage.ru_utime + usage.ru_stime

    def _in_process(self, script, argv, path):
        import importlib
        module = importlib.import_module(script[:-3].replace("/", "."))
        with open(path, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            try:
                module.main(argv)
            except UserError as e:
                raise UserError(f"{script} failed (log {path}): {e}") from None


LANES = [("pretrain", "delete", "recover"), ("control", "recover_control")]


def run_lanes(a, runner):
    """Lane 1: pretrain -> delete -> recover; lane 2: control -> recover_control; each phase's
    final-checkpoint evaluations run in its lane right after it."""
    def lane(phases):
        fresh = False  # once a step runs again, everything after it in the lane must too
        for phase in phases:
            for name, script, argv in [(f"train_{phase}", "train.py", train_argv(a, phase))] + eval_argvs(a, phase):
                if fresh or not runner.reuse(name, argv):
                    fresh = True
                    runner(name, script, argv)
    if a.jobs == 1:
        for phases in LANES:
            lane(phases)
        return
    errors = []

    def guarded(phases):
        try:
            lane(phases)
        except BaseException as e:  # reported after both lanes stop
            errors.append(e)
    threads = [threading.Thread(target=guarded, args=(p,)) for p in LANES]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# ---------------------------------------------------------------------- results

def read_evals(a):
    ev = os.path.join(a.out_dir, "evals")
    features = {p: json.load(open(os.path.join(ev, f"features_{p}.json"))) for p in PHASES}
    probes = {p: json.load(open(os.path.join(ev, f"probe_{p}.json"))) for p in ("pretrain", "control", "delete")}
    return features, probes


def curves(a):
    """phase -> list of eval records (iter, score, task / complement / adversarial loss)."""
    from tinylab.core.metrics import read_metrics
    d, out = a.feature, {}
    for phase in PHASES:
        recs = [r for r in read_metrics(os.path.join(a.out_dir, "runs", phase, "metrics.jsonl")) if r.get("kind") == "eval"]
        out[phase] = [{"iter": r["iter"], "score": r.get(f"gen_feature_score/filter-adv-{d}"),
                       "task": r.get(f"loss/recovery-{d}"), "complement": r.get(f"loss/filter-{d}"),
                       "adversarial": r.get(f"loss/filter-adv-{d}")} for r in recs]
    return out


def twist_probe(probe, feature):
    accs = [(r["layer"], r["acc"]) for r in probe["layers"] if r["feature"] == feature]
    return max(accs, key=lambda x: x[1])


def probe_baseline(a):
    """Majority-class accuracy of `feature` on the probes' held-out stories."""
    from tinylab.data.pretokenized import dataset_dir
    from tinylab.data.records import STORY_FEATURES
    from tinylab.data.tokenizer import Tokenizer
    from tinylab.eval.probes import story_examples
    tok = Tokenizer(os.path.join(a.data_cache_dir, f"tok{a.vocab_size}.model"))
    test = story_examples(dataset_dir(a.data_cache_dir, a.vocab_size, "pretrain-all"), "test", a.probe_test, a.seed,
                          tok, a.max_seq_len)
    rate = sum(lab[STORY_FEATURES.index(a.feature.lower())] for _, lab in test) / len(test)
    return max(rate, 1 - rate)


def effects(a, features, probes, curve, baseline):
    """The three verdicts, each with the numbers it rests on."""
    pre, dele = features["pretrain"], features["delete"]
    fell = dele["ci95"][1] < pre["ci95"][0]
    layer, acc = twist_probe(probes["delete"], a.feature)
    decodes = acc >= baseline + a.probe_margin

    def auc(phase):  # mean generation score over the recovery evaluations after iteration 0
        vals = [r["score"] for r in curve[phase] if r["iter"] > 0 and r["score"] is not None]
        return sum(vals) / len(vals) if vals else float("nan")
    auc_r, auc_c = auc("recover"), auc("recover_control")
    faster = auc_r - auc_c >= a.recovery_margin
    return {
        "score_falls_after_deletion": {"holds": fell, "pretrain": pre["score"], "pretrain_ci95": pre["ci95"],
                                       "delete": dele["score"], "delete_ci95": dele["ci95"]},
        "probes_decode_after_deletion": {"holds": decodes, "best_layer": layer, "acc": acc,
                                         "majority_baseline": baseline, "margin": a.probe_margin,
                                         "pretrain_acc": twist_probe(probes["pretrain"], a.feature)[1],
                                         "control_acc": twist_probe(probes["control"], a.feature)[1]},
        "recovery_faster_than_control": {"holds": faster, "mean_score_recover": auc_r,
                                         "mean_score_control": auc_c, "margin": a.recovery_margin,
                                         "final_recover": features["recover"]["score"],
                                         "final_control": features["recover_control"]["score"]},
    }


def plot(a, curve, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tinylab.core.fileio import atomic_file
    rows = [("score", f"generation score\n({a.feature} asked, judged)"), ("task", f"task loss\n(recovery-{a.feature})"),
            ("complement", f"complement loss\n(filter-{a.feature})"), ("adversarial", f"adversarial loss\n(filter-adv-{a.feature})")]
    cols = [("pretraining", ("pretrain", "control")), ("deletion", ("delete",)), ("recovery", ("recover", "recover_control"))]
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(13, 11), squeeze=False)
    for j, (title, phases) in enumerate(cols):
        for i, (key, label) in enumerate(rows):
            ax = axes[i, j]
            for phase in phases:
                pts = [(r["iter"], r[key]) for r in curve[phase] if r[key] is not None]
                if pts:
                    ax.plot(*zip(*pts), marker=".", label=LABELS[phase].format(d=a.feature))
            if key == "score":
                ax.set_ylim(-0.05, 1.05)
            elif j == 0:
                ax.set_yscale("log")  # from the untrained model's ln(vocab) down to the trained loss
            if i == 0:
                ax.set_title(title)
                ax.legend(fontsize="small")
            if j == 0:
                ax.set_ylabel(label)
            if i == len(rows) - 1:
                ax.set_xlabel("iteration")
            ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=90)
    plt.close(fig)


def table(a, features, probes, curve, fx, judge, timing):
    def last(phase, key):
        vals = [r[key] for r in curve[phase] if r[key] is not None]
        return f"{vals[-1]:.3f}" if vals else "-"
    lines = [f"| model | generation score ({a.feature} asked; 95% CI, n) | task loss | complement loss | "
             f"adversarial loss | {a.feature} probe acc (best layer) |", "|---|---|---|---|---|---|"]
    for phase in PHASES:
        f = features[phase]
        probe = f"{twist_probe(probes[phase], a.feature)[1]:.3f} (layer {twist_probe(probes[phase], a.feature)[0]})" \
            if phase in probes else "-"
        lines.append(f"| {LABELS[phase].format(d=a.feature)} | {f['score']:.3f} ({f['ci95'][0]:.2f}-"
                     f"{f['ci95'][1]:.2f}, {f['n']}) | {last(phase, 'task')} | {last(phase, 'complement')} | "
                     f"{last(phase, 'adversarial')} | {probe} |")
    rec = ["", "Recovery curves (generation score per evaluation, in-training judge):", "",
           "| iteration | " + " | ".join(str(r["iter"]) for r in curve["recover"]) + " |",
           "|---|" + "---|" * len(curve["recover"])]
    for phase in ("recover", "recover_control"):
        rec.append(f"| {LABELS[phase].format(d=a.feature)} | "
                   + " | ".join("-" if r["score"] is None else f"{r['score']:.2f}" for r in curve[phase]) + " |")
    s, p, r = (fx["score_falls_after_deletion"], fx["probes_decode_after_deletion"], fx["recovery_faster_than_control"])
    verdicts = [
        "", "Effects of the study:", "",
        f"- score falls after deletion: **{'yes' if s['holds'] else 'no'}** ({s['pretrain']:.3f} "
        f"[{s['pretrain_ci95'][0]:.2f}, {s['pretrain_ci95'][1]:.2f}] -> {s['delete']:.3f} "
        f"[{s['delete_ci95'][0]:.2f}, {s['delete_ci95'][1]:.2f}]; yes = the 95% intervals do not overlap)",
        f"- probes still decode {a.feature} after deletion: **{'yes' if p['holds'] else 'no'}** (best layer "
        f"{p['best_layer']}: {p['acc']:.3f} vs majority baseline {p['majority_baseline']:.3f}; pretrained "
        f"{p['pretrain_acc']:.3f}, control {p['control_acc']:.3f}; yes = at least baseline + {p['margin']})",
        f"- recovery faster than the control: **{'yes' if r['holds'] else 'no'}** (mean generation score over the "
        f"recovery evaluations {r['mean_score_recover']:.3f} vs {r['mean_score_control']:.3f}; final "
        f"{r['final_recover']:.3f} vs {r['final_control']:.3f}; yes = ahead by at least {r['margin']})",
        "", f"Judge: {judge}.", "", timing,
    ]
    return "\n".join(lines + rec + verdicts) + "\n"


def main(argv=None):
    p = ArgParser(description=__doc__.split("\n\n")[0])
    # its own folder: a rerun continues it, reusing the steps made with the same settings (outputs.py)
    p.add_output("--out_dir", kind="experiment", default="out/deletion_recovery")
    p.add_argument("--data_cache_dir", default="", help="default: <out_dir>/data")
    p.add_argument("--feature", default="Twist", help="the capability to delete and recover")
    p.add_argument("--num_shards", type=int, default=6)
    p.add_argument("--stories_per_shard", type=int, default=4000)
    p.add_argument("--vocab_size", type=int, default=2048)
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--n_layers", type=int, default=3)
    p.add_argument("--n_heads", type=int, default=4)
    p.add_argument("--max_seq_len", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--pretrain_iters", type=int, default=600)
    p.add_argument("--pretrain_lr", type=float, default=3e-3)
    p.add_argument("--delete_iters", type=int, default=150)
    p.add_argument("--recover_iters", type=int, default=150)
    p.add_argument("--finetune_lr", type=float, default=1e-3, help="constant LR of deletion and recovery")
    p.add_argument("--eval_interval", type=int, default=25, help="fine-tuning runs evaluate every N iterations")
    p.add_argument("--eval_iters", type=int, default=4)
    p.add_argument("--max_new_tokens", type=int, default=200)
    p.add_argument("--gen_prompts", type=int, default=16, help="generation-score prompts per pretraining eval")
    p.add_argument("--finetune_gen_prompts", type=int, default=32, help="... per fine-tuning eval")
    p.add_argument("--final_samples", type=int, default=64, help="eval_features prompts per final model")
    p.add_argument("--probe_train", type=int, default=1000)
    p.add_argument("--probe_test", type=int, default=400)
    p.add_argument("--probe_iters", type=int, default=1000)
    p.add_argument("--probe_lr", type=float, default=1e-2, help="(the study: 1e-3 for 2000 iterations)")
    p.add_argument("--probe_margin", type=float, default=0.05)
    p.add_argument("--recovery_margin", type=float, default=0.05)
    p.add_argument("--jobs", type=int, default=2, help="2: two parallel lanes of subprocesses; 1: all in-process")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    guard_parsed(p, a, force=False, tool="experiments/deletion_recovery.py")
    from tinylab.eval.feature_judge import check_feature, make_judge
    check_feature(a.feature)
    if a.jobs not in (1, 2):
        raise UserError(f"--jobs must be 1 or 2, got {a.jobs}")
    for name in ("num_shards", "stories_per_shard", "pretrain_iters", "delete_iters", "recover_iters", "eval_interval",
                 "final_samples", "probe_train", "probe_test", "probe_iters"):
        if getattr(a, name) < 1:
            raise UserError(f"--{name} must be >= 1")
    if a.num_shards < 2:
        raise UserError("--num_shards must be >= 2 (shard 0 is the test split)")
    a.data_cache_dir = a.data_cache_dir or os.path.join(a.out_dir, "data")
    os.makedirs(os.path.join(a.out_dir, "evals"), exist_ok=True)
    t0, load0 = time.time(), os.getloadavg()[0]

    def log(msg):
        print(f"[{time.time() - t0:6.0f}s] {msg}", flush=True)
    build_data(a, log)
    judge = make_judge(a.feature, a.data_cache_dir, log=log)  # trained once here, cached for every run
    log(f"judge: {judge.description}")
    setup_cpu = time.process_time()
    runner = Runner(a, log)
    run_lanes(a, runner)
    # what the run would take on two otherwise idle cores: the setup, then the longer lane
    lane_cpu = [sum(t["cpu_s"] for name, t in runner.times.items() if name.split("_", 1)[1] in phases)
                for phases in LANES]
    idle_estimate = setup_cpu + (max(lane_cpu) if a.jobs == 2 else sum(lane_cpu))
    reused = sum(bool(t.get("reused")) for t in runner.times.values())

    features, probes = read_evals(a)
    curve = curves(a)
    baseline = probe_baseline(a)
    fx = effects(a, features, probes, curve, baseline)
    runtime = time.time() - t0
    png = os.path.join(a.out_dir, "deletion_recovery.png")
    plot(a, curve, png)
    md = table(a, features, probes, curve, fx, judge.description,
               f"Runtime {runtime / 60:.1f} min with --jobs={a.jobs} (load average {load0:.1f} at the start"
               + (f"; {reused} steps reused from an earlier run" if reused else "") + "); CPU time of the setup "
               f"and the longer lane {idle_estimate / 60:.1f} min, the estimate for 2 idle cores.")
    from tinylab.core.fileio import write_atomic
    write_atomic(os.path.join(a.out_dir, "results.md"), md.encode())
    results = {"feature": a.feature, "runtime_s": round(runtime, 1), "idle_2core_estimate_s": round(idle_estimate, 1),
               "lane_cpu_s": lane_cpu, "load_average_start": load0, "load_average_end": os.getloadavg()[0],
               "steps": runner.times,
               "judge": {"name": judge.name, "accuracy": judge.accuracy, "description": judge.description},
               "final": features, "probes": probes, "probe_majority_baseline": baseline,
               "curves": curve, "effects": fx, "config": vars(a)}
    write_atomic(os.path.join(a.out_dir, "results.json"), (json.dumps(results, indent=1) + "\n").encode())
    print(md)
    print(f"wrote {png}, {os.path.join(a.out_dir, 'results.md')} and results.json in {runtime / 60:.1f} min")


if __name__ == "__main__":
    cli_main(main)
