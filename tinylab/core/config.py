"""Configuration: every key declared once, parsed once, validated before anything is written.

A `Key` is one setting: its default (which gives its type), a one-line help, and what values it
allows (`choices`, or a `range` written as an interval, "[1, inf)", "[0, 1)"). A `Schema` is the
keys of one program, in sections, plus its cross-key rules. Each component declares its keys next
to its code; tinylab/schema.py assembles every program's Schema from them. This module is the
machinery both kinds of command line use:

  - the drivers (train.py, finetune_t0.py), nanoGPT's configurator:
        python train.py configs/a.py configs/b.py --key=value --other=1e-4
    config files are Python, exec'd in order with the current config as their namespace; then
    each `--key=value` is parsed with ast.literal_eval (a bare word stays a string) and
    type-checked; `out_dir` `{key}` placeholders are filled; `--help` prints the schema; a key
    declared with `nargs` may also be written as another program spells it, `--flag V1 V2 ...`
    (finetune_t0.py's Megatron arguments: --train-weighted-split-paths "A: 1 0:1 P");
  - the tools (sample.py, grow.py, export.py, evaluation/...): argparse options made from Keys
    (`Schema.argparser`), so their values pass the same checks and bad flags are one line too.

Every mistake is a one-line UserError naming where the value came from (`--dropout=1.5`,
`configs/x.py: dropout`): an unknown key (with the closest key suggested), `--key value` without
`=`, a wrong type, a value outside its range or choices, a broken rule between keys, a missing
config file.
"""
import argparse
import ast
import contextlib
import dataclasses
import difflib
import io
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, Optional

from tinylab.core.errors import UserError
from tinylab.core.outputs import KINDS, declared_inputs, force_of, guard_outputs, guard_parsed, tagged_actions

TYPES = (bool, int, float, str, list, dict)
# the usual ranges of numeric keys
COUNT, NONNEG, POSITIVE, FRACTION = "[1, inf)", "[0, inf)", "(0, inf)", "[0, 1)"
_INTERVAL = re.compile(r"^([\[(])\s*(-?inf|-?[0-9.e+-]+)\s*,\s*(-?inf|-?[0-9.e+-]+)\s*([\])])$")


