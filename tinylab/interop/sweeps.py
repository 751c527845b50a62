"""The offline sweep runner behind sweep.py: read a wandb sweep YAML, expand its grid / random
configurations (seeded), check them against the program's schema, build each run's argv exactly
as `wandb agent` builds it, run the runs and record their results. What it does, rule by rule,
is sweep.py's docstring; the YAML keys and macros are in docs/interop.md §4.
"""
import ast
import collections
import itertools
import json
import math
import os
import platform
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tinylab import REPO  # the repository
from tinylab.core.config import Schema
from tinylab.core.errors import UserError
from tinylab.core.fileio import read_text
from tinylab.core.outputs import guard_folder
from tinylab.schema import DRIVERS

DEFAULT_COMMAND = ["${env}", "${interpreter}", "${program}", "${args}"]
ENVVAR_MACRO = re.compile(r"\$\{envvar\:([A-Z0-9_]*)\}")  # the agent's own pattern
ARG_MACROS = ("args", "args_no_equals", "args_no_hyphens", "args_no_boolean_flags", "args_json")
MACROS = ("env", "interpreter", "program", "args_json_file") + ARG_MACROS
TOP_KEYS = {"program", "method", "parameters", "name", "description", "project", "entity", "metric",
            "early_terminate", "command", "run_cap", "controller", "job", "image_uri"}
PARAM_KEYS = {"value", "values", "probabilities", "distribution", "min", "max", "mu", "sigma", "q"}
DISTRIBUTIONS = ("constant", "categorical", "int_uniform", "uniform", "q_uniform", "log_uniform",
                 "log_uniform_values", "q_log_uniform", "q_log_uniform_values", "inv_log_uniform",
                 "inv_log_uniform_values", "normal", "q_normal", "log_normal", "q_log_normal")


# ---------------------------------------------------------------------- reading the YAML

def _number(x, what):
    # PyYAML reads 1e-4 (no dot) as a string; a bound that looks like a number is one
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            pass
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise UserError(f"{what} must be a number, not {x!r}")
    return x


def distribution_of(name, spec):
    """The parameter's distribution, explicit or inferred as W&B does."""
    dist = spec.get("distribution")
    if dist is None:
        if "values" in spec:
            return "categorical"
        if "value" in spec:
            return "constant"
        if "min" in spec and "max" in spec:
            both_int = all(isinstance(spec[k], int) and not isinstance(spec[k], bool) for k in ("min", "max"))
            return "int_uniform" if both_int else "uniform"
        raise UserError(f"parameter '{name}' needs value, values, or min and max")
    if dist not in DISTRIBUTIONS:
        raise UserError(f"parameter '{name}': unknown distribution '{dist}' (known: {', '.join(DISTRIBUTIONS)})")
    return dist


def check_parameter(name, spec):
    if not isinstance(spec, dict):
        raise UserError(f"parameter '{name}' must be a mapping such as {{values: [...]}} or {{value: x}}, not {spec!r}")
    if "parameters" in spec:
        raise UserError(f"parameter '{name}' has nested parameters, which our flat config cannot take")
    unknown = sorted(set(spec) - PARAM_KEYS)
    if unknown:
        raise UserError(f"parameter '{name}': unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(PARAM_KEYS))})")
    dist = distribution_of(name, spec)
    if dist == "categorical":
        if not isinstance(spec.get("values"), list) or not spec["values"]:
            raise UserError(f"parameter '{name}': values must be a non-empty list")
        probs = spec.get("probabilities")
        if probs is not None and (len(probs) != len(spec["values"]) or abs(sum(probs) - 1) > 1e-6):
            raise UserError(f"parameter '{name}': probabilities must match values one to one and sum to 1")
    elif dist == "constant" and "value" not in spec:
        raise UserError(f"parameter '{name}': distribution constant needs a value")
    elif dist not in ("constant", "categorical"):
        for key in ("min", "max", "mu", "sigma", "q"):
            if key in spec:
                spec[key] = _number(spec[key], f"parameter '{name}': {key}")
        if "normal" not in dist:
            if "min" not in spec or "max" not in spec or spec["min"] > spec["max"]:
                raise UserError(f"parameter '{name}': distribution {dist} needs min <= max")
            if dist.endswith("_values") and spec["min"] <= 0:
                raise UserError(f"parameter '{name}': distribution {dist} needs min > 0")
        if dist == "int_uniform" and not all(isinstance(spec[k], int) for k in ("min", "max")):
            raise UserError(f"parameter '{name}': int_uniform needs integer min and max")


