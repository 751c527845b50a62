"""The one output guard: every file or folder a command writes where a user named it, or into a
folder a user owns, is checked here, before any work.

The rule (README, "The run folder and what is never lost"):
  - a new output is written atomically (fileio.py: a temp name beside it, fsync, rename);
  - an existing file is replaced only with --force (or the tool's documented equivalent, e.g.
    finetune_t0.py's --overwrite=True); an existing folder output is then moved aside to
    `<folder>.previous-<time>`, never deleted;
  - never, not even with --force: the command's own input, a training checkpoint (one with
    optimizer state), a run's metrics.jsonl or config.json, a dataset's manifest, a folder holding
    a training run, or a file of another kind than the tool writes (a PNG over a .jsonl, JSON over
    a .pt). The refusal is one line naming the file and why.

Where a command's flags are config keys (config.py), a key declared with `output=KIND` is checked
by `guard_outputs` as soon as the flags are parsed, and keys declared with `input=True` are the
inputs it protects; a tool whose output path is derived (grow.py's default, pretokenize's dataset
folder, export.py's positional path) calls `guard_file` / `guard_folder` itself, also before any
work. `KINDS` is the registry of what a tool may write; tests/test_outputs.py walks every entry
point's parser and checks that each output flag it finds is declared and refused where it must be.
"""
import contextlib
import fnmatch
import json
import os
import time
import zipfile
from dataclasses import dataclass
from typing import Optional

from tinylab.core.errors import UserError

RUN_FILES = ("ckpt.pt", "metrics.jsonl")  # a folder holding one of these holds a training run


# ---------------------------------------------------------------------- what an existing file is

def _text_of(path: str, limit: int = 64 << 20) -> Optional[str]:
    """The file's UTF-8 text, or None when it is not text (or too big to be a tool's text output)."""
    if os.path.getsize(path) > limit:
        return None
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _json_shape(text: str) -> set:
    """{"json"} for one JSON document, {"jsonl"} for one JSON value per line (both for a single
    line), else {"text"}."""
    tags = set()
    try:
        json.loads(text)
        tags.add("json")
    except ValueError:
        pass
    lines = [line for line in text.splitlines() if line.strip()]
    if lines:
        try:
            for line in lines:
                json.loads(line)
            tags.add("jsonl")
        except ValueError:
            pass
    return tags or {"text"}


def sniff(path: str) -> set:
    """What an existing file is, as tags: png, torch (a torch.save file), zip, json, jsonl, python,
    text, binary, or empty. Content first (magic bytes, parsing), the name only where a format has
    no magic."""
    if os.path.getsize(path) == 0:
        return {"empty"}
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return {"png"}
    if head.startswith(b"PK\x03\x04"):
        with contextlib.suppress(zipfile.BadZipFile, OSError):
            with zipfile.ZipFile(path) as z:
                if any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist()):
                    return {"torch"}
        return {"zip"}
    if head[:1] == b"\x80" and path.endswith((".pt", ".pth")):  # torch's legacy (pickle) format
        return {"torch"}
    text = _text_of(path)
    if text is None:
        return {"binary"}
    if path.endswith(".py"):
        return {"python"}
    return _json_shape(text)


def _describe(tags: set) -> str:
    for tag, words in (("png", "a PNG image"), ("torch", "a PyTorch file"), ("zip", "a zip archive"),
                       ("python", "Python source"), ("json", "a JSON file"), ("jsonl", "a JSON Lines file"),
                       ("text", "a text file"), ("binary", "binary data")):
        if tag in tags:
            return words
    return "a file"


def _torch_dict(path: str):
    """The dict a torch.save file holds (memory-mapped, tensors not read), or None."""
    import torch  # not at the top: tinylab loads first, with its Ctrl-C hook (errors.py)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001  not a loadable torch file: no checkpoint to protect
        return None
    return obj if isinstance(obj, dict) else None