@dataclass(frozen=True)
class Key:
    """One config key. `type` defaults to the default's type (`list` means a list of strings);
    `range` is an interval such as "[0, 1)" or "[1, inf)"; `check(value)` returns an error
    message or None for what neither can say (a device that must exist)."""
    name: str
    default: object
    help: str
    type: Optional[type] = None
    choices: Optional[tuple] = None
    range: Optional[str] = None
    nonempty: bool = False  # a string key whose empty value means nothing
    aliases: tuple = ()  # other spellings accepted (the original study's, llama2.c's)
    check: Optional[Callable] = None
    required: bool = False  # tools only: the flag must be given
    sep: Optional[str] = ","  # a list key given one string splits it here (None: the string is one item)
    # drivers only, for another program's spelling (Megatron's): 0 = `--flag` alone means True,
    # 1 = `--flag VALUE`, "+" = `--flag V1 V2 ...` (a list key: the values up to the next -option)
    nargs: Optional[object] = None
    # what the command writes or reads through this key (outputs.py, the one output guard):
    # `output` names a kind in outputs.KINDS; `output_path=False` when the value names the output
    # but the tool derives its path (and guards it itself); `input=True` for a path the command reads
    output: Optional[str] = None
    output_path: bool = True
    input: bool = False

    def __post_init__(self):
        t = self.type or type(self.default)
        if t not in TYPES:
            raise TypeError(f"key {self.name}: type {t.__name__} is not one of {[x.__name__ for x in TYPES]}")
        object.__setattr__(self, "type", t)
        if self.range is not None:
            _parse_interval(self.range)  # a typo in a declaration fails at import
        if self.output is not None and self.output not in KINDS:
            raise ValueError(f"key {self.name}: unknown output kind {self.output!r} (outputs.KINDS)")

    def replace(self, **changes) -> "Key":
        return dataclasses.replace(self, **changes)

    def convert(self, value, source: str):
        """`value` as this key's type, or a UserError naming `source`."""
        t = self.type
        if t is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
        elif t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an int beyond any float: infinite, which validate refuses
                return math.inf if value > 0 else -math.inf
        elif t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        elif t is str and isinstance(value, str):
            return value
        elif t is list and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        elif t is list and isinstance(value, str):
            # the original study's configs write lists as "a,b,c" (eval_dataset_names, wandb_tags)
            return [value] if self.sep is None else [s.strip() for s in value.split(self.sep) if s.strip()]
        elif t is dict and isinstance(value, dict):
            return value
        want = "list of str" if t is list else t.__name__
        raise UserError(f"{source}: '{self.name}' expects {want} (default {self.default!r}), "
                        f"got {type(value).__name__} {value!r:.60}")

    def from_text(self, text: str, source: str):
        """A command-line string as this key's value (ast.literal_eval; a bare word is a string)."""
        if self.type is str:
            return text  # --dataset_name=123 stays the string "123"
        try:
            value = ast.literal_eval(text)
        except (SyntaxError, ValueError):
            value = text
        return self.convert(value, source)

    def validate(self, value, source=None):
        """Raise a UserError if `value` (already of the right type) is not allowed; `source` is
        where it came from ("--name", a config file's path, or None)."""
        def fail(problem):
            if source and source.startswith("--"):
                raise UserError(f"--{self.name}={value!r:.60}: {problem}")
            raise UserError(f"{source + ': ' if source else ''}{self.name}={value!r:.60}: {problem}")
        if self.choices is not None and value not in self.choices:
            shown = ", ".join(repr(c) if c == "" else str(c) for c in self.choices)
            fail(f"must be one of {shown}{_closest(value, self.choices)}")
        if self.type in (int, float) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):  # (an int of any size is finite)
                fail("must be a finite number")
            if self.range is not None and not _in_interval(value, self.range):
                fail(f"must be in {self.range}")
        if self.nonempty and isinstance(value, str) and not value.strip():
            fail("must not be empty")
        if self.check is not None:
            problem = self.check(value)
            if problem:
                fail(problem)

    def describe(self) -> str:
        """Type, default and allowed values, for --help."""
        allowed = ""
        if self.choices is not None:
            allowed = " | ".join(repr(c) if c == "" else str(c) for c in self.choices)
        elif self.range is not None:
            allowed = self.range
        t = "list" if self.type is list else self.type.__name__
        return f"{t} = {self.default!r}" + (f"  {allowed}" if allowed else "")


def _parse_interval(text):
    m = _INTERVAL.match(text.strip())
    if not m:
        raise ValueError(f"bad interval {text!r} (write e.g. '[0, 1)' or '[1, inf)')")
    return m.group(1) == "[", float(m.group(2)), float(m.group(3)), m.group(4) == "]"


def _in_interval(x, text):
    lo_closed, lo, hi, hi_closed = _parse_interval(text)
    return (x >= lo if lo_closed else x > lo) and (x <= hi if hi_closed else x < hi)


