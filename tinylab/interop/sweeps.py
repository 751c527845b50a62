"""The offline sweep runner behind sweep.py: check a sweep's configurations (sweep_file.py) against
the program's keys, run the runs and record their results. What it does, rule by rule, is
sweep.py's docstring; the YAML keys and macros are in docs/interop.md §4.
"""
import ast
import collections
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tinylab import REPO  # the repository
from tinylab.core.config import Schema
from tinylab.core.errors import UserError
from tinylab.core.fileio import read_text
from tinylab.core.outputs import guard_folder
from tinylab.interop.sweep_file import DEFAULT_COMMAND, build_command, configurations, load_sweep

# ---------------------------------------------------------------------- the program's keys

def program_schema(program, workdir, drivers):
    """The config keys of the sweep's program, read without running it (a program may exit or
    fail at import, and its runs should report that, not the sweep): this repository's drivers by
    name (`drivers`, {file name: Schema}, which sweep.py takes from schema.py); any other Python
    program statically, from its source: a module-level DEFAULTS dict literal, or its module-level
    assignments of literals (nanoGPT-style configurator programs). None, with a notice, for a program whose module-level SCHEMA only running it could
    build: its parameters are then not checked."""
    path = os.path.join(workdir, program)
    if not os.path.isfile(path):
        raise UserError(f"program {program} not found in {workdir}")
    if os.path.realpath(path) == os.path.realpath(os.path.join(REPO, program)) and program in drivers:
        return drivers[program]
    if not program.endswith(".py"):
        raise UserError(f"program {program} is not a Python file; its config keys cannot be checked")
    try:
        tree = ast.parse(read_text(path, "program"), filename=program)
    except SyntaxError as e:
        raise UserError(f"{program} is not valid Python (line {e.lineno}: {e.msg}), so its config keys cannot be read")
    assigned = module_literals(tree)
    if isinstance(assigned.get("DEFAULTS"), dict):
        return Schema.from_defaults(program, assigned["DEFAULTS"])
    if any(isinstance(t, ast.Name) and t.id == "SCHEMA" for t in _assign_targets(tree)):
        print(f"notice: {program} builds its SCHEMA when it runs, which the sweep does not do: the parameters are "
              f"not checked against its keys", file=sys.stderr)
        return None
    keys = {k: v for k, v in assigned.items() if not k.startswith("_") and (v is None or type(v) in CONFIG_TYPES)}
    if not keys:
        raise UserError(f"{program} declares no config keys the sweep can read (a module-level DEFAULTS dict, "
                        f"assignments of literals such as batch_size = 32, or SCHEMA), so the sweep's parameters "
                        f"cannot be checked")
    return Schema.from_defaults(program, keys)


CONFIG_TYPES = (bool, int, float, str, list, dict)  # config.Key's types


def _assign_targets(tree):
    for node in tree.body:
        if isinstance(node, ast.Assign):
            yield from node.targets
        elif isinstance(node, ast.AnnAssign):
            yield node.target