def training_checkpoint(path: str, tool: str = "") -> Optional[str]:
    """Why `path` must never be replaced because it is a training checkpoint (optimizer state: the
    run can go on from it), or None. A checkpoint `tool` itself wrote (its "written_by") outside a
    run folder is that tool's own earlier output, and may be replaced with --force."""
    ckpt = _torch_dict(path)
    if ckpt is None or ckpt.get("optimizer") is None:
        return None
    in_run = os.path.lexists(os.path.join(os.path.dirname(os.path.abspath(path)), "metrics.jsonl"))
    if tool and ckpt.get("written_by") == tool and not in_run:
        return None
    return f"is a training checkpoint (iteration {ckpt.get('iter_num')}, with optimizer state)"


def belongs_to_a_run(path: str) -> Optional[str]:
    """Why `path` is part of a run folder, a model folder or a dataset, or None."""
    name, folder = os.path.basename(path), os.path.dirname(os.path.abspath(path))
    here = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    if name == "metrics.jsonl":
        return "is a run's metrics log"
    if name == ".lock":
        return "is a run folder's lock"
    if name == "config.json" and here & set(RUN_FILES):
        return "is a run's config.json"
    if name == "config.json" and here & {"model.safetensors", "pytorch_model.bin"}:
        return "is the config.json of a Hugging Face model folder"
    if name == "manifest.json" and any(f.startswith("data") and f.endswith(".bin") for f in here):
        return "is a dataset's manifest"
    return None


# ---------------------------------------------------------------------- the kinds a tool writes

@dataclass(frozen=True)
class Kind:
    """One kind of output. `accepts`: the sniffed tags of an existing file it may replace (with
    --force); `folder`: the output is a folder, and `markers` are files that show an existing
    folder is this kind's (one of them present), so --force may move it aside."""
    name: str
    label: str
    accepts: frozenset = frozenset()
    folder: bool = False
    markers: tuple = ()
    appends: bool = False  # an existing output of this kind is continued (a sweep folder, a cache), not replaced


def _kind(name, label, accepts=(), **kw):
    return Kind(name, label, frozenset(accepts) | {"empty"}, **kw)


KINDS = {k.name: k for k in (
    _kind("json", "JSON", {"json"}),
    _kind("jsonl", "JSON Lines", {"jsonl"}),
    # read, then appended to: text that is not JSON Lines is left to the reader's own line-numbered error
    _kind("jsonl_cache", "JSON Lines cache", {"jsonl", "text"}, appends=True),
    _kind("png", "PNG image", {"png"}),
    _kind("checkpoint", "checkpoint", {"torch"}),
    _kind("llama2c_bin", "llama2.c model .bin", {"binary"}),
    _kind("tokenizer_bin", "run.c tokenizer .bin", {"binary"}),
    _kind("sentencepiece", "sentencepiece tokenizer", {"binary", "text"}),
    _kind("text", "text", {"text", "json", "jsonl"}),
    _kind("megatron_prefix", "Megatron indexed dataset", {"binary"}),
    _kind("hf_folder", "Hugging Face model folder", folder=True, markers=("config.json",)),
    _kind("demo_data", "T0 demo data folder", folder=True, markers=("mixture.json",)),
    _kind("dataset", "pretokenized dataset", folder=True, markers=("manifest.json",)),
    _kind("raw_corpus", "raw corpus folder", folder=True, markers=(".synthesized",)),
    _kind("sweep", "sweep folder", folder=True, markers=("results.jsonl",), appends=True),
    # an experiment's own folder: continued by a rerun (its steps are reused where they match)
    _kind("experiment", "experiment folder", folder=True, appends=True,
          markers=("results.json", "results.md", "logs", "evals", "runs", "data", "seed*")),
    _kind("grown_checkpoint", "grown checkpoint", {"torch"}),
    # a run folder: train.py's out_dir, owned by rundir.RunDir (lock, refuse / move aside)
    Kind("run", "run folder", folder=True),
)}


def _same(a: str, b: str) -> bool:
    a, b = os.path.abspath(a), os.path.abspath(b)
    if a == b:
        return True
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)
    return False


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        p = os.path.dirname(p)
    return p


