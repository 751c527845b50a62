"""Rules between keys that used to be accepted silently, each now one `error:` line before anything
is written (or, where running is right, a one-line notice and the run goes on): a warmup longer
than the schedule, growth the run never reaches, `auto:` without an operator, grow.py's restart
flags, a growth plan from an incomplete config.json, plot names no run has, a rank evaluation
with nothing to rank, empty raw shards; sweep.py reading a program's keys without running it,
its failed-run and Ctrl-C endings; the trainer's Ctrl-C ending ("error: interrupted" last).

The same standard as tests/test_bad_input.py: exit code, exactly one error line with the key
names, no traceback, every file that existed before byte-identical afterwards."""
import json
import os
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest
from conftest import PYTHON, REPO, records, run_main
from test_bad_input import (
    EV,
    GROW,
    T0,
    T,
    assert_error,
    assert_nothing_lost,
    copy_raw,
    snapshot,
    train_argv,
    world,  # noqa: F401  the module's fixture: a finished tiny run, a T0 base and mixture
    write,
)

from tinylab.schema import FINETUNE_T0, TRAIN

P = os.path.join


def ctx_of(world, tmp_path):
    return SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# ---------------------------------------------------------------------- the table of refused commands

class Case:
    def __init__(self, id, script, argv, *fragments, code=2, setup=None):
        self.id, self.script, self.argv, self.fragments, self.code, self.setup = id, script, argv, fragments, code, setup


def plan_run(ctx, drop):
    """A run folder for grow.py --plan whose config.json lacks the keys `drop`."""
    folder = P(ctx.t, "runs", "small")
    cfg = {k: v for k, v in TRAIN.defaults().items() if k not in drop}
    write(P(folder, "config.json"), json.dumps(cfg))
    write(P(folder, "metrics.jsonl"), "".join(json.dumps({"iter": i, "kind": "eval", "loss/test": 4 - i / 1000}) + "\n"
                                              for i in range(0, 1200, 100)))


def PLAN(ctx):
    return ["--plan", "--runs", P(ctx.t, "runs", "small"), "--budget=1e14"]