def module_literals(tree) -> dict:
    """{name: value} of the module-level `name = <literal>` assignments (the last one wins, as at
    run time); a name later assigned something that is not a literal is left out."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        try:
            literal = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            for n in names:
                out.pop(n, None)
            continue
        for n in names:
            out[n] = literal
    return out


def check_configs(configs, schema: Schema, where):
    """Every parameter a config key of the program, every value of its type and range."""
    for values in configs:
        for key, value in values.items():
            try:
                k = schema.key(key, f"--{key}")
                k.validate(k.from_text(str(value), f"--{key}"), f"--{key}")
            except UserError as e:
                raise UserError(f"{where}: parameter '{key}': {e}")


def run_out_dir(argv, program, schema: Schema, workdir):
    """The out_dir the program will use for this argv: its arguments after `program` parsed by its
    schema (config files included, out_dir templates filled, every rule checked), as the child
    will parse them. None when the command has no `program` item, the program has no out_dir or
    its keys are unknown (schema None)."""
    if schema is None or program not in argv or "out_dir" not in schema.keys:
        return None
    cwd = os.getcwd()
    os.chdir(workdir)  # config files in the command are relative to where the run starts
    try:
        return schema.parse(argv[argv.index(program) + 1:])["out_dir"]
    except UserError as e:
        raise UserError(f"{program} would reject the command {shlex.join(argv)}: {e}")
    finally:
        os.chdir(cwd)


# ---------------------------------------------------------------------- running

def metric_values(metrics_path, name, goal, offset=0):
    """(final, best) numeric values of `name` in the records a run added to its metrics.jsonl
    after byte `offset` (a re-run of a failed configuration appends to the old log), or (None, None)."""
    if not name or not os.path.isfile(metrics_path):
        return None, None
    with open(metrics_path, "rb") as f:
        if os.path.getsize(metrics_path) >= offset:
            f.seek(offset)  # otherwise the run rewrote the file: read it all
        lines = f.read().decode("utf-8", "replace").splitlines()
    vals = []
    for line in lines:
        try:
            v = json.loads(line).get(name)
        except (ValueError, AttributeError):
            continue  # a torn last line after a crash, or a non-record
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals.append(v)
    if not vals:
        return None, None
    return vals[-1], (max(vals) if goal == "maximize" else min(vals))


class Children:
    """The runs in progress. Each starts in a session of its own, so that a Ctrl-C at the terminal
    reaches the sweep alone and the sweep passes exactly one SIGINT on to each run (to its process
    group, as a terminal would: train.py then saves a checkpoint and exits 130); a second SIGINT
    would make a run abort without its checkpoint. After interrupt() no further run starts."""

    def __init__(self):
        self.lock, self.procs, self.stopping = threading.Lock(), set(), False

    def start(self, argv, **kwargs):
        with self.lock:
            if self.stopping:
                return None
            proc = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL, **kwargs)
            self.procs.add(proc)
            return proc

    def finished(self, proc):
        with self.lock:
            self.procs.discard(proc)

    def interrupt(self):
        with self.lock:
            self.stopping = True
            procs = list(self.procs)
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:  # it has just ended
                pass


def run_command(argv, env, cwd, log_path, echo, children: Children):
    """Run one command; its output goes to log_path (and to our stdout when `echo`). Returns its
    exit code, or None when the sweep is stopping and the run was not started."""
    with open(log_path, "wb") as log:
        proc = children.start(argv, cwd=cwd, env=env, stdout=subprocess.PIPE if echo else log,
                              stderr=subprocess.STDOUT)
        if proc is None:
            os.remove(log_path)  # (an empty log of a run that never ran would read as a crash)
            return None
        try:
            if echo:
                raw = getattr(sys.stdout, "buffer", None)  # (a text-only stdout, e.g. redirected in-process, has none)
                for line in proc.stdout:
                    log.write(line)
                    if raw is not None:
                        raw.write(line)
                    else:
                        sys.stdout.write(line.decode("utf-8", "replace"))
                    sys.stdout.flush()
            return proc.wait()
        finally:
            children.finished(proc)


def stop_runs(pool, children: Children):
    """Ctrl-C: SIGINT to the runs in progress, no further run, and wait until they have ended (and
    their records are written); a Ctrl-C while waiting is passed on too."""
    children.interrupt()
    while True:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
            return
        except KeyboardInterrupt:
            children.interrupt()


def read_results(path):
    from tinylab.core.metrics import (
        read_metrics,  # the same JSONL reader (tolerates a torn last line)
    )
    return read_metrics(path) if os.path.isfile(path) else []


def _key(values):
    return json.dumps(values, sort_keys=True, default=str)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def print_table(results, param_names, metric_name):
    cols = ["run"] + list(param_names) + ["exit"] + ([f"{metric_name} (final)", "best"] if metric_name else [])
    rows = [[r["run"]] + [_fmt(r["params"].get(p)) for p in param_names] + [str(r["exit_code"])]
            + ([_fmt(r.get("final")), _fmt(r.get("best"))] if metric_name else []) for r in results]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    for row in [cols] + rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


# ---------------------------------------------------------------------- the sweep, start to end

@dataclass
class SweepPlan:
    """Every run of a checked sweep: {"run", "params", "argv", "out_dir"} each, in order."""
    sweep: dict
    workdir: str
    sweep_dir: str
    runs: list

    @property
    def command(self):
        return self.sweep.get("command", DEFAULT_COMMAND)

    @property
    def metric(self):
        return self.sweep.get("metric") or {}

    @property
    def results_path(self):
        return os.path.join(self.sweep_dir, "results.jsonl")


def plan_sweep(sweep_path, drivers, count, seed, out_dir, workdir) -> SweepPlan:
    """Read and check the sweep, every configuration against the program's keys, and its folder;
    build each run's argv and find its out_dir. Nothing is written."""
    sweep = load_sweep(sweep_path)
    workdir = os.path.abspath(workdir)
    program = str(sweep["program"])
    schema = program_schema(program, workdir, drivers)
    configs = configurations(sweep, count, seed)
    if schema is not None:
        check_configs(configs, schema, f"{sweep_path} ({program})")

    stem = os.path.splitext(os.path.basename(sweep_path))[0]
    sweep_dir = os.path.abspath(os.path.join(workdir, out_dir or os.path.join("out", "sweeps", stem)))
    # a new folder, or this sweep's own (continued); never a run folder or someone else's (outputs.py)
    guard_folder(sweep_dir, "sweep", inputs=[sweep_path], flag="--out_dir")
    command = sweep.get("command", DEFAULT_COMMAND)
    runs = [{"run": f"run-{i:03d}", "params": values,
             "argv": build_command(command, program, values, os.path.join(sweep_dir, f"run-{i:03d}.args.json"))}
            for i, values in enumerate(configs)]
    assign_out_dirs(runs, program, schema, workdir, sweep_dir)
    return SweepPlan(sweep, workdir, sweep_dir, runs)


