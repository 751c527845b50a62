"""The configurator shared by every driver (train.py, finetune_t0.py, ...), in nanoGPT style.

    python train.py configs/a.py configs/b.py --key=value --other=1e-4

Config files are Python, exec'd in order with the current config as their namespace; then each
`--key=value` override is parsed with ast.literal_eval (a bare word stays a string) and checked
against the type of the default. An int is accepted where a float is expected. Every mistake is a
one-line UserError: unknown key (with the closest key suggested), `--key value` without `=`,
a wrong type, a missing config file. `--help` lists every key with its default.
"""
import argparse
import ast
import difflib
import os
import sys

from tinylab.errors import UserError

# spellings users type from older READMEs and the original study's configs
ALIASES = {"lr": "learning_rate", "generation_eval_batch_size": "generation_batch_size"}


def _closest(key, keys):
    match = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _check_type(key, value, default, source):
    """Return `value` converted to the default's type, or raise a UserError."""
    if default is None:
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif isinstance(default, int) and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif isinstance(default, str) and isinstance(value, str):
        return value
    elif isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(default)(value)
    elif isinstance(default, (list, tuple)) and isinstance(value, str):
        # the original study's configs write lists as "a,b,c" (eval_dataset_names, wandb_tags)
        return type(default)(s.strip() for s in value.split(",") if s.strip())
    elif isinstance(default, dict) and isinstance(value, dict):
        return value
    elif type(value) is type(default):
        return value
    raise UserError(f"{source}: config key '{key}' expects {type(default).__name__} "
                    f"(default {default!r}), got {type(value).__name__} {value!r}")


def format_help(defaults: dict, prog: str) -> str:
    lines = [f"usage: python {prog} [config.py ...] [--key=value ...]", "", "config keys (default):"]
    width = max(len(k) for k in defaults)
    for k, v in defaults.items():
        lines.append(f"  --{k.ljust(width)} = {v!r}")
    if ALIASES:
        lines.append("")
        lines.append("aliases: " + ", ".join(f"--{a} = --{k}" for a, k in ALIASES.items()))
    return "\n".join(lines)


def apply_config_file(config: dict, defaults: dict, path: str):
    if not os.path.isfile(path):
        raise UserError(f"config file not found: {path}")
    namespace = dict(config, __file__=os.path.abspath(path))  # lets a config include another
    with open(path) as f:
        source = f.read()
    try:
        exec(compile(source, path, "exec"), namespace)
    except Exception as e:  # a broken config file is the user's to fix: name it and the line
        raise UserError(f"config file {path} failed: {type(e).__name__}: {e}")
    for key, value in namespace.items():
        if key.startswith("_") or callable(value) or type(value).__name__ == "module":
            continue
        if key in config and value is config[key]:
            continue  # untouched by this file
        key = ALIASES.get(key, key)
        if key not in defaults:
            raise UserError(f"{path}: unknown config key '{key}'{_closest(key, list(defaults))}")
        config[key] = _check_type(key, value, defaults[key], path)


def apply_override(config: dict, defaults: dict, arg: str):
    body = arg[2:]
    if "=" not in body:
        raise UserError(f"argument {arg} has no value: use --key=value (e.g. {arg}=...)")
    key, raw = body.split("=", 1)
    key = ALIASES.get(key, key)
    if key not in defaults:
        raise UserError(f"unknown config key '{key}'{_closest(key, list(defaults))}")
    try:
        value = ast.literal_eval(raw)
    except (SyntaxError, ValueError):
        value = raw  # a bare word such as --device=cpu is a string
    if isinstance(defaults[key], str) and not isinstance(value, str):
        value = raw  # e.g. --dataset_name=123 stays the string "123"
    config[key] = _check_type(key, value, defaults[key], f"--{key}")


def parse_config(defaults: dict, argv=None, prog="train.py") -> dict:
    """Return a new config dict: defaults, then config files, then --key=value overrides."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(format_help(defaults, prog))
        sys.exit(0)
    config = dict(defaults)
    for arg in argv:
        if arg.startswith("--"):
            apply_override(config, defaults, arg)
        elif arg.startswith("-"):
            raise UserError(f"unrecognised argument {arg}: use --key=value")
        elif "=" in arg and not os.path.exists(arg):
            raise UserError(f"unrecognised argument {arg}: overrides are written --key=value")
        else:
            apply_config_file(config, defaults, arg)
    expand_templates(config)
    return config


def expand_templates(config: dict, keys=("out_dir",)):
    """Format `{key}` placeholders in out_dir with config values, so each run of a sweep gets its
    own folder: out_dir="out/delete/{dataset_name}_lr{learning_rate}". Slashes inside a
    substituted value become '_' (model_dir=out/a -> out_a)."""
    safe = {k: (v.strip("/").replace("/", "_") if isinstance(v, str) else v) for k, v in config.items()}
    for key in keys:
        value = config.get(key)
        if isinstance(value, str) and "{" in value:
            try:
                config[key] = value.format(**safe)
            except (KeyError, IndexError, ValueError) as e:
                raise UserError(f"{key}={value!r}: cannot fill placeholder {e} (use {{config_key}})")


class ArgParser(argparse.ArgumentParser):
    """argparse, but a bad flag is the project's one-line error (exit 2), not usage + message."""

    def error(self, message):
        raise UserError(f"{message} (see python {self.prog} --help)")