def load_sweep(path):
    import yaml
    text = read_text(path, "sweep file")
    try:
        sweep = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"{path} is not valid YAML ({' '.join(str(e).split())[:160]})")
    if not isinstance(sweep, dict):
        raise UserError(f"{path} is not a sweep configuration (expected a mapping with program, method, parameters)")
    try:
        for key in ("program", "method", "parameters"):
            if key not in sweep:
                raise UserError(f"the required key '{key}' is missing")
        unknown = sorted(set(sweep) - TOP_KEYS)
        if unknown:
            raise UserError(f"unknown top-level key(s) {', '.join(unknown)}")
        method = sweep["method"]
        if method == "bayes":
            raise UserError("method bayes needs the W&B server's optimizer; use grid or random offline")
        if method not in ("grid", "random"):
            raise UserError(f"unknown method '{method}' (grid or random; bayes needs the W&B server)")
        if not isinstance(sweep["parameters"], dict) or not sweep["parameters"]:
            raise UserError("parameters must be a non-empty mapping")
        for name, spec in sweep["parameters"].items():
            check_parameter(name, spec)
            if method == "grid" and distribution_of(name, spec) not in ("constant", "categorical"):
                raise UserError(f"method grid needs values for parameter '{name}', not a {distribution_of(name, spec)} distribution")
        command = sweep.get("command", DEFAULT_COMMAND)
        if not isinstance(command, list) or not command:
            raise UserError("command must be a non-empty list")
        for item in command:
            item = str(item)
            if item.startswith("${") and item.endswith("}") and not ENVVAR_MACRO.fullmatch(item) and item[2:-1] not in MACROS:
                # the agent would silently drop it; a typo should not vanish
                raise UserError(f"unknown command macro {item} (known: {', '.join('${' + m + '}' for m in MACROS)}, ${{envvar:NAME}})")
        metric = sweep.get("metric") or {}
        if metric and (not isinstance(metric, dict) or "name" not in metric or metric.get("goal", "minimize") not in ("minimize", "maximize")):
            raise UserError("metric must be {name: ..., goal: minimize|maximize}")
    except UserError as e:
        raise UserError(f"{path}: {e}")
    if "early_terminate" in sweep:
        print(f"warning: {path}: early_terminate is ignored offline (every run goes to the end)", file=sys.stderr)
    return sweep


def program_schema(program, workdir):
    """The config keys of the sweep's program, read without running it (a program may exit or
    fail at import, and its runs should report that, not the sweep): this repository's drivers by
    name (schema.py); any other Python program statically, from its source: a module-level
    DEFAULTS dict literal, or its module-level assignments of literals (nanoGPT-style configurator
    programs). None, with a notice, for a program whose module-level SCHEMA only running it could
    build: its parameters are then not checked."""
    path = os.path.join(workdir, program)
    if not os.path.isfile(path):
        raise UserError(f"program {program} not found in {workdir}")
    if os.path.realpath(path) == os.path.realpath(os.path.join(REPO, program)) and program in DRIVERS:
        return DRIVERS[program]
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


# ---------------------------------------------------------------------- configurations

def grid_configs(params):
    names = list(params)
    choices = [params[n]["values"] if "values" in params[n] else [params[n]["value"]] for n in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*choices)]