def assign_out_dirs(runs, program, schema, workdir, sweep_dir):
    """Each run's out_dir (absolute; None when unknown), as the program will compute it; runs that
    would share one get --out_dir=<sweep folder>/run-NNN appended instead."""
    out_dirs = [run_out_dir(r["argv"], program, schema, workdir) for r in runs]
    if None not in out_dirs and len(set(out_dirs)) < len(out_dirs):
        # e.g. a config without an {placeholder} out_dir: the runs would overwrite each other
        print(f"note: runs would share out_dir {collections.Counter(out_dirs).most_common(1)[0][0]}; "
              f"each run gets --out_dir={os.path.join(sweep_dir, 'run-NNN')} instead", file=sys.stderr)
        for r in runs:
            r["argv"].append(f"--out_dir={os.path.join(sweep_dir, r['run'])}")
        out_dirs = [os.path.join(sweep_dir, r["run"]) for r in runs]
    for r, out in zip(runs, out_dirs):
        r["out_dir"] = None if out is None else os.path.join(workdir, out)


def print_dry_run(plan: SweepPlan, wandb_mode):
    for r in plan.runs:
        print(shlex.join(r["argv"]))
    print(f"# {len(plan.runs)} run(s); method {plan.sweep['method']}; would run in {plan.workdir} with "
          f"WANDB_MODE={wandb_mode}")