def check_creatable(path: str, what: str, shown: str = None):
    """The nearest existing folder on the way to `path` must be a writable folder."""
    existing = _nearest_existing(path)
    shown = shown or path
    if not os.path.isdir(existing):
        raise UserError(f"{what} {shown}: {existing} exists and is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{what} {shown}: {existing} is not writable")


def _flagged(flag: str, path: str) -> str:
    return f"{flag}={path}" if flag.startswith("--") else f"{flag} {path}"


def guard_file(path: str, kind: str, force: bool = False, inputs=(), flag: str = "output",
               force_flag: str = "--force", tool: str = "") -> str:
    """Before any work: `path` may be written as a `kind` file (see the module docstring).
    `inputs`: the paths this command reads; `tool`: the program's name (its own earlier
    checkpoints may be replaced with force). Returns `path`."""
    k = KINDS[kind]
    if not path:
        raise UserError(f"{flag}: the path is empty")
    shown = _flagged(flag, path)
    for source in inputs:
        if source and os.path.lexists(source) and _same(path, source):
            raise UserError(f"{shown} is this command's own input; write to another path")
    if os.path.isdir(path):
        raise UserError(f"{shown} is a folder, not a file")
    if os.path.lexists(path):
        if not os.path.isfile(path):
            raise UserError(f"{shown} exists and is not a regular file")
        why = belongs_to_a_run(path) or training_checkpoint(path, tool)
        if why is None:
            tags = sniff(path)
            if not tags & k.accepts:
                why = f"is {_describe(tags)}, not the {k.label} this command writes"
        if why:
            raise UserError(f"{shown} {why}; it is never replaced (write to another path)")
        if not (force or k.appends):
            raise UserError(f"{shown} already exists (use {force_flag} to replace it)")
    check_creatable(os.path.dirname(os.path.abspath(path)), flag, shown=path)
    return path


def guard_folder(path: str, kind: str, force: bool = False, inputs=(), flag: str = "output folder",
                 force_flag: str = "--force", continues: bool = None) -> str:
    """Before any work: a `kind` folder may be written at `path`: new, empty, or (with force) an
    earlier folder of the same kind, which the writer moves aside (`move_aside`). A folder kind
    that `appends` (or a call with continues=True) continues an existing folder of its kind.
    Returns `path`."""
    k = KINDS[kind]
    if not path:
        raise UserError(f"{flag}: the path is empty")
    shown = _flagged(flag, path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UserError(f"{shown} exists and is not a folder")
    for source in inputs:
        if source and os.path.lexists(source) and (_inside(source, path) or _same(path, source)):
            raise UserError(f"{shown} holds this command's input {source}; write to another folder")
    entries = sorted(e for e in os.listdir(path) if e != ".lock") if os.path.isdir(path) else []
    if entries:
        ours = any(fnmatch.filter(entries, m) for m in k.markers)
        if set(entries) & set(RUN_FILES) and kind != "run":
            raise UserError(f"{shown} holds a training run ({', '.join(sorted(set(entries) & set(RUN_FILES)))}); it is "
                            f"never replaced (write to another folder)")
        if not ours:
            raise UserError(f"{shown} holds files that are not a {k.label} ({', '.join(entries[:3])}"
                            f"{', ...' if len(entries) > 3 else ''}); it is never replaced (write to another folder)")
        if not (force or (k.appends if continues is None else continues)):
            raise UserError(f"{shown} already exists (use {force_flag} to move it aside to {path}.previous-<time>)")
    check_creatable(path, flag)
    return path


def move_aside(path: str) -> str:
    """Move an existing folder to a new sibling `<path>.previous-<time>[-n]`; returns where it went
    ('' when there was nothing to move)."""
    if not os.path.lexists(path):
        return ""
    base = f"{os.path.normpath(path)}.previous-{time.strftime('%Y%m%d-%H%M%S')}"
    aside, n = base, 1
    while os.path.lexists(aside):
        n += 1
        aside = f"{base}-{n}"
    os.rename(path, aside)
    print(f"notice: moved the previous {os.path.basename(os.path.normpath(path))} to {aside}")
    return aside


# ---------------------------------------------------------------------- declared outputs of a schema

def _paths(value) -> list:
    if not value:
        return []
    return [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, str) and v]