def draw(spec, dist, rng):
    """One value of a W&B distribution (definitions: W&B 'Sweep configuration options')."""
    if dist == "constant":
        return spec["value"]
    if dist == "categorical":
        return rng.choices(spec["values"], weights=spec.get("probabilities"))[0]
    if dist == "int_uniform":
        return rng.randint(spec["min"], spec["max"])  # both ends included
    lo, hi = spec.get("min"), spec.get("max")
    base = dist[2:] if dist.startswith("q_") else dist
    if base == "uniform":
        x = rng.uniform(lo, hi)
    elif base == "log_uniform":  # bounds are natural logs
        x = math.exp(rng.uniform(lo, hi))
    elif base == "log_uniform_values":
        x = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    elif base == "inv_log_uniform":  # log(1/X) uniform in [min, max]
        x = math.exp(-rng.uniform(lo, hi))
    elif base == "inv_log_uniform_values":  # log(1/X) uniform in [log(1/max), log(1/min)]
        x = math.exp(-rng.uniform(math.log(1 / hi), math.log(1 / lo)))
    elif base == "normal":
        x = rng.gauss(spec.get("mu", 0.0), spec.get("sigma", 1.0))
    else:  # log_normal
        x = math.exp(rng.gauss(spec.get("mu", 0.0), spec.get("sigma", 1.0)))
    if dist.startswith("q_"):
        q = spec.get("q", 1)
        x = round(x / q) * q
        if isinstance(q, int):  # as the W&B sweeps library: an integer q gives integers
            x = int(x)
    return x


def random_configs(params, count, seed):
    rng = random.Random(seed)
    return [{name: draw(spec, distribution_of(name, spec), rng) for name, spec in params.items()} for _ in range(count)]


def configurations(sweep, count=None, seed=0):
    cap = count if count is not None else sweep.get("run_cap")
    if sweep["method"] == "grid":
        configs = grid_configs(sweep["parameters"])
        return configs if cap is None else configs[:cap]
    if cap is None:
        raise UserError("method random needs --count=N (or run_cap in the YAML)")
    return random_configs(sweep["parameters"], cap, seed)


# ---------------------------------------------------------------------- commands

def command_args(values):
    """The agent's argument lists for one configuration (wandb sdk/launch/sweeps/utils.py,
    create_sweep_command_args): values formatted with str(), booleans True/False."""
    out = {m: [] for m in ARG_MACROS}
    for key, value in values.items():
        out["args"].append(f"--{key}={value}")
        out["args_no_hyphens"].append(f"{key}={value}")
        out["args_no_equals"] += [f"--{key}", str(value)]
        if isinstance(value, bool):
            if value:  # a bare flag when true, nothing when false
                out["args_no_boolean_flags"].append(f"--{key}")
        else:
            out["args_no_boolean_flags"].append(f"--{key}={value}")
    out["args_json"] = [json.dumps(values)]
    return out


def build_command(command, program, values, json_file, environ=None):
    """argv list for one run, built as wandb agent builds it."""
    environ = os.environ if environ is None else environ
    macros = command_args(values)
    macros.update(interpreter=["python"], program=[program], args_json_file=[json_file])
    if platform.system() != "Windows":
        macros["env"] = ["/usr/bin/env"]
    argv = []
    for item in command:
        # ${envvar:NAME} anywhere in an item; a variable that is not set leaves NAME (agent behaviour)
        item = ENVVAR_MACRO.sub(lambda m: environ.get(m.group(1), m.group(1)), str(item))
        if item.startswith("${") and item.endswith("}"):
            argv += macros.get(item[2:-1]) or []
        else:
            argv.append(item)
    return argv


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