def plot_log(ctx):
    """Train records (iter, loss/train, tokens_per_s) and eval records (iter, loss/test)."""
    rows = [{"iter": i, "kind": "train", "loss/train": 3.0 - i / 10, "tokens_per_s": 1000.0 + i} for i in range(5)]
    rows += [{"iter": i, "kind": "eval", "loss/test": 3.2 - i / 10} for i in (0, 4)]
    write(P(ctx.t, "run", "metrics.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))


def PLOT(ctx, *extra):
    return [P(ctx.t, "run"), f"--out={P(ctx.t, 'curves.png')}", *extra]


def rank_file(rows):
    def setup(ctx):
        write(P(ctx.t, "q.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    return setup


def RANK(ctx, *more):
    return EV(ctx, f"--data=q={P(ctx.t, 'q.jsonl')}", f"--out={P(ctx.t, 'rank.json')}", *more)


def empty_shards(names):
    def setup(ctx):
        raw = P(copy_raw(ctx), "TinyStories_all_data")
        for name in names:
            write(P(raw, name), "[]")
    return setup


def PRE(ctx, *extra):
    return ["pretokenize", "--vocab_size=8192", f"--data_cache_dir={P(ctx.t, 'cache')}", "--workers=1",
            "--dataset_name=d", *extra]


QUESTIONS = [{"inputs": f"Is {i} even?", "targets": "yes" if i % 2 == 0 else "no"} for i in range(6)]

CASES = [
    # a scheduled run whose warmup never ends (the decay ends at max_iters with lr_decay_iters=0)
    *[Case(f"warmup-longer-than-run-{kind}", "train.py", lambda x, k=kind: T(x, warmup_iters=5, lr_schedule=k),
           "warmup_iters=5", "max_iters=2", f"the {kind} schedule") for kind in ("cosine", "linear", "constant")],
    Case("warmup-longer-than-one-step", "train.py", lambda x: T(x, warmup_iters=2, max_iters=1, eval_interval=1),
         "warmup_iters=2", "max_iters=1"),
    Case("warmup-longer-than-finetune", "finetune_t0.py", lambda x: T0(x, lr_scheduling=True, warmup_iters=5),
         "warmup_iters=5", "max_iters=2"),
    # growth the run never reaches
    Case("grow-step-beyond-max-iters", "train.py", lambda x: T(x, grow_schedule="3:weights"),
         "grow_schedule step 3", "max_iters=2"),
    Case("grow-step-beyond-the-shifted-end", "train.py", lambda x: T(x, grow_schedule="2:weights,5:layers"),
         "grow_schedule step 5", "max_iters=2", "iteration 3"),  # 2 -> round(2 / 1.776) = 1: the end moves to 3
    Case("grow-step-beyond-exact-mode", "train.py", lambda x: T(x, grow_schedule="3:weights", grow_mode="exact"),
         "grow_schedule step 3", "max_iters=2"),
    # auto without an operator
    *[Case(f"grow-auto-{i}", "train.py", lambda x, s=s: T(x, grow_schedule=s), "grow_schedule=", what)
      for i, (s, what) in enumerate([("auto:", "no operator"), ("auto: , ", "no operator"),
                                     ("auto:weights,", "an empty operator")])],
    # grow.py's restart flags against the checkpoint's schedule (the world's run: max_iters=2)
    Case("grow-restart-warmup-too-long", "grow.py",
         lambda x: GROW(x, "--doubling=weights", "--restart_steps=1", "--restart_warmup_steps=5"),
         "--restart_warmup_steps=5", "--restart_steps=1", "max_iters=2"),
    Case("grow-restart-warmup-too-long-from-0", "grow.py",
         lambda x: GROW(x, "--doubling=layers", "--restart_steps=0", "--restart_warmup_steps=3"),
         "--restart_warmup_steps=3", "max_iters=2"),
    Case("grow-reset-lr-without-restart", "grow.py", lambda x: GROW(x, "--doubling=weights", "--reset_lr_scheduler"),
         "--reset_lr_scheduler needs --restart_steps"),
    Case("grow-restart-warmup-without-restart", "grow.py",
         lambda x: GROW(x, "--doubling=weights", "--restart_warmup_steps=2"), "--restart_warmup_steps needs --restart_steps"),
    # grow.py --plan on a config.json without what the planner reads
    *[Case(f"plan-config-without-{'-'.join(keys)}", "grow.py", PLAN, "runs/small", "config.json has no", *keys,
           setup=lambda x, k=keys: plan_run(x, k))
      for keys in (("dim",), ("n_heads", "vocab_size"), ("batch_size",), ("warmup_iters",))],
    # plot names no run has
    Case("plot-x-unknown", "plot.py", lambda x: PLOT(x, "--x=tokens"), "--x=tokens", "they have:", "loss/train",
         setup=plot_log),
    Case("plot-metric-unknown", "plot.py", lambda x: PLOT(x, "--metrics=loss/train,loss/nope"), "--metrics",
         "loss/nope", "available:", setup=plot_log),
    Case("plot-metric-never-with-x", "plot.py", lambda x: PLOT(x, "--metrics=loss/test", "--x=tokens_per_s"),
         "'loss/test'", "--x=tokens_per_s", setup=plot_log),
    # a rank evaluation with nothing to rank
    Case("rank-no-choices", "evaluation/eval_rank.py", RANK, "no record to rank", "6 record(s) read",
         "6 with fewer than 2 non-empty answer_choices", setup=rank_file(QUESTIONS)),
    Case("rank-target-not-a-choice", "evaluation/eval_rank.py", RANK, "no record to rank",
         "6 with a target that is not one of its answer_choices",
         setup=rank_file([dict(q, answer_choices=["true", "false"]) for q in QUESTIONS])),
    Case("rank-mixed-reasons", "evaluation/eval_rank.py", RANK, "3 record(s) read", "1 with no inputs/targets text",
         "1 with fewer than 2", "1 with a target that is not",
         setup=rank_file([{"inputs": " ", "targets": "yes", "answer_choices": ["yes", "no"]},
                          {"inputs": "Q?", "targets": "yes", "answer_choices": ["yes"]},
                          {"inputs": "Q?", "targets": "maybe", "answer_choices": ["yes", "no"]}])),
    Case("rank-empty-file", "evaluation/eval_rank.py", RANK, "q.jsonl is empty",
         setup=lambda x: write(P(x.t, "q.jsonl"), "")),
    # raw shards that are all empty lists
    Case("pretokenize-all-shards-empty", "tinystories.py", PRE, "hold no stories", "all 3 are empty lists",
         setup=empty_shards(["data00.json", "data01.json", "data02.json"])),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_rule_refuses_before_writing(case, world, tmp_path):  # noqa: F811  (world: the fixture)
    ctx = ctx_of(world, tmp_path)
    if case.setup:
        case.setup(ctx)
    roots = (tmp_path, world.root, world.corpus.cache_dir)
    before = snapshot(*roots)
    proc = run_main(case.script, case.argv(ctx), cwd=str(tmp_path))
    assert_error(proc, case.code, *case.fragments)
    assert_nothing_lost(before, snapshot(*roots), nothing_new=True)


# ---------------------------------------------------------------------- what the rules still accept

def parse(schema, **over):
    return schema.parse([f"--{k}={v}" for k, v in over.items()])


@pytest.mark.parametrize("over", [
    dict(warmup_iters=1000, max_iters=10, eval_only=True),          # no step: no schedule
    dict(warmup_iters=1000, max_iters=0),
    dict(warmup_iters=1000, max_iters=10, lr_decay_iters=100000),   # the first steps of a longer run's schedule
    dict(warmup_iters=1000, max_iters=10, lr_scheduling=False),     # constant learning rate
    dict(warmup_iters=1000, max_iters=10, decay_lr=False),
    dict(warmup_iters=10, max_iters=10),                            # the warmup ends with the run
    dict(grow_schedule="2:weights", max_iters=2, warmup_iters=0),   # growth after the last step
    dict(grow_schedule="2:weights,3:layers", max_iters=2, warmup_iters=0),  # reached thanks to the first shift
    dict(grow_schedule="auto", max_iters=2, warmup_iters=0),
    dict(grow_schedule="5:weights", max_iters=2, warmup_iters=0, init_from="resume_train"),  # its own shifts
], ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_rule_accepts(over):
    cfg = parse(TRAIN, **over)
    assert all(cfg[k] == v for k, v in over.items())


def test_finetune_defaults_still_parse():
    cfg = parse(FINETUNE_T0, model_dir="base")
    assert cfg["lr_scheduling"] is False and cfg["warmup_iters"] == 0


# ---------------------------------------------------------------------- notices: the run goes on

def test_plot_leaves_out_a_metric_never_logged_with_x(world, tmp_path):  # noqa: F811
    pytest.importorskip("matplotlib")
    ctx = ctx_of(world, tmp_path)
    plot_log(ctx)
    proc = run_main("plot.py", PLOT(ctx, "--x=tokens_per_s"))
    assert proc.returncode == 0, proc.stderr
    assert "notice: 1 metric(s) never logged with --x=tokens_per_s left out: loss/test" in proc.stdout
    assert "wrote" in proc.stdout and "(2 metric(s), 1 run(s))" in proc.stdout  # loss/train, tokens_per_s
    assert open(P(ctx.t, "curves.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_an_empty_raw_shard_is_named_and_left_out_of_kept_fraction(world, tmp_path):  # noqa: F811
    ctx = ctx_of(world, tmp_path)
    raw = P(copy_raw(ctx), "TinyStories_all_data")
    write(P(raw, "data01.json"), "[]")
    before = snapshot(raw)
    proc = run_main("tinystories.py", PRE(ctx, "--filtering=features!=Twist"))
    assert proc.returncode == 0, proc.stderr
    assert "notice: 1 raw shard(s) hold no stories ([]): data01.json" in proc.stdout
    manifest = json.load(open(P(ctx.t, "cache", "tok8192", "d", "manifest.json")))
    shards = {s["source"]: s for s in manifest["shards"]}
    # the stories a shard holds, from the raw files themselves
    for name in ("data00.json", "data01.json", "data02.json"):
        assert shards[name]["examples"] == len(json.load(open(P(raw, name))))
    full = [shards[n] for n in ("data00.json", "data02.json")]
    assert all(0 < s["kept"] < s["examples"] for s in full)  # the filter drops some stories of each
    assert manifest["kept_fraction"] == pytest.approx(sum(s["kept"] / s["examples"] for s in full) / 2)
    assert_nothing_lost(before, snapshot(raw))


def test_staged_training_warmup_longer_than_the_run_is_a_notice(tmp_path):
    """eval_wikitext.py train reproduces staged-training's trainer, which runs a warmup longer than
    --train-steps (get_linear_schedule_with_warmup: the rate rises all along): a notice, not an error."""
    from test_eval_wikitext import train as wikitext_train
    proc = wikitext_train(tmp_path, tmp_path / "run", steps=2, check=True)  # --warmup-steps 100
    assert "notice: --warmup-steps=100 is longer than --train-steps=2" in proc.stdout
    assert [r["iter"] for r in records(tmp_path / "run", "train")] == [0]  # it ran (a record every 10 steps)


# ---------------------------------------------------------------------- sweep.py: keys read without running the program

EXITS_AT_IMPORT = """\
import sys
learning_rate = 0.001
batch_size = 8
out_dir = "out/{batch_size}"
sys.exit(3)  # e.g. a program that refuses to run without a GPU
"""

RAISES_AT_IMPORT = """\
learning_rate = 0.001
batch_size = 8
out_dir = "out/{batch_size}"
raise RuntimeError("no GPU")
"""

SCHEMA_AT_RUN_TIME = """\
import json, os
from tinylab.config import Schema
SCHEMA = Schema.from_defaults("p.py", dict(learning_rate=0.001, batch_size=8, out_dir="out/{batch_size}"))
if __name__ == "__main__":
    cfg = SCHEMA.parse()
    os.makedirs(cfg["out_dir"], exist_ok=True)
    with open(os.path.join(cfg["out_dir"], "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"iter": 0, "loss/test": cfg["learning_rate"]}) + "\\n")
"""

NO_KEYS = """\
import sys
def main():
    sys.exit(0)
main()
"""

GRID = """\
program: p.py
method: grid
metric: {name: loss/test, goal: minimize}
parameters:
  batch_size: {values: [8, 16]}
"""


def sweep_in(tmp_path, program=None, yaml=GRID):
    if program is not None:
        (tmp_path / "p.py").write_text(program)
        (tmp_path / "s.yaml").write_text(yaml)
    return run_main("sweep.py", [str(tmp_path / "s.yaml"), f"--workdir={tmp_path}"], cwd=REPO,
                    env={"PYTHONPATH": REPO})


@pytest.mark.parametrize("program", [EXITS_AT_IMPORT, RAISES_AT_IMPORT], ids=["sys-exit", "raises"])
def test_sweep_reads_keys_without_running_the_program(tmp_path, program):
    proc = sweep_in(tmp_path, program)
    sweep_dir = tmp_path / "out" / "sweeps" / "s"
    assert proc.returncode == 1, proc.stderr
    # the sweep ran both runs (their keys were read from the source); both failed, and said why
    assert error_lines(proc.stderr) == [f"error: 2 run(s) failed: run-000, run-001 (logs in {sweep_dir})"]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: 2 run(s) failed") and "Traceback" not in proc.stderr
    results = [json.loads(line) for line in (sweep_dir / "results.jsonl").read_text().splitlines()]
    assert [(r["params"]["batch_size"], r["exit_code"]) for r in results] == [(8, 3 if "sys.exit" in program else 1),
                                                                             (16, 3 if "sys.exit" in program else 1)]
    if "raise" in program:
        assert "RuntimeError: no GPU" in (sweep_dir / "run-000.log").read_text()


def test_sweep_of_a_program_with_a_runtime_schema_is_unchecked_with_a_notice(tmp_path):
    proc = sweep_in(tmp_path, SCHEMA_AT_RUN_TIME, GRID.replace("batch_size: {values: [8, 16]}",
                                                                "batch_size: {values: [8, 16]}\n  not_a_key: {value: 1}"))
    # not checked: the unknown key reaches the program, which refuses it
    assert proc.returncode == 1
    assert "notice: p.py builds its SCHEMA when it runs" in proc.stderr and len(error_lines(proc.stderr)) == 1
    proc = sweep_in(tmp_path, SCHEMA_AT_RUN_TIME)
    assert proc.returncode == 0, proc.stderr
    assert "notice: p.py builds its SCHEMA when it runs" in proc.stderr and not error_lines(proc.stderr)
    assert json.loads((tmp_path / "out" / "16" / "metrics.jsonl").read_text())["loss/test"] == 0.001


@pytest.mark.parametrize("program,yaml,fragments", [
    (EXITS_AT_IMPORT, GRID.replace("batch_size", "batch_sise"), ("batch_sise", "unknown config key", "batch_size")),
    (EXITS_AT_IMPORT, GRID.replace("[8, 16]", "[8, x]"), ("batch_size", "expects int")),
    (NO_KEYS, GRID, ("p.py declares no config keys",)),
    ("learning_rate = 0.1\nbatch_size = (\n", GRID, ("p.py is not valid Python",)),
], ids=["unknown-key", "bad-value", "no-keys", "syntax-error"])
def test_sweep_refuses_keys_it_read_statically(tmp_path, program, yaml, fragments):
    (tmp_path / "p.py").write_text(program)
    (tmp_path / "s.yaml").write_text(yaml)
    before = snapshot(tmp_path)
    proc = sweep_in(tmp_path)
    assert_error(proc, 2, *fragments)
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


SLEEPER = """\
import os, signal, sys, time
pause = 0.0
if __name__ == "__main__":
    pause = float(sys.argv[1].split("=")[1])
    def stop(signum, frame):  # what train.py does on Ctrl-C: save, then exit 130
        open(f"stopped-{os.getpid()}", "w").close()
        sys.exit(130)
    signal.signal(signal.SIGINT, stop)
    open(f"started-{os.getpid()}", "w").close()
    time.sleep(pause)
"""


def test_ctrl_c_during_a_sweep(tmp_path):
    """SIGINT to sweep.py alone (its runs have sessions of their own): the running run gets one
    SIGINT and ends, no further run starts, the finished runs stay recorded, and the sweep ends
    with "error: interrupted", exit 130."""
    (tmp_path / "p.py").write_text(SLEEPER)
    (tmp_path / "s.yaml").write_text("program: p.py\nmethod: grid\nparameters:\n  pause: {values: [0.0, 60.0, 0.0]}\n")
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([PYTHON, P(REPO, "sweep.py"), str(tmp_path / "s.yaml"), f"--workdir={tmp_path}"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(tmp_path.glob("started-*"))) < 2 and proc.poll() is None:
        time.sleep(0.05)
    started = sorted(tmp_path.glob("started-*"), key=os.path.getmtime)
    assert len(started) == 2, proc.communicate(timeout=60)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted" and error_lines(stderr) == ["error: interrupted"]
    assert "Traceback" not in stderr
    long_pid = int(started[1].name.split("-")[1])
    assert (tmp_path / f"stopped-{long_pid}").exists()  # it got the SIGINT ...
    with pytest.raises(ProcessLookupError):
        os.kill(long_pid, 0)  # ... and is gone
    sweep_dir = tmp_path / "out" / "sweeps" / "s"
    results = [json.loads(line) for line in (sweep_dir / "results.jsonl").read_text().splitlines()]
    assert [(r["run"], r["exit_code"]) for r in results] == [("run-000", 0), ("run-001", 130)]
    assert not (sweep_dir / "run-002.log").exists() and len(started) == 2  # the third never started
    assert "sweep stopped" in stdout


# ---------------------------------------------------------------------- Ctrl-C during training

def interrupt_when_training(args, metrics, cwd):
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([PYTHON] + args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None and (
            not os.path.exists(metrics) or sum('"train"' in line for line in open(metrics)) < 3):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=180)
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train.py", "finetune_t0.py"])
def test_ctrl_c_during_training_ends_with_the_error_line(script, world, tmp_path):  # noqa: F811
    ctx = ctx_of(world, tmp_path)
    out = P(ctx.t, "run")
    if script == "train.py":
        args = train_argv(world.corpus, out, max_iters=100000, eval_interval=100000)
    else:
        args = T0(ctx, out_dir=out, max_iters=100000, eval_interval=100000, rank_eval_examples=0)
    proc = interrupt_when_training([P(REPO, script)] + args, P(out, "metrics.jsonl"), cwd=str(tmp_path))
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "stopped at iteration" in proc.stdout and "resume with --init_from=resume_train" in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == "error: interrupted" and error_lines(proc.stderr) == ["error: interrupted"], proc.stderr
    assert "Traceback" not in proc.stderr
    import torch
    assert torch.load(P(out, "ckpt.pt"), weights_only=False)["iter_num"] >= 3