class RunExecutor:
    """Runs one configuration (called from the pool's threads): its command, its log, the metric's
    values from its metrics.jsonl, and its record appended to results.jsonl."""

    def __init__(self, plan: SweepPlan, wandb_mode, echo):
        self.plan, self.echo = plan, echo
        self.env = dict(os.environ, WANDB_MODE=wandb_mode)
        # `python` in the agent's command should be this interpreter (e.g. an unactivated venv)
        self.env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + self.env.get("PATH", "")
        self.lock, self.children = threading.Lock(), Children()

    def __call__(self, r):
        plan, metric = self.plan, self.plan.metric
        if self.children.stopping:
            return None
        if "${args_json_file}" in plan.command:
            with open(os.path.join(plan.sweep_dir, f"{r['run']}.args.json"), "w") as f:
                f.write(json.dumps(r["params"]))
        log_path = os.path.join(plan.sweep_dir, f"{r['run']}.log")
        with self.lock:
            print(f"=== {r['run']}: {shlex.join(r['argv'])}", flush=True)
        metrics_path = os.path.join(r["out_dir"], "metrics.jsonl") if r["out_dir"] else ""
        offset = os.path.getsize(metrics_path) if os.path.isfile(metrics_path) else 0
        t0 = time.time()
        code = run_command(r["argv"], self.env, plan.workdir, log_path, self.echo, self.children)
        if code is None:  # not started: the sweep was interrupted
            return None
        final, best = metric_values(metrics_path, metric.get("name"), metric.get("goal", "minimize"), offset)
        record = {**r, "exit_code": code, "metric": metric.get("name"), "final": final, "best": best,
                  "seconds": round(time.time() - t0, 2), "log": log_path}
        with self.lock:
            with open(plan.results_path, "a") as f:
                f.write(json.dumps(record, default=str) + "\n")
            print(f"=== {r['run']} exited {code}" + (f"; {metric['name']} final {_fmt(final)}" if metric.get("name") else ""), flush=True)
        return record


def execute_runs(plan: SweepPlan, wandb_mode, parallel):
    """Run the configurations not yet completed (exit code 0 in results.jsonl), `parallel` at a
    time; Ctrl-C stops the runs in progress and re-raises once their records are written."""
    done = {_key(r["params"]) for r in read_results(plan.results_path) if r.get("exit_code") == 0}
    todo = [r for r in plan.runs if _key(r["params"]) not in done]
    if len(todo) < len(plan.runs):
        print(f"skipping {len(plan.runs) - len(todo)} configuration(s) already completed in {plan.results_path}")
    os.makedirs(plan.sweep_dir, exist_ok=True)
    execute = RunExecutor(plan, wandb_mode, echo=parallel == 1)
    pool = ThreadPoolExecutor(max_workers=parallel)
    try:
        list(pool.map(execute, todo))
    except KeyboardInterrupt:
        stop_runs(pool, execute.children)
        print(f"sweep stopped; the runs so far are recorded in {plan.results_path}")
        raise  # cli_main: "error: interrupted", exit 130
    pool.shutdown()


def report_results(plan: SweepPlan):
    """The table of every run's latest record; a failed run ends the sweep with one error line, exit 1."""
    latest = {}
    for r in read_results(plan.results_path):  # a re-run's record replaces the earlier one
        latest[_key(r["params"])] = r
    table = [latest[_key(r["params"])] for r in plan.runs if _key(r["params"]) in latest]
    print_table(table, list(plan.sweep["parameters"]), plan.metric.get("name"))
    print(f"results: {plan.results_path}")
    failed = [r["run"] for r in table if r["exit_code"] != 0]
    if failed:  # the error convention's one line, with exit 1: the sweep ran, some runs did not succeed
        sys.stdout.flush()
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)} (logs in {plan.sweep_dir})", file=sys.stderr,
              flush=True)
        sys.exit(1)


def run_sweep(sweep_path, count=None, seed=0, dry_run=False, out_dir=None, wandb_mode="offline", parallel=1,
              workdir=REPO, *, drivers):
    """Check every configuration, then run them one after another (or `parallel` at a time);
    ends with an error line and exit 1 when a run failed; after Ctrl-C the runs in progress are
    stopped (stop_runs) and "error: interrupted", exit 130, follows (finished runs stay recorded).
    `drivers`: {file name: Schema} of this repository's programs (sweep.py passes schema.py's)."""
    plan = plan_sweep(sweep_path, drivers, count, seed, out_dir, workdir)
    if dry_run:
        print_dry_run(plan, wandb_mode)
        return
    execute_runs(plan, wandb_mode, parallel)
    report_results(plan)