def run_sweep(sweep_path, count=None, seed=0, dry_run=False, out_dir=None, wandb_mode="offline", parallel=1,
              workdir=REPO):
    """Check every configuration, then run them one after another (or `parallel` at a time);
    ends with an error line and exit 1 when a run failed; after Ctrl-C the runs in progress are
    stopped (stop_runs) and "error: interrupted", exit 130, follows (finished runs stay recorded)."""
    sweep = load_sweep(sweep_path)
    workdir = os.path.abspath(workdir)
    schema = program_schema(str(sweep["program"]), workdir)
    params = sweep["parameters"]
    configs = configurations(sweep, count, seed)
    if schema is not None:
        check_configs(configs, schema, f"{sweep_path} ({sweep['program']})")

    stem = os.path.splitext(os.path.basename(sweep_path))[0]
    sweep_dir = os.path.join(workdir, out_dir or os.path.join("out", "sweeps", stem))
    sweep_dir = os.path.abspath(sweep_dir)
    # a new folder, or this sweep's own (continued); never a run folder or someone else's (outputs.py)
    guard_folder(sweep_dir, "sweep", inputs=[sweep_path], flag="--out_dir")
    command = sweep.get("command", DEFAULT_COMMAND)
    metric = sweep.get("metric") or {}
    runs = [{"run": f"run-{i:03d}", "params": values,
             "argv": build_command(command, str(sweep["program"]), values, os.path.join(sweep_dir, f"run-{i:03d}.args.json"))}
            for i, values in enumerate(configs)]
    out_dirs = [run_out_dir(r["argv"], str(sweep["program"]), schema, workdir) for r in runs]
    if None not in out_dirs and len(set(out_dirs)) < len(out_dirs):
        # e.g. a config without an {placeholder} out_dir: the runs would overwrite each other
        print(f"note: runs would share out_dir {collections.Counter(out_dirs).most_common(1)[0][0]}; "
              f"each run gets --out_dir={os.path.join(sweep_dir, 'run-NNN')} instead", file=sys.stderr)
        for r in runs:
            r["argv"].append(f"--out_dir={os.path.join(sweep_dir, r['run'])}")
        out_dirs = [os.path.join(sweep_dir, r["run"]) for r in runs]
    for r, out in zip(runs, out_dirs):
        r["out_dir"] = None if out is None else os.path.join(workdir, out)

    if dry_run:
        for r in runs:
            print(shlex.join(r["argv"]))
        print(f"# {len(runs)} run(s); method {sweep['method']}; would run in {workdir} with WANDB_MODE={wandb_mode}")
        return

    results_path = os.path.join(sweep_dir, "results.jsonl")
    done = {_key(r["params"]) for r in read_results(results_path) if r.get("exit_code") == 0}
    todo = [r for r in runs if _key(r["params"]) not in done]
    if len(todo) < len(runs):
        print(f"skipping {len(runs) - len(todo)} configuration(s) already completed in {results_path}")
    os.makedirs(sweep_dir, exist_ok=True)
    env = dict(os.environ, WANDB_MODE=wandb_mode)
    # `python` in the agent's command should be this interpreter (e.g. an unactivated venv)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    lock, children = threading.Lock(), Children()

    def execute(r):
        if children.stopping:
            return None
        if "${args_json_file}" in command:
            with open(os.path.join(sweep_dir, f"{r['run']}.args.json"), "w") as f:
                f.write(json.dumps(r["params"]))
        log_path = os.path.join(sweep_dir, f"{r['run']}.log")
        with lock:
            print(f"=== {r['run']}: {shlex.join(r['argv'])}", flush=True)
        metrics_path = os.path.join(r["out_dir"], "metrics.jsonl") if r["out_dir"] else ""
        offset = os.path.getsize(metrics_path) if os.path.isfile(metrics_path) else 0
        t0 = time.time()
        code = run_command(r["argv"], env, workdir, log_path, parallel == 1, children)
        if code is None:  # not started: the sweep was interrupted
            return None
        final, best = metric_values(metrics_path, metric.get("name"), metric.get("goal", "minimize"), offset)
        record = {**r, "exit_code": code, "metric": metric.get("name"), "final": final, "best": best,
                  "seconds": round(time.time() - t0, 2), "log": log_path}
        with lock:
            with open(results_path, "a") as f:
                f.write(json.dumps(record, default=str) + "\n")
            print(f"=== {r['run']} exited {code}" + (f"; {metric['name']} final {_fmt(final)}" if metric.get("name") else ""), flush=True)
        return record

    pool = ThreadPoolExecutor(max_workers=parallel)
    try:
        list(pool.map(execute, todo))
    except KeyboardInterrupt:
        stop_runs(pool, children)
        print(f"sweep stopped; the runs so far are recorded in {results_path}")
        raise  # cli_main: "error: interrupted", exit 130
    pool.shutdown()
    latest = {}
    for r in read_results(results_path):  # a re-run's record replaces the earlier one
        latest[_key(r["params"])] = r
    table = [latest[_key(r["params"])] for r in runs if _key(r["params"]) in latest]
    print_table(table, list(params), metric.get("name"))
    print(f"results: {results_path}")
    failed = [r["run"] for r in table if r["exit_code"] != 0]
    if failed:  # the error convention's one line, with exit 1: the sweep ran, some runs did not succeed
        sys.stdout.flush()
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)} (logs in {sweep_dir})", file=sys.stderr,
              flush=True)
        sys.exit(1)

