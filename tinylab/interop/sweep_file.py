"""A wandb sweep YAML as `wandb agent` reads it: the file checked key by key, its grid / random
configurations (seeded draws from W&B's distributions), and each run's argv built exactly as the
agent builds it. The YAML keys and macros are in docs/interop.md §4; sweeps.py runs the sweep.
"""
import itertools
import json
import math
import os
import platform
import random
import re
import sys

from tinylab.core.errors import UserError
from tinylab.core.fileio import read_text

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