def declared_inputs(schema, values: dict, extra=()) -> list:
    """The paths a command reads: every key declared `input=True`, plus `extra`."""
    found = [p for name, k in schema.keys.items() if k.input for p in _paths(values.get(name))]
    return found + [p for e in extra for p in _paths(e)]


GUARDED_ELSEWHERE = ("run",)  # rundir.RunDir checks run folders when the run starts


def force_of(schema, values: dict):
    """(force given?, how the user spells it) for `schema`'s force key."""
    key = schema.force_key
    if not key:
        return False, "--force"
    return bool(values.get(key)), f"--{key}" + ("=True" if key == "overwrite" else "")


def guard_path(kind: str, path: str, force: bool, inputs=(), flag: str = "output", force_flag: str = "--force",
               tool: str = "") -> str:
    """guard_file, guard_folder or guard_prefix, by the kind's shape."""
    if KINDS[kind].folder:
        return guard_folder(path, kind, force, inputs, flag, force_flag)
    if kind == "megatron_prefix":
        return guard_prefix(path, force, inputs, flag, force_flag)
    return guard_file(path, kind, force, inputs, flag, force_flag, tool)


def guard_outputs(schema, values: dict, extra_inputs=()):
    """Check every output key of `schema` that has a value (called by Schema.parse / parse_args
    right after validation, so no command can skip it)."""
    inputs = declared_inputs(schema, values, extra_inputs)
    force, force_flag = force_of(schema, values)
    for name, k in schema.keys.items():
        if not k.output or k.output in GUARDED_ELSEWHERE or not k.output_path:
            continue
        for path in _paths(values.get(name)):
            guard_path(k.output, path, force, inputs, f"--{name}", force_flag, schema.prog)


def tagged_actions(parser, io: str) -> list:
    """The arguments a tool added with ArgParser.add_input / add_output (not made from a Key)."""
    return [a for a in parser._actions if getattr(a, "io", None) == io and getattr(a, "key", None) is None]


def guard_parsed(parser, ns, force: bool, force_flag: str = "--force", tool: str = "", inputs=()):
    """The outputs of fixed kind that a tool declared with ArgParser.add_output, checked against
    everything it declared with add_input (and `inputs`)."""
    inputs = [p for a in tagged_actions(parser, "input") for p in _paths(getattr(ns, a.dest))] + list(inputs)
    for a in tagged_actions(parser, "output"):
        if a.kind is None or a.kind in GUARDED_ELSEWHERE:
            continue  # a kind that depends on the mode: the tool guards it
        flag = a.option_strings[0] if a.option_strings else (a.metavar or a.dest)
        for path in _paths(getattr(ns, a.dest)):
            guard_path(a.kind, path, force, inputs, flag, force_flag, tool)


MEGATRON_FIELDS = ("inputs", "targets")  # a T0 prefix's two halves


def guard_prefix(prefix: str, force: bool, inputs=(), flag="--output_prefix", force_flag="--force",
                 fields=MEGATRON_FIELDS):
    """A Megatron indexed prefix is the files <prefix>_<field>_document.{bin,idx}, one pair per
    field written (tools/preprocess_data.py's json keys): only those are guarded, so a second pass
    that adds the targets beside an inputs-only prefix is not refused for the inputs' files."""
    if not prefix or prefix.endswith(("/", os.sep)):
        raise UserError(f"{flag}={prefix!r} must name a file prefix (e.g. data/rte), not a folder")
    for field in fields:
        for ext in ("bin", "idx"):
            guard_file(f"{prefix}_{field}_document.{ext}", "megatron_prefix", force, inputs, flag, force_flag)
    return prefix