def _closest(value, choices):
    if not isinstance(value, str):
        return ""
    match = difflib.get_close_matches(value, [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


class Schema:
    """The keys of one program, in sections, with its cross-key rules.

    `rules` are functions rule(cfg) that raise a UserError; `prepare(cfg, sources)` (optional) runs
    between parsing and validation and returns the config to validate (optimizer presets fill keys;
    `sources` says where each key given came from: "--name", or a config file's path).
    `force_key`: the key that lets an existing output be replaced (outputs.py); by default
    `force`, else `overwrite`, when the schema has one. `refused`: {flag: why} for flags another
    program's commands use that this one cannot honour; `--flag ...` is then that one line (a
    flag that is also a key is refused only in the spaced form, `--flag VALUE`)."""

    def __init__(self, prog: str, sections, rules=(), prepare=None, force_key=None, refused=None):
        self.prog, self.sections, self.rules, self.prepare = prog, [(t, list(ks)) for t, ks in sections], list(rules), prepare
        self.refused = dict(refused or {})
        self.keys, self.aliases = {}, {}
        for _, keys in self.sections:
            for k in keys:
                if k.name in self.keys:
                    raise ValueError(f"{prog}: key {k.name} declared twice")
                self.keys[k.name] = k
                for a in k.aliases:
                    self.aliases[a] = k.name
        self.force_key = force_key or next((k for k in ("force", "overwrite") if k in self.keys), None)

    @classmethod
    def from_defaults(cls, prog: str, defaults: dict) -> "Schema":
        """A schema whose keys are a plain {name: default} dict (types from the defaults; a None
        default takes strings), for programs outside this repository."""
        return cls(prog, [("config", [Key(k, v, "", type=str if v is None else None) for k, v in defaults.items()])])

    def derive(self, prog, defaults=None, drop=(), keys=(), sections=(), rules=None, prepare=None) -> "Schema":
        """Another program's schema from this one: the same keys (shared, not copied) with some
        defaults changed, some keys dropped or replaced (`keys`: Key objects by name), sections added."""
        defaults, replaced = defaults or {}, {k.name: k for k in keys}
        unknown = (set(defaults) | set(replaced)) - set(self.keys)
        if unknown:
            raise ValueError(f"{prog}: derive() of unknown keys {sorted(unknown)}")
        out = []
        for title, ks in self.sections:
            ks = [replaced.get(k.name, k) for k in ks if k.name not in drop]
            ks = [k.replace(default=defaults[k.name]) if k.name in defaults else k for k in ks]
            if ks:
                out.append((title, ks))
        return Schema(prog, out + list(sections), self.rules if rules is None else rules,
                      self.prepare if prepare is None else prepare, self.force_key if self.force_key in
                      {k.name for _, ks in out + list(sections) for k in ks} else None)

    def defaults(self) -> dict:
        return {name: (list(k.default) if isinstance(k.default, list) else k.default) for name, k in self.keys.items()}

    def key(self, name, source) -> Key:
        name = self.aliases.get(name, name)
        if name not in self.keys:
            raise UserError(f"{source}: unknown config key '{name}'{_closest(name, list(self.keys))}")
        return self.keys[name]

    # -- validation

    def validate(self, cfg: dict, sources=None) -> dict:
        """Every key's type, range and choices, then the cross-key rules; returns cfg."""
        sources = sources or {}
        for name, k in self.keys.items():
            if cfg[name] is None and k.default is None:
                continue  # a tool's optional flag that was not given
            source = sources.get(name)
            k.validate(k.convert(cfg[name], source or name), source)
        for rule in self.rules:
            rule(cfg)
        return cfg

    # -- the drivers' command line

    def parse(self, argv=None) -> dict:
        """A new config: defaults, then config files, then --key=value overrides, `out_dir`
        placeholders filled, `prepare` applied, everything validated."""
        argv = sys.argv[1:] if argv is None else argv
        if any(a in ("-h", "--help") for a in argv):
            print(self.help())
            sys.exit(0)
        cfg, sources = self.defaults(), {}
        argv = list(argv)
        while argv:
            arg = argv.pop(0)
            if arg.startswith("--"):
                body = arg[2:]
                self._refuse(body)
                spaced = self.keys.get(self.aliases.get(body, body))
                if "=" not in body and spaced is not None and spaced.nargs is not None:
                    values = _spaced_values(arg, spaced.nargs, argv)  # one value is text, as after '=': `--lr 2e-5`
                    cfg[spaced.name] = spaced.from_text(values, arg) if isinstance(values, str) else spaced.convert(values, arg)
                    sources[spaced.name] = arg
                    continue
                if "=" not in body:
                    raise UserError(f"argument {arg} has no value: use --key=value (e.g. {arg}=...)")
                name, raw = body.split("=", 1)
                k = self.key(name, f"--{name}")
                cfg[k.name] = k.from_text(raw, f"--{name}")
                sources[k.name] = f"--{name}"
            elif arg.startswith("-"):
                raise UserError(f"unrecognised argument {arg}: use --key=value")
            elif "=" in arg and not os.path.exists(arg):
                raise UserError(f"unrecognised argument {arg}: overrides are written --key=value")
            else:
                self._apply_file(cfg, sources, arg)
        expand_templates(cfg)
        cfg, notices = self._prepared(cfg, sources)
        self.validate(cfg, sources)
        guard_outputs(self, cfg)  # the outputs it names, before anything is read or written
        sys.stderr.write(notices)
        return cfg

    def _prepared(self, cfg, sources):
        """prepare(cfg, sources)'s config and its notices (compat=original's), held back so that
        they are printed only for a config that then validates: a refused one is one error line.
        `sources`: where each key the user set came from."""
        if self.prepare is None:
            return cfg, ""
        notices = io.StringIO()
        with contextlib.redirect_stderr(notices):
            cfg = self.prepare(cfg, sources)
        return cfg, notices.getvalue()

    def _refuse(self, body):
        name = body.split("=", 1)[0]
        if name in self.refused and ("=" not in body or self.aliases.get(name, name) not in self.keys):
            raise UserError(f"--{name}: {self.refused[name]}")

    def _apply_file(self, cfg, sources, path):
        if not os.path.isfile(path):
            raise UserError(f"config file not found: {path}")
        namespace = dict(cfg, __file__=os.path.abspath(path))  # lets a config include another
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
            exec(compile(source, path, "exec"), namespace)
        except OSError:
            raise
        except Exception as e:  # a broken config file is the user's to fix: name it and the line
            raise UserError(f"config file {path} failed: {type(e).__name__}: {e}")
        for name, value in namespace.items():
            if name.startswith("_") or callable(value) or type(value).__name__ == "module":
                continue
            if name in cfg and value is cfg[name]:
                continue  # untouched by this file
            k = self.key(name, path)
            cfg[k.name] = k.convert(value, path)
            sources[k.name] = path

    def help(self) -> str:
        lines = [f"usage: python {self.prog} [config.py ...] [--key=value ...]", ""]
        for title, keys in self.sections:
            lines.append(f"{title}:")
            for k in keys:
                lines.append(f"  --{k.name:<30} {k.describe()}")
                lines.append(f"      {k.help}")
            lines.append("")
        if self.aliases:
            lines.append("aliases: " + ", ".join(f"--{a} = --{n}" for a, n in self.aliases.items()))
        return "\n".join(lines).rstrip()

    # -- the tools' command line

    def argparser(self, description: str) -> "ArgParser":
        """An ArgParser with one --flag per key, converted and range-checked by the Key (bool
        keys are flags: --force, --force=True/False, --no-force; list keys may be repeated)."""
        p = ArgParser(prog=self.prog, description=description, allow_abbrev=False)
        p.schema = self  # the schema it was made from (tests/test_bad_input.py walks every tool's parsers)
        for title, keys in self.sections:
            group = p.add_argument_group(title)
            for k in keys:
                names = [f"--{k.name}"] + [f"--{a}" for a in k.aliases]
                convert = _ArgConverter(k)
                if k.type is bool:
                    action = group.add_argument(*names, dest=k.name, nargs="?", const=True, default=k.default,
                                                type=convert, help=f"{k.help} ({k.describe()})")
                    group.add_argument(f"--no-{k.name}", dest=k.name, action="store_false", help=argparse.SUPPRESS)
                elif k.type is list:  # repeatable: --data=a --data=b (or --data=a,b)
                    action = group.add_argument(*names, dest=k.name, action="extend", default=list(k.default),
                                                type=convert, metavar="VALUE", help=f"{k.help} ({k.describe()})")
                else:
                    action = group.add_argument(*names, dest=k.name, default=None if k.required else k.default,
                                                type=convert, required=k.required, metavar=k.type.__name__.upper(),
                                                help=f"{k.help} ({k.describe()})")
                # what it reads or writes, for outputs.py's guard (done by parse_args from the Key)
                action.key, action.io, action.kind = k, "output" if k.output else "input" if k.input else None, k.output
        return p

    def parse_args(self, argv=None, parser=None) -> argparse.Namespace:
        """Parse a tool's flags (with `parser`, made by argparser() and given positionals) and
        validate them like a driver's config."""
        parser = parser or self.argparser("")
        ns = parser.parse_args(argv)
        cfg = {name: getattr(ns, name) for name in self.keys}
        missing = [n for n, k in self.keys.items() if k.required and cfg[n] is None]
        if missing:
            raise UserError(f"--{missing[0]} is required (see python {self.prog} --help)")
        sources = {n: f"--{n}" for n in self.keys}
        # as a driver's config (compat=original fills keys); argparse cannot tell a flag given with
        # its default value from one left out, so a tool's flag counts as set when it differs
        given = {n: f"--{n}" for n, k in self.keys.items() if cfg[n] != k.default}
        cfg, notices = self._prepared(cfg, given)
        for name in self.keys:
            setattr(ns, name, cfg[name])
        self.validate(cfg, sources)
        # the outputs it names, before anything is read or written (outputs.py)
        positional_inputs = [getattr(ns, a.dest) for a in tagged_actions(parser, "input")]
        guard_outputs(self, cfg, positional_inputs)
        guard_parsed(parser, ns, *force_of(self, cfg), self.prog, declared_inputs(self, cfg))
        sys.stderr.write(notices)
        return ns


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's: a value, not a flag (--gpu_count -1)


def _spaced_values(flag, nargs, rest):
    """Take a spaced flag's values from the front of `rest` (argparse's rule: up to the next
    argument that starts with '-' and is not a negative number)."""
    if nargs == 0:
        return True
    n = next((i for i, a in enumerate(rest) if a.startswith("-") and not _NEGATIVE_NUMBER.match(a)), len(rest))
    if n == 0:
        raise UserError(f"{flag} needs a value ({flag} VALUE{' ...' if nargs == '+' else ''})")
    if nargs == 1:
        return rest.pop(0)
    values = rest[:n]
    del rest[:n]
    return values


class _ArgConverter:
    """argparse `type=`: the Key's conversion (its UserError passes through argparse unchanged)."""

    def __init__(self, key):
        self.key = key
        self.__name__ = key.type.__name__  # argparse names the type in its own messages

    def __call__(self, text):
        return self.key.from_text(text, f"--{self.key.name}")


class ArgParser(argparse.ArgumentParser):
    """argparse, but a bad flag is the project's one-line error (exit 2), not usage + message;
    a mistyped flag gets the closest real one suggested, as the drivers' keys do.

    `add_input` / `add_output` add a positional argument that names what the command reads or
    writes (outputs.py): Schema.parse_args protects the inputs and guards an output of a fixed
    `kind`; kind=None marks an output whose kind depends on the mode, which the tool guards."""

    def add_input(self, *args, **kwargs):
        action = self.add_argument(*args, **kwargs)
        action.io, action.kind = "input", None
        return action

    def add_output(self, *args, kind=None, **kwargs):
        if kind is not None and kind not in KINDS:
            raise ValueError(f"unknown output kind {kind!r} (outputs.KINDS)")
        action = self.add_argument(*args, **kwargs)
        action.io, action.kind = "output", kind
        return action

    def error(self, message):
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            flags = [s for a in self._actions for s in a.option_strings if a.help != argparse.SUPPRESS]
            for arg in message[len(prefix):].split():
                name = arg.split("=", 1)[0]
                if name.startswith("--"):
                    match = difflib.get_close_matches(name, flags, n=1, cutoff=0.75)
                    if match:
                        message += f" (did you mean {match[0]}?)"
                        break
        raise UserError(f"{message} (see python {self.prog} --help)")


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


# ---------------------------------------------------------------------- checks several schemas share

def check_device(device: str):
    """None when `device` ("" = auto) exists on this machine, else why not."""
    if device == "":
        return None
    import torch
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        return "unknown device (use cpu, cuda, cuda:N or mps; empty = pick the best available)"
    if d.type == "cpu":
        return None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            return f"CUDA is not available on this machine (torch {torch.__version__}); use --device=cpu or leave it empty"
        if d.index is not None and d.index >= torch.cuda.device_count():
            return f"this machine has {torch.cuda.device_count()} CUDA device(s)"
        return None
    if d.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        return None if mps is not None and mps.is_available() else "MPS is not available on this machine"
    return f"device type '{d.type}' is not supported (use cpu, cuda, cuda:N or mps)"
