"""Bad input at every command line, against the project's standard (tinylab/core/errors.py): one line on
stderr starting with "error: ", a non-zero exit (2 for a UserError, 1 for an OSError, 130 for
Ctrl-C), no traceback, and nothing lost: every file that existed before is byte-identical
afterwards and no temp file (.tmp*) is left.

Most cases run in-process (conftest.run_main, behind the same cli_main boundary as the command
line); a handful are subprocesses: Ctrl-C, the out_dir lock, and end-to-end checks. Read-only
folders and full disks are tmpfs mounts when running as root (root ignores permission bits), and
skipped with a reason where mounting is not permitted.

Sections, in order: the table of in-process cases; read-only folders; full disks; run folders
and Ctrl-C; the output guard (every entry point's output flags, collected from its parsers);
resuming with other optimizer settings; rules between keys, sweeps and Ctrl-C endings; sizes
checked before allocation, allocation failures and failed runs rolled back.
"""
import argparse
import ast
import contextlib
import glob
import hashlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import (
    LLAMA2_TOKENIZER,
    PYTHON,
    REPO,
    TOK8192,
    WIKITEXT,
    assert_one_line_error,
    make_t0_setup,
    run_cli,
    run_main,
)

from model import ModelArgs, Transformer
from tinylab.core import checkpoint as ckpt_lib
from tinylab.core import memory_budget
from tinylab.core.config import Schema
from tinylab.core.errors import cli_main
from tinylab.schema import FINETUNE_T0, TRAIN
from tinylab.training.options import OptimizerOptions, TrainerOptions
from tinylab.training.setup import Run, init_model, training_state
from tinylab.training.trainer import Trainer

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


# ---------------------------------------------------------------------- nothing lost

def snapshot(*roots):
    """{path: sha256 of the file | "<dir>"} of everything under `roots` (the out_dir lock file is
    the lock's, rewritten with the holder's pid by every process that takes it, so it is left out)."""
    out = {}
    for root in roots:
        root = str(root)
        if not os.path.exists(root):
            continue
        for d, dirs, files in os.walk(root):
            for name in dirs:
                out[os.path.join(d, name)] = "<dir>"
            for name in files:
                if name == ".lock":
                    continue
                p = os.path.join(d, name)
                if os.path.islink(p) or not os.path.isfile(p):
                    out[p] = "<other>"
                    continue
                with open(p, "rb") as f:
                    out[p] = hashlib.sha256(f.read()).hexdigest()
    return out


def assert_nothing_lost(before, after, nothing_new=False, may_change=()):
    """Every entry of `before` is still there, unchanged (except `may_change` paths); no new temp
    files; with `nothing_new`, no new entries at all."""
    changed = [p for p, h in before.items() if after.get(p) != h and p not in may_change]
    assert not changed, f"changed or removed: {changed}"
    new = sorted(set(after) - set(before))
    temps = [p for p in new if os.path.basename(p).startswith((".tmp", ".old-"))]
    assert not temps, f"temp files left: {temps}"
    if nothing_new:
        assert not new, f"new files or folders: {new}"


def assert_error(proc, code, *fragments):
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert_one_line_error(proc, *fragments)


@contextlib.contextmanager
def mounted_tmpfs(path, size="1m", read_only=False, fill=None):
    """A tmpfs of `size` at `path` (root only, else skip). `fill(path)` runs on it before it is
    remounted read-only (read_only=True)."""
    if not IS_ROOT:
        pytest.skip("a tmpfs mount (full disk, read-only folder) needs root")
    os.makedirs(path, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {proc.stderr.strip()}")
    try:
        if fill:
            fill(str(path))
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def read_only_dir(path, fill=None, size="1m"):
    """A folder nobody may write into: a read-only tmpfs as root (root ignores permission bits),
    else mode 0o555."""
    if IS_ROOT:
        with mounted_tmpfs(path, size, read_only=True, fill=fill) as p:
            yield p
        return
    os.makedirs(path, exist_ok=True)
    if fill:
        fill(str(path))
    folders = [d for d, _, _ in os.walk(path)]
    for d in folders:
        os.chmod(d, 0o555)
    try:
        yield str(path)
    finally:
        for d in folders:
            os.chmod(d, 0o755)


def fill_up(folder, leave_bytes):
    """Write a filler file so that about `leave_bytes` stay free on the file system of `folder`."""
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    n = max(0, free - leave_bytes)
    with open(os.path.join(folder, "filler"), "wb") as f:
        f.write(b"\0" * n)
    return n


# ---------------------------------------------------------------------- what the cases run on

VOCAB = 8192


def train_argv(corpus, out_dir=None, **over):
    """A tiny train.py run on the session's tiny corpus (about a second)."""
    cfg = dict(data_cache_dir=corpus.cache_dir, vocab_size=VOCAB, dataset_name=corpus.dataset_name, out_dir=out_dir,
               dim=16, n_layers=1, n_heads=2, n_kv_heads=1, multiple_of=16, max_seq_len=32, batch_size=2,
               gradient_accumulation_steps=1, learning_rate=1e-3, warmup_iters=0, max_iters=2, eval_interval=2,
               eval_iters=1, log_interval=1, max_new_tokens=0, device="cpu", dtype="float32",
               export_bin=False)  # no model.bin: the full-disk cases copy the run onto a 2 MB disk
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()]


@pytest.fixture(scope="module")
def world(tiny_corpus, tmp_path_factory):
    """Shared, read-only inputs of the cases (snapshotted around every case):
        run/       a finished 2-iteration train.py run (ckpt.pt with optimizer state, metrics.jsonl, config.json)
        model.bin  its llama2.c v1 export
        t0/        the T0 demo mixture and a tiny base checkpoint (conftest.make_t0_setup)
        text files for the evaluation tools
    """
    from conftest import make_t0_setup

    root = str(tmp_path_factory.mktemp("bad_input_world"))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = os.path.join(root, "run")
        proc = run_main("train.py", train_argv(tiny_corpus, run))
        assert proc.returncode == 0, proc.stderr
        proc = run_main("export.py", [os.path.join(root, "model.bin"), "--version=1", f"--checkpoint={run}"])
        assert proc.returncode == 0, proc.stderr
        mixture, base = make_t0_setup(os.path.join(root, "t0"))
    finally:
        torch.set_num_threads(n)
    w = SimpleNamespace(root=root, run=run, ckpt=os.path.join(run, "ckpt.pt"), bin=os.path.join(root, "model.bin"),
                        mixture=mixture, base=base, corpus=tiny_corpus)
    # a LAMBADA file whose one passage ends in a word of far more tokens than the model's window (32)
    w.long_word = os.path.join(root, "long_word.jsonl")
    with open(w.long_word, "w") as f:
        f.write(json.dumps({"text": "The cat sat on the " + "qzxjvkwpqzxjvkwp" * 8}) + "\n")
    w.latin1 = os.path.join(root, "latin1.txt")
    with open(w.latin1, "wb") as f:
        f.write("Caf\xe9 au lait. Na\xefve r\xe9sum\xe9.\n".encode("latin-1"))
    return w


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest on a shared 2-core machine
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------------- the table of in-process cases

class Case:
    """One bad command: `argv(ctx)` (ctx: t = the case's own folder, w = the world, c = the
    corpus), optional `setup(ctx)` that writes files into the case folder first, the exit code
    and fragments of the one error line. `nothing_new`: the command must not create anything."""

    def __init__(self, id, script, argv, *fragments, code=2, setup=None, nothing_new=True):
        self.id, self.script, self.argv, self.fragments = id, script, argv, fragments
        self.code, self.setup, self.nothing_new = code, setup, nothing_new


def T(ctx, **over):
    return train_argv(ctx.c, **{"out_dir": os.path.join(ctx.t, "out"), **over})


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def copy_raw(ctx):
    """A private data cache with the corpus's raw shards and tokenizer (shard files may be edited)."""
    cache = os.path.join(ctx.t, "cache")
    shutil.copytree(ctx.c.raw_dir, os.path.join(cache, "TinyStories_all_data"))
    shutil.copy(ctx.c.tokenizer_model, cache)
    return cache


def edit_shard(ctx, edit):
    cache = copy_raw(ctx)
    path = os.path.join(cache, "TinyStories_all_data", "data01.json")
    records = json.load(open(path))
    write(path, edit(records))


def features_string(records):
    records[5]["instruction"]["features"] = "Twist"
    return json.dumps(records)


def manifest_edit(ctx, value):
    """A private copy of the corpus's dataset whose manifest.json is `value` (JSON text)."""
    cache = os.path.join(ctx.t, "cache")
    shutil.copytree(ctx.c.cache_dir, cache, ignore=shutil.ignore_patterns("judges"))
    write(os.path.join(cache, "tok8192", ctx.c.dataset_name, "manifest.json"), value)


def without_key(ctx, key):
    m = json.load(open(os.path.join(ctx.c.dataset_dir, "manifest.json")))
    del m[key]
    return json.dumps(m)


def TC(ctx, **over):
    """train.py on the private cache of manifest_edit."""
    return T(ctx, data_cache_dir=os.path.join(ctx.t, "cache"), **over)


def T0(ctx, **over):
    cfg = dict(mixture=ctx.w.mixture, model_dir=ctx.w.base, out_dir=os.path.join(ctx.t, "ft"), batch_size=2,
               max_iters=2, eval_interval=2, eval_iters=1, rank_eval_examples=2, device="cpu", dtype="float32")
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()]


def PRE(ctx, *extra, cache=None):
    return ["pretokenize", f"--vocab_size={VOCAB}", f"--data_cache_dir={cache or os.path.join(ctx.t, 'cache')}",
            "--workers=1", *extra]


def GROW(ctx, *extra, out=None):
    return [f"--resume={ctx.w.ckpt}", f"--out_dir={os.path.join(ctx.t, 'grown') if out is None else out}", *extra]


def EV(ctx, *extra, ckpt=None):
    return [f"--checkpoint={ckpt or ctx.w.ckpt}", "--device=cpu", *extra]


def sweep_yaml(text):
    return lambda ctx: write(os.path.join(ctx.t, "s.yaml"), text)


def SW(ctx, *extra):
    return [os.path.join(ctx.t, "s.yaml"), f"--out_dir={os.path.join(ctx.t, 'sweep')}", *extra]


def metrics_file(ctx, lines=(b'{"iter": 0, "kind": "train", "loss/train": 3.0}',
                             b'{"iter": 1, "kind": "train", "loss/train": 2.5}')):
    write(os.path.join(ctx.t, "run", "metrics.jsonl"), b"\n".join(lines) + b"\n")


def a_file(ctx, name="blocker"):
    write(os.path.join(ctx.t, name), "keep me\n")


def run_folder(ctx, name="out"):
    """A finished run's files (copies of the world's run) in the case folder."""
    shutil.copytree(ctx.w.run, os.path.join(ctx.t, name))


def nan_checkpoint(ctx, name="nan.pt"):
    """The world's checkpoint with one NaN weight: a diverged run's."""
    ckpt = torch.load(ctx.w.ckpt, map_location="cpu", weights_only=False)
    next(v for k, v in ckpt["model"].items() if k.endswith("feed_forward.w2.weight"))[0, 0] = float("nan")
    torch.save(ckpt, os.path.join(ctx.t, name))


P = os.path.join

CASES = [
    # ------------------------------------------------------------------ train.py: values
    Case("train-dim-not-divisible", "train.py", lambda x: T(x, dim=30, n_heads=4), "dim=30 is not divisible by n_heads=4"),
    Case("train-kv-not-dividing", "train.py", lambda x: T(x, dim=32, n_heads=4, n_kv_heads=3), "n_kv_heads=3 must divide n_heads=4"),
    Case("train-dropout", "train.py", lambda x: T(x, dropout=1.5), "--dropout=1.5: must be in [0, 1)"),
    Case("train-hidden-dim", "train.py", lambda x: T(x, hidden_dim=-4), "--hidden_dim=-4: must be in [0, inf)"),
    Case("train-grad-accum", "train.py", lambda x: T(x, gradient_accumulation_steps=0), "--gradient_accumulation_steps=0"),
    Case("train-eval-interval", "train.py", lambda x: T(x, eval_interval=0), "--eval_interval=0: must be in [1, inf)"),
    Case("train-log-interval", "train.py", lambda x: T(x, log_interval=0), "--log_interval=0: must be in [1, inf)"),
    Case("train-eval-iters", "train.py", lambda x: T(x, eval_iters=0), "--eval_iters=0: must be in [1, inf)"),
    Case("train-max-iters", "train.py", lambda x: T(x, max_iters=-3), "--max_iters=-3: must be in [0, inf)"),
    Case("train-device-cuda", "train.py", lambda x: T(x, device="cuda"), "--device='cuda'", "CUDA is not available"),
    Case("train-device-tpu", "train.py", lambda x: T(x, device="tpu"), "--device='tpu'"),
    Case("train-lr-nan", "train.py", lambda x: T(x, learning_rate=float("nan")), "learning_rate"),
    Case("train-wrong-type", "train.py", lambda x: T(x, batch_size="many"), "'batch_size' expects int"),
    Case("train-bad-choice", "train.py", lambda x: T(x, optimizer="sgd"), "--optimizer='sgd': must be one of"),
    Case("train-typo", "train.py", lambda x: T(x) + ["--learnig_rate=1e-3"], "unknown config key 'learnig_rate'",
         "did you mean 'learning_rate'?"),
    Case("train-no-equals", "train.py", lambda x: T(x) + ["--dim", "32"], "--dim has no value"),
    Case("train-missing-config-file", "train.py", lambda x: [P(x.t, "nope.py")] + T(x), "config file not found"),
    Case("train-broken-config-file", "train.py", lambda x: [P(x.t, "cfg.py")] + T(x), "cfg.py failed",
         setup=lambda x: write(P(x.t, "cfg.py"), "dim = (\n")),
    Case("train-min-lr-above-lr", "train.py", lambda x: T(x, min_lr=1.0), "min_lr=1.0 is above learning_rate"),
    Case("train-grow-schedule", "train.py", lambda x: T(x, grow_schedule="1:heads"), "doubling"),
    Case("train-no-dataset", "train.py", lambda x: T(x, dataset_name="no-such-dataset"), "not found", "pretokenize"),
    Case("train-resume-without-ckpt", "train.py", lambda x: T(x, init_from="resume_train"), "no checkpoint at"),
    Case("train-resume-model-no-dir", "train.py", lambda x: T(x, init_from="resume_model"), "needs --model_dir"),
    Case("train-resume-junk-ckpt", "train.py", lambda x: T(x, init_from="resume_train"), "is not a readable checkpoint",
         setup=lambda x: write(P(x.t, "out", "ckpt.pt"), b"junk")),
    Case("train-resume-model-junk", "train.py", lambda x: T(x, init_from="resume_model", model_dir=P(x.t, "base")),
         "base/ckpt.pt is not a readable checkpoint", setup=lambda x: write(P(x.t, "base", "ckpt.pt"), b"junk")),
    Case("train-out-dir-placeholder", "train.py", lambda x: T(x, out_dir=P(x.t, "o_{nokey}")), "cannot fill placeholder 'nokey'"),
    Case("train-window-too-long", "train.py", lambda x: T(x, max_seq_len=10 ** 6, batch_size=1), "too small for windows"),
    Case("train-eval-dataset-missing", "train.py", lambda x: T(x, eval_dataset_names="nope"), "tok8192/nope not found"),
    Case("train-generation-datasets", "train.py", lambda x: T(x, generation_datasets="foo"), "generation_datasets names ['foo']"),
    Case("train-other-tokenizer", "train.py", lambda x: T(x, tokenizer_model=LLAMA2_TOKENIZER),
         "was tokenized with a different tokenizer"),
    Case("train-shard-truncated", "train.py", TC, "data01.bin is missing or has the wrong size",
         setup=lambda x: (manifest_edit(x, open(P(x.c.dataset_dir, "manifest.json")).read()),
                          write(P(x.t, "cache", "tok8192", x.c.dataset_name, "data01.bin"), b"\0\0"))),
    # ------------------------------------------------------------------ train.py: out_dir
    Case("train-out-dir-empty", "train.py", lambda x: T(x, out_dir=""), "--out_dir='': must not be empty"),
    Case("train-out-dir-is-a-file", "train.py", lambda x: T(x, out_dir=P(x.t, "blocker")), "exists and is not a folder",
         setup=a_file),
    Case("train-out-dir-under-a-file", "train.py", lambda x: T(x, out_dir=P(x.t, "blocker", "run")), "is not a folder",
         setup=a_file),
    Case("train-scratch-over-a-run", "train.py", lambda x: T(x), "already holds a run", "--overwrite=True",
         setup=run_folder),
    Case("train-resume-model-over-a-run", "train.py", lambda x: T(x, init_from="resume_model", model_dir=x.w.run),
         "already holds a run", setup=run_folder),
    # ------------------------------------------------------------------ train.py: datasets at the edge
    Case("train-manifest-not-object", "train.py", TC, "expected a JSON object, got list",
         setup=lambda x: manifest_edit(x, "[1, 2]")),
    Case("train-manifest-missing-key", "train.py", TC, "no 'shards' entry",
         setup=lambda x: manifest_edit(x, without_key(x, "shards"))),
    Case("train-manifest-not-json", "train.py", TC, "corrupt", "manifest.json",
         setup=lambda x: manifest_edit(x, "{not json")),
    Case("train-manifest-not-utf8", "train.py", TC, "corrupt", "manifest.json",
         setup=lambda x: manifest_edit(x, b'{"x": "\xff\xfe"}')),
    # ------------------------------------------------------------------ finetune_t0.py
    Case("t0-init-scratch", "finetune_t0.py", lambda x: T0(x, init_from="scratch"), "--init_from='scratch': must be one of"),
    Case("t0-dropout", "finetune_t0.py", lambda x: T0(x, dropout=1.5), "--dropout=1.5"),
    Case("t0-typo", "finetune_t0.py", lambda x: T0(x) + ["--mixtrue=x"], "unknown config key 'mixtrue'", "mixture"),
    Case("t0-lm-key", "finetune_t0.py", lambda x: T0(x) + ["--dim=64"], "unknown config key 'dim'"),
    Case("t0-attention-impl", "finetune_t0.py", lambda x: T0(x, attention_impl="dens"), "--attention_impl='dens'",
         "auto"),
    Case("t0-flex-on-cpu", "finetune_t0.py", lambda x: T0(x, attention_impl="flex"), "attention_impl=flex trains on "
         "CUDA only", "no FlexAttention backward on cpu"),
    Case("t0-no-mixture", "finetune_t0.py", lambda x: T0(x, mixture=""), "no mixture given"),
    Case("t0-missing-mixture", "finetune_t0.py", lambda x: T0(x, mixture=P(x.t, "m.json")), "not found"),
    Case("t0-mixture-not-object", "finetune_t0.py", lambda x: T0(x, mixture=P(x.t, "m.json")), "top-level object",
         setup=lambda x: write(P(x.t, "m.json"), "[]")),
    Case("t0-mixture-not-utf8", "finetune_t0.py", lambda x: T0(x, mixture=P(x.t, "m.json")), "m.json",
         setup=lambda x: write(P(x.t, "m.json"), b'{"train": "\xff"}')),
    Case("t0-seq-len-above-base", "finetune_t0.py", lambda x: T0(x, max_seq_len=4096), "exceeds the base model's 128"),
    Case("t0-missing-base", "finetune_t0.py", lambda x: T0(x, model_dir=P(x.t, "nobase")), "no checkpoint at"),
    Case("t0-out-dir-is-a-file", "finetune_t0.py", lambda x: T0(x, out_dir=P(x.t, "blocker")), "not a folder",
         setup=a_file),
    Case("t0-mixture-source-missing", "finetune_t0.py", lambda x: T0(x, mixture=P(x.t, "m.json")),
         "source 'a'", "missing.jsonl not found",
         setup=lambda x: write(P(x.t, "m.json"), json.dumps({"train": [{"name": "a", "path": "missing.jsonl"}]}))),
    Case("t0-demo-into-file", "finetune_t0.py", lambda x: [f"--make_demo_data={P(x.t, 'blocker')}"], "not a folder",
         setup=a_file),
    Case("t0-demo-over-folder", "finetune_t0.py", lambda x: [f"--make_demo_data={P(x.t, 'demo')}", "--overwrite=True"],
         "holds files that are not a T0 demo data folder", "mine.txt", "never replaced",
         setup=lambda x: write(P(x.t, "demo", "mine.txt"), "x")),
    Case("t0-demo-over-demo", "finetune_t0.py", lambda x: [f"--make_demo_data={P(x.t, 'demo')}"],
         "already exists", "--overwrite=True", setup=lambda x: write(P(x.t, "demo", "mixture.json"), "{}")),
    # ------------------------------------------------------------------ tinystories.py
    Case("data-unknown-stage", "tinystories.py", lambda x: ["tokenize"], "invalid choice: 'tokenize'"),
    Case("data-stray-flag", "tinystories.py", lambda x: ["download", f"--data_cache_dir={x.t}", "--vocab_size=512"],
         "--vocab_size does not apply to download"),
    Case("data-download-unreachable", "tinystories.py",
         lambda x: ["download", f"--data_cache_dir={P(x.t, 'dl')}", f"--data_url=file://{P(x.t, 'nothing.tar.gz')}"],
         "download of", nothing_new=False),
    Case("data-download-cache-is-a-file", "tinystories.py", lambda x: ["download", f"--data_cache_dir={P(x.t, 'blocker')}"],
         "blocker", code=1, setup=a_file),
    Case("data-download-empty-raw-folder", "tinystories.py", lambda x: ["download", f"--data_cache_dir={P(x.t, 'dl')}"],
         "exists but holds no .json shards",
         setup=lambda x: (write(P(x.t, "dl", "TinyStories_all_data", "notes.txt"), "mine"),
                          write(P(x.t, "dl", "TinyStories_all_data.tar.gz"), b"not fetched again"))),
    Case("data-synth-zero-shards", "tinystories.py", lambda x: ["synthesize", f"--data_cache_dir={x.t}", "--num_shards=0"],
         "--num_shards and --stories_per_shard must be >= 1"),
    Case("data-synth-over-download", "tinystories.py", lambda x: ["synthesize", f"--data_cache_dir={P(x.t, 'cache')}"],
         "was not made by synthesize", setup=lambda x: write(P(x.t, "cache", "TinyStories_all_data", "data00.json"), "[]")),
    Case("data-vocab-too-big", "tinystories.py", lambda x: ["train_vocab", f"--data_cache_dir={x.t}", "--vocab_size=70000"],
         "does not fit the uint16"),
    Case("data-synth-seed", "tinystories.py", lambda x: ["synthesize", f"--data_cache_dir={x.t}", "--seed=-1"],
         "--seed must be >= 0"),
    Case("data-vocab-size-type", "tinystories.py", lambda x: PRE(x)[:1] + ["--vocab_size=abc"],
         "argument --vocab_size: invalid int value: 'abc'"),
    Case("data-vocab-shards-zero", "tinystories.py", lambda x: ["train_vocab", f"--data_cache_dir={x.c.cache_dir}",
                                                                "--vocab_size=512", "--vocab_shards=0"], "--vocab_shards must be >= 1"),
    Case("data-vocab-no-shards", "tinystories.py", lambda x: ["train_vocab", f"--data_cache_dir={x.t}", "--vocab_size=512"],
         "no raw shards"),
    Case("data-pretok-workers-zero", "tinystories.py", lambda x: PRE(x, cache=x.c.cache_dir)[:-1] + ["--workers=0"],
         "--workers must be >= 1"),
    Case("data-pretok-bad-name", "tinystories.py", lambda x: PRE(x, "--dataset_name=../escape", cache=x.c.cache_dir),
         "must be a plain folder name"),
    Case("data-pretok-bad-filter", "tinystories.py", lambda x: PRE(x, "--filtering=colour=red", cache=x.c.cache_dir),
         "filtering"),
    Case("data-pretok-wrong-tokenizer", "tinystories.py", lambda x: PRE(x, cache=x.c.cache_dir)[:1] + [
        "--vocab_size=512", f"--data_cache_dir={x.c.cache_dir}"], "tok512.model not found"),
    Case("data-pretok-features-string", "tinystories.py", lambda x: PRE(x, "--dataset_name=d"),
         "data01.json: record 5", "'instruction.features' should be a list of strings",
         setup=lambda x: edit_shard(x, features_string)),
    Case("data-pretok-shard-not-list", "tinystories.py", lambda x: PRE(x, "--dataset_name=d"), "data01.json",
         "expected a list of stories, got dict", setup=lambda x: edit_shard(x, lambda r: json.dumps({"stories": r}))),
    Case("data-pretok-shard-corrupt", "tinystories.py", lambda x: PRE(x, "--dataset_name=d"), "corrupt JSON shard",
         "data01.json", setup=lambda x: edit_shard(x, lambda r: json.dumps(r)[:-100])),
    Case("data-pretok-shard-not-utf8", "tinystories.py", lambda x: PRE(x, "--dataset_name=d"), "data01.json",
         setup=lambda x: edit_shard(x, lambda r: b"[\xff\xfe]")),
    Case("data-pretok-record-not-object", "tinystories.py", lambda x: PRE(x, "--dataset_name=d"), "record 0",
         setup=lambda x: edit_shard(x, lambda r: json.dumps(["a story"] + r))),
    # ------------------------------------------------------------------ grow.py
    Case("grow-sb-alpha-nan", "grow.py", lambda x: GROW(x, "--doubling=weights", "--symmetry_breaking=split",
                                                        "--sb_alpha=nan"), "--sb_alpha"),
    Case("grow-sb-alpha-range", "grow.py", lambda x: GROW(x, "--doubling=weights", "--sb_alpha=1.5"),
         "--sb_alpha=1.5: must be in [0, 1]"),
    Case("grow-sb-scale-inf", "grow.py", lambda x: GROW(x, "--doubling=weights", "--sb_scale=inf"), "--sb_scale"),
    Case("grow-unknown-doubling", "grow.py", lambda x: GROW(x, "--doubling=heads"), "--doubling='heads': must be one of"),
    Case("grow-no-doubling", "grow.py", lambda x: GROW(x), "--doubling is required"),
    Case("grow-typo", "grow.py", lambda x: GROW(x, "--doubling=weights", "--sb_alpah=0.5"), "--sb_alpah",
         "did you mean --sb_alpha?"),
    Case("grow-missing-resume", "grow.py", lambda x: [f"--resume={P(x.t, 'none.pt')}", f"--out_dir={P(x.t, 'g')}",
                                                      "--doubling=weights"], "checkpoint not found"),
    Case("grow-not-a-ckpt", "grow.py", lambda x: [f"--resume={x.w.latin1}", f"--out_dir={P(x.t, 'g')}",
                                                  "--doubling=weights"], "is not a readable checkpoint"),
    Case("grow-out-dir-is-a-file", "grow.py", lambda x: GROW(x, "--doubling=weights", out=P(x.t, "blocker")),
         "not a folder", setup=a_file),
    Case("grow-out-dir-empty", "grow.py", lambda x: GROW(x, "--doubling=weights", out=""), "must not be empty"),
    Case("grow-over-a-run", "grow.py", lambda x: GROW(x, "--doubling=weights", "--force", out=P(x.t, "out")),
         "training checkpoint", "never replaced", setup=run_folder),
    # ------------------------------------------------------------------ sample.py
    Case("sample-num-samples", "sample.py", lambda x: EV(x, "--num_samples=0"), "--num_samples=0: must be in [1, inf)"),
    Case("sample-temperature", "sample.py", lambda x: EV(x, "--temperature=-1"), "--temperature=-1.0: must be in [0, inf)"),
    Case("sample-max-new-tokens", "sample.py", lambda x: EV(x, "--max_new_tokens=-1"), "--max_new_tokens=-1"),
    Case("sample-top-k", "sample.py", lambda x: EV(x, "--top_k=-5"), "--top_k=-5: must be in [0, inf)"),
    Case("sample-start-missing-file", "sample.py", lambda x: EV(x, f"--start=FILE:{P(x.t, 'prompt.txt')}"),
         "--start=FILE: prompt file not found"),
    Case("sample-start-not-utf8", "sample.py", lambda x: EV(x, f"--start=FILE:{x.w.latin1}"), "is not UTF-8 text"),
    Case("sample-device-cuda", "sample.py", lambda x: EV(x)[:1] + ["--device=cuda:1"], "CUDA is not available"),
    Case("sample-device-tpu", "sample.py", lambda x: EV(x, "--device=tpu"), "--device='tpu'"),
    Case("sample-missing-ckpt", "sample.py", lambda x: EV(x, ckpt=P(x.t, "none")), "checkpoint not found"),
    Case("sample-not-a-ckpt", "sample.py", lambda x: EV(x, ckpt=x.w.latin1), "is not a readable checkpoint"),
    Case("sample-other-tokenizer", "sample.py", lambda x: EV(x, f"--tokenizer_model={LLAMA2_TOKENIZER}"),
         "tokenizer has 32000 pieces but the model's vocabulary is 8192"),
    Case("sample-start-is-a-folder", "sample.py", lambda x: EV(x, f"--start=FILE:{x.t}"), "is a folder, not a file"),
    Case("sample-typo", "sample.py", lambda x: EV(x, "--num_sample=2"), "--num_sample", "did you mean --num_samples?"),
    Case("sample-nan-checkpoint", "sample.py", lambda x: EV(x, "--max_new_tokens=4", ckpt=P(x.t, "nan.pt")), "nan.pt: the model's logits are NaN",
         setup=nan_checkpoint),
    # ------------------------------------------------------------------ export.py
    Case("export-version-3", "export.py", lambda x: [P(x.t, "m.bin"), "--version=3", f"--checkpoint={x.w.ckpt}"],
         "--version=3: must be one of -1, 0, 1, 2"),
    Case("export-version-with-import", "export.py", lambda x: [P(x.t, "imp"), "--version=1", f"--import_bin={x.w.bin}"],
         "--version=1 applies only to a --checkpoint export"),
    Case("export-group-size-v1", "export.py", lambda x: [P(x.t, "m.bin"), "--version=1", "--group_size=32",
                                                         f"--checkpoint={x.w.ckpt}"], "--group_size=32 applies only to --version=2"),
    Case("export-group-size-zero", "export.py", lambda x: [P(x.t, "m.bin"), "--version=2", "--group_size=0",
                                                           f"--checkpoint={x.w.ckpt}"], "--group_size=0: must be in [1, inf)"),
    Case("export-both-imports", "export.py", lambda x: [P(x.t, "imp"), f"--import_bin={x.w.bin}", f"--import_hf={x.t}"],
         "give one of"),
    Case("export-nothing-to-do", "export.py", lambda x: [P(x.t, "m.bin")], "nothing to do"),
    Case("export-no-output", "export.py", lambda x: [f"--checkpoint={x.w.ckpt}"], "missing the output path"),
    Case("export-existing-output", "export.py", lambda x: [P(x.t, "m.bin"), f"--checkpoint={x.w.ckpt}"],
         "already exists", "--force", setup=lambda x: write(P(x.t, "m.bin"), b"\x00\xff" * 8)),
    Case("export-over-a-text-file", "export.py", lambda x: [P(x.t, "blocker"), f"--checkpoint={x.w.ckpt}", "--force"],
         "a text file, not the llama2.c model .bin", "never replaced", setup=a_file),
    Case("export-hf-onto-file", "export.py", lambda x: [P(x.t, "blocker"), "--version=-1", f"--checkpoint={x.w.ckpt}",
                                                        "--force"], "not a folder", setup=a_file),
    Case("export-import-over-training-ckpt", "export.py",
         lambda x: [P(x.t, "out", "ckpt.pt"), f"--import_bin={x.w.bin}", "--force"], "is a training checkpoint",
         setup=run_folder),
    Case("export-import-not-bin", "export.py", lambda x: [P(x.t, "imp"), f"--import_bin={x.w.latin1}"],
         "latin1.txt is not a llama2.c model file"),
    Case("export-ckpt-not-readable", "export.py", lambda x: [P(x.t, "m.bin"), f"--checkpoint={x.w.latin1}"],
         "is not a readable checkpoint"),
    Case("export-import-hf-not-hf", "export.py", lambda x: [P(x.t, "imp"), f"--import_hf={x.w.root}"],
         "has no config.json"),
    Case("export-version-with-tokenizer", "export.py", lambda x: [P(x.t, "t.bin"), "--version=1", f"--tokenizer={TOK8192}"],
         "--version=1 applies only to a --checkpoint export"),
    Case("export-tokenizer-output-exists", "export.py", lambda x: [P(x.t, "t.bin"), f"--tokenizer={TOK8192}"],
         "tokenizer output", "already exists", setup=lambda x: write(P(x.t, "t.bin"), b"\x00\xff" * 8)),
    Case("export-bin-beside-a-tokenizer-bin", "export.py",  # the model .bin is not written either
         lambda x: [P(x.t, "m.bin"), f"--checkpoint={x.w.ckpt}", f"--tokenizer={TOK8192}"], "tokenizer.bin already exists",
         setup=lambda x: write(P(x.t, "tokenizer.bin"), b"\x00\xff" * 8)),
    Case("export-tokenizer-not-model", "export.py", lambda x: [P(x.t, "t.bin"), f"--tokenizer={x.w.latin1}"],
         "not a sentencepiece model"),
    # ------------------------------------------------------------------ sweep.py
    Case("sweep-unknown-parameter", "sweep.py", lambda x: SW(x, "--dry_run"), "parameter 'learnig_rate'",
         "unknown config key", setup=sweep_yaml("program: train.py\nmethod: grid\nparameters:\n"
                                               "  learnig_rate:\n    values: [0.1, 0.2]\n")),
    Case("sweep-bad-value", "sweep.py", lambda x: SW(x, "--dry_run"), "parameter 'dropout'", "must be in [0, 1)",
         setup=sweep_yaml("program: train.py\nmethod: grid\nparameters:\n  dropout:\n    values: [0.1, 1.5]\n")),
    Case("sweep-bayes", "sweep.py", lambda x: SW(x), "bayes",
         setup=sweep_yaml("program: train.py\nmethod: bayes\nparameters:\n  dropout:\n    values: [0.1]\n")),
    Case("sweep-not-yaml", "sweep.py", lambda x: SW(x), "is not valid YAML", setup=sweep_yaml("program: [\n")),
    Case("sweep-not-utf8", "sweep.py", lambda x: SW(x), "s.yaml",
         setup=lambda x: write(P(x.t, "s.yaml"), b"program: train.py\nmethod: grid # \xff\xfe\n")),
    Case("sweep-missing-file", "sweep.py", lambda x: SW(x), "sweep file not found"),
    Case("sweep-parallel-zero", "sweep.py", lambda x: SW(x, "--parallel=0"), "--parallel must be at least 1"),
    Case("sweep-program-missing", "sweep.py", lambda x: SW(x, "--dry_run"), "program nope.py not found",
         setup=sweep_yaml("program: nope.py\nmethod: grid\nparameters:\n  a:\n    values: [1]\n")),
    Case("sweep-random-without-count", "sweep.py", lambda x: SW(x, "--dry_run"), "method random needs --count",
         setup=sweep_yaml("program: train.py\nmethod: random\nparameters:\n  dropout:\n    min: 0.0\n    max: 0.5\n")),
    Case("sweep-not-a-mapping", "sweep.py", lambda x: SW(x), "is not a sweep configuration", setup=sweep_yaml("- a\n- b\n")),
    Case("sweep-count-zero", "sweep.py", lambda x: SW(x, "--count=0"), "--count must be at least 1"),
    # ------------------------------------------------------------------ plot.py
    Case("plot-unknown-metric", "plot.py", lambda x: [P(x.t, "run"), "--metrics=loss/test", f"--out={P(x.t, 'c.png')}"],
         "no input has the metric 'loss/test'", "available: loss/train", setup=metrics_file),
    Case("plot-no-input", "plot.py", lambda x: [P(x.t, "none"), f"--out={P(x.t, 'c.png')}"], "no metrics log at"),
    Case("plot-no-numbers", "plot.py", lambda x: [P(x.t, "run"), f"--out={P(x.t, 'c.png')}"],
         "the inputs hold no numeric metrics", setup=lambda x: metrics_file(x, [b'{"iter": 0, "kind": "table"}'])),
    Case("plot-labels", "plot.py", lambda x: [P(x.t, "run"), "--labels=a,b", f"--out={P(x.t, 'c.png')}"],
         "--labels has 2 names for 1 runs", setup=metrics_file),
    Case("plot-out-is-its-input", "plot.py", lambda x: [P(x.t, "run"), f"--out={P(x.t, 'run')}"], "own input",
         setup=metrics_file),
    Case("plot-out-is-a-folder", "plot.py", lambda x: [P(x.t, "run"), f"--out={x.t}"], "is a folder",
         setup=metrics_file),
    # ------------------------------------------------------------------ evaluation/eval_wikitext.py
    Case("wikitext-missing-data", "evaluation/eval_wikitext.py", lambda x: EV(x, f"--data={P(x.t, 'w.txt')}"),
         "data file not found"),
    Case("wikitext-stride", "evaluation/eval_wikitext.py", lambda x: EV(x, f"--data={WIKITEXT}", "--stride=64",
                                                                         "--window=16"), "--stride=64 exceeds the window"),
    Case("wikitext-window", "evaluation/eval_wikitext.py", lambda x: EV(x, f"--data={WIKITEXT}", "--window=4096"),
         "--window=4096 exceeds the model's max_seq_len=32"),
    Case("wikitext-batch-size", "evaluation/eval_wikitext.py", lambda x: EV(x, "--batch_size=0"),
         "--batch_size=0: must be in [1, inf)"),
    Case("wikitext-device-cuda", "evaluation/eval_wikitext.py", lambda x: EV(x)[:1] + ["--device=cuda"],
         "CUDA is not available"),
    Case("wikitext-dtype", "evaluation/eval_wikitext.py", lambda x: EV(x, "--dtype=int8"), "--dtype='int8'"),
    Case("wikitext-empty-data", "evaluation/eval_wikitext.py", lambda x: EV(x, f"--data={P(x.t, 'w.txt')}"),
         "holds too little text", setup=lambda x: write(P(x.t, "w.txt"), "")),
    Case("wikitext-hub-offline", "evaluation/eval_wikitext.py", lambda x: EV(x), "offline", "--data=PATH"),
    Case("wikitext-out-is-a-folder", "evaluation/eval_wikitext.py", lambda x: EV(x, f"--data={WIKITEXT}", f"--out={x.t}"),
         "--out", "is a folder"),
    Case("wikitext-out-under-a-file", "evaluation/eval_wikitext.py",
         lambda x: EV(x, f"--data={WIKITEXT}", f"--out={P(x.t, 'blocker', 'm.json')}"), "not a folder", setup=a_file),
    Case("wikitext-not-utf8", "evaluation/eval_wikitext.py", lambda x: EV(x, f"--data={x.w.latin1}"), "latin1.txt"),
    Case("wikitext-jsonl-no-text", "evaluation/eval_wikitext.py", lambda x: EV(x, f"--data={P(x.t, 'w.jsonl')}"),
         "w.jsonl:1 has no string field 'text'", setup=lambda x: write(P(x.t, "w.jsonl"), '{"txt": "a"}\n')),
    # ------------------------------------------------------------------ evaluation/eval_lambada.py
    Case("lambada-word-longer-than-window", "evaluation/eval_lambada.py", lambda x: EV(x, f"--data={x.w.long_word}"),
         "holds no passage with a context and a last word that fits"),
    Case("lambada-missing-data", "evaluation/eval_lambada.py", lambda x: EV(x, f"--data={P(x.t, 'l.jsonl')}"),
         "data file not found"),
    Case("lambada-empty-data", "evaluation/eval_lambada.py", lambda x: EV(x, f"--data={P(x.t, 'l.txt')}"),
         "holds no passage", setup=lambda x: write(P(x.t, "l.txt"), "\n")),
    Case("lambada-max-passages", "evaluation/eval_lambada.py", lambda x: EV(x, "--max_passages=-1"),
         "--max_passages=-1: must be in [0, inf)"),
    # ------------------------------------------------------------------ evaluation/eval_features.py
    Case("features-unknown-feature", "evaluation/eval_features.py", lambda x: EV(x, "--feature=Plot", "--prompts_from=x"),
         "--feature='Plot': must be one of"),
    Case("features-no-prompts", "evaluation/eval_features.py", lambda x: EV(x), "give --prompts_from=DATASET"),
    Case("features-num-samples", "evaluation/eval_features.py", lambda x: EV(x, "--prompts_from=x", "--num_samples=0"),
         "--num_samples=0"),
    Case("features-missing-dataset", "evaluation/eval_features.py", lambda x: EV(x, "--prompts_from=nope"), "not found"),
    Case("features-judge-timeout", "evaluation/eval_features.py", lambda x: EV(x, "--prompts_from=x", "--judge_timeout=0"),
         "--judge_timeout=0.0: must be in (0, inf)"),
    Case("features-llm-unreachable", "evaluation/eval_features.py",
         lambda x: EV(x, "--prompts_from=pretrain-all", "--judge=llm", "--judge_url=http://127.0.0.1:9/v1", "--judge_timeout=5"),
         "could not be reached"),
    Case("features-generations-out-folder", "evaluation/eval_features.py",
         lambda x: EV(x, "--prompts_from=pretrain-all", f"--generations_out={x.t}"), "--generations_out", "is a folder"),
    Case("features-llm-bad-url", "evaluation/eval_features.py",
         lambda x: EV(x, "--prompts_from=x", "--judge=llm", "--judge_url=not a url"), "judge_url"),
    # ------------------------------------------------------------------ evaluation/probe.py
    Case("probe-no-dataset", "evaluation/probe.py", lambda x: EV(x), "arguments are required: --dataset"),
    Case("probe-pool", "evaluation/probe.py", lambda x: EV(x, "--dataset=pretrain-all", "--pool=0"), "--pool=0"),
    Case("probe-lr", "evaluation/probe.py", lambda x: EV(x, "--dataset=pretrain-all", "--lr=0"), "--lr=0.0: must be in (0, inf)"),
    Case("probe-num-train", "evaluation/probe.py", lambda x: EV(x, "--dataset=pretrain-all", "--num_train=0"),
         "--num_train=0: must be in [1, inf)"),
    Case("probe-missing-dataset", "evaluation/probe.py", lambda x: EV(x, "--dataset=nope"), "not found"),
    # ------------------------------------------------------------------ evaluation/eval_rank.py
    Case("rank-data-no-equals", "evaluation/eval_rank.py", lambda x: EV(x, "--data=rte.jsonl"), "--data expects NAME=PATH"),
    Case("rank-nothing", "evaluation/eval_rank.py", lambda x: EV(x), "nothing to evaluate"),
    Case("rank-mixture-not-object", "evaluation/eval_rank.py", lambda x: EV(x, f"--mixture={P(x.t, 'm.json')}"),
         "top-level object", setup=lambda x: write(P(x.t, "m.json"), '"train"')),
    Case("rank-missing-data", "evaluation/eval_rank.py", lambda x: EV(x, f"--data=rte={P(x.t, 'rte.jsonl')}"), "rte.jsonl"),
    Case("rank-data-not-json", "evaluation/eval_rank.py", lambda x: EV(x, f"--data=r={P(x.t, 'r.jsonl')}"),
         "cannot read", setup=lambda x: write(P(x.t, "r.jsonl"), "not json\n")),
    Case("rank-max-examples", "evaluation/eval_rank.py", lambda x: EV(x, "--max_examples=-2"), "--max_examples=-2"),
]


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="--device=cuda is bad input only where there is no CUDA")


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[NO_CUDA] if "cuda" in c.id else []) for c in CASES])
def test_bad_input(case, world, tmp_path):
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    if case.setup:
        case.setup(ctx)
    roots = (tmp_path, world.root, world.corpus.cache_dir)
    before = snapshot(*roots)
    proc = run_main(case.script, case.argv(ctx), cwd=str(tmp_path))
    assert_error(proc, case.code, *case.fragments)
    assert_nothing_lost(before, snapshot(*roots), nothing_new=case.nothing_new)


# ---------------------------------------------------------------------- read-only folders

# what writing into a read-only folder reports: a read-only mount as root, mode 0o555 otherwise
RO_CAUSE = "read-only file system" if IS_ROOT else "permission denied"

READ_ONLY_CASES = [
    # (id, script, argv(ctx, ro), exit code, fragments); the tools check their outputs before any
    # work (exit 2), the data stages meet the file system's refusal (exit 1)
    ("train", "train.py", lambda x, ro: T(x, out_dir=P(ro, "run")), 2, ("out_dir", "is not writable")),
    ("train-nested", "train.py", lambda x, ro: T(x, out_dir=P(ro, "a", "b", "run")), 2, ("is not writable",)),
    ("t0-demo-data", "finetune_t0.py", lambda x, ro: [f"--make_demo_data={P(ro, 'demo')}"], 2, ("is not writable",)),
    ("grow", "grow.py", lambda x, ro: GROW(x, "--doubling=layers", out=P(ro, "grown")), 2, ("is not writable",)),
    ("export-bin", "export.py", lambda x, ro: [P(ro, "m.bin"), f"--checkpoint={x.w.ckpt}"], 2, ("m.bin:", "is not writable")),
    ("export-hf", "export.py", lambda x, ro: [P(ro, "hf"), "--version=-1", f"--checkpoint={x.w.ckpt}"], 2,
     ("is not writable",)),
    ("import-bin", "export.py", lambda x, ro: [P(ro, "imp"), f"--import_bin={x.w.bin}"], 2, ("is not writable",)),
    ("plot", "plot.py", lambda x, ro: [P(x.t, "run"), f"--out={P(ro, 'c.png')}"], 2, ("c.png", "is not writable")),
    ("synthesize", "tinystories.py", lambda x, ro: ["synthesize", f"--data_cache_dir={P(ro, 'cache')}", "--num_shards=2",
                                                    "--stories_per_shard=5"], 2, ("TinyStories_all_data", "is not writable")),
    ("train-vocab", "tinystories.py", lambda x, ro: ["train_vocab", f"--data_cache_dir={P(ro, 'cache')}",
                                                     "--vocab_size=300"], 2, ("tok300.model", "is not writable")),
    ("pretokenize", "tinystories.py", lambda x, ro: PRE(x, cache=P(ro, "cache")), 2, ("IS_none", "is not writable")),
    ("wikitext-out", "evaluation/eval_wikitext.py", lambda x, ro: EV(x, f"--data={WIKITEXT}", "--max_rows=5",
                                                                       f"--out={P(ro, 'm.json')}"), 2,
     ("--out", "m.json", "is not writable")),  # before any work
]


@pytest.mark.parametrize("case", READ_ONLY_CASES, ids=[c[0] for c in READ_ONLY_CASES])
def test_read_only_folder(case, world, tmp_path):
    _, script, argv, code, fragments = case
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    metrics_file(ctx)

    def fill(path):  # a file of the user's, and for the data stages a cache with two raw shards and the tokenizer
        write(os.path.join(path, "keep.txt"), "keep me\n")
        if script == "tinystories.py":
            raw = os.path.join(path, "cache", "TinyStories_all_data")
            os.makedirs(raw)
            if case[0] != "synthesize":
                shutil.copy(os.path.join(world.corpus.raw_dir, "data00.json"), raw)
                shutil.copy(os.path.join(world.corpus.raw_dir, "data01.json"), raw)
                shutil.copy(TOK8192, os.path.join(path, "cache"))
            else:
                os.rmdir(raw)

    with read_only_dir(str(tmp_path / "ro"), fill=fill, size="4m") as ro:
        roots = (tmp_path, world.root, world.corpus.cache_dir)
        before = snapshot(*roots)
        proc = run_main(script, argv(ctx, ro), cwd=str(tmp_path))
        assert_error(proc, code, *fragments)
        assert_nothing_lost(before, snapshot(*roots), nothing_new=True)


# ---------------------------------------------------------------------- full disks

@pytest.mark.parametrize("workers", [1, 2])
def test_full_disk_pretokenize(world, tmp_path, workers):
    """The dataset does not fit: one line naming the dataset's file (not the hidden temp folder,
    which is gone), exit 1, the other dataset on that disk and the raw shards untouched."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    cache = copy_raw(ctx)
    disk = P(cache, "tok8192")
    with mounted_tmpfs(disk, "64k", fill=lambda p: write(P(p, "older", "manifest.json"), "{}\n")):
        before = snapshot(tmp_path)
        proc = run_main("tinystories.py", PRE(ctx, "--dataset_name=d")[:-2] + [f"--workers={workers}", "--dataset_name=d"])
        assert_error(proc, 1, f"{P(disk, 'd', 'data')}", ".bin: no space left on device")
        assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


def test_full_disk_checkpoint_of_a_new_run(world, tmp_path):
    """A scratch run whose first checkpoint does not fit: one line naming ckpt.pt, exit 1, no temp
    file; the run's config.json and metrics.jsonl stay (it did train)."""
    with mounted_tmpfs(tmp_path / "disk", "512k", fill=lambda p: write(P(p, "keep.txt"), "keep me\n")) as disk:
        out = P(disk, "run")
        before = snapshot(disk)
        proc = run_main("train.py", train_argv(world.corpus, out))
        assert_error(proc, 1, f"{P(out, 'ckpt.pt')}: no space left on device")
        after = snapshot(disk)
        assert_nothing_lost(before, after)
        assert not os.path.exists(P(out, "ckpt.pt")) and os.path.exists(P(out, "metrics.jsonl"))


def test_full_disk_checkpoint_of_a_resumed_run(world, tmp_path):
    """The resumed run's checkpoint does not fit beside the old one: the old ckpt.pt is byte-identical
    (the run can be resumed again from it), no temp file is left."""
    def fill(p):
        shutil.copytree(world.run, P(p, "run"))
    size = os.path.getsize(world.ckpt) + 600 * 1024  # room for the old checkpoint, not for a second one
    with mounted_tmpfs(tmp_path / "disk", str(size), fill=fill) as disk:
        out = P(disk, "run")
        before = snapshot(disk)
        proc = run_main("train.py", train_argv(world.corpus, out, init_from="resume_train", max_iters=4))
        assert_error(proc, 1, f"{P(out, 'ckpt.pt')}: no space left on device")
        # the resumed iterations were logged, and config.json describes the resumed run
        assert_nothing_lost(before, snapshot(disk), may_change={P(out, "metrics.jsonl"), P(out, "config.json")})
        assert torch.load(P(out, "ckpt.pt"), weights_only=True)["iter_num"] == 2


def test_full_disk_metrics_rewrite_on_resume(world, tmp_path):
    """A resume rewrites metrics.jsonl without the records it redoes (atomically): on a full disk
    that is one line naming metrics.jsonl, exit 1, and every file of the run as it was, config.json
    included (it is written only after the log)."""
    def fill(p):
        shutil.copytree(world.run, P(p, "run"))
        rows = [json.dumps({"iter": i % 5, "kind": "train", "loss/train": 1.0, "pad": "x" * 80}) for i in range(3000)]
        write(P(p, "run", "metrics.jsonl"), "\n".join(rows) + "\n")
        fill_up(p, 8 * 1024)
    with mounted_tmpfs(tmp_path / "disk", "2m", fill=fill) as disk:
        out = P(disk, "run")
        before = snapshot(disk)
        proc = run_main("train.py", train_argv(world.corpus, out, init_from="resume_train", max_iters=4))
        assert_error(proc, 1, f"{P(out, 'metrics.jsonl')}: no space left on device")
        assert_nothing_lost(before, snapshot(disk), nothing_new=True)


FULL_DISK_TOOLS = [
    ("grow", "grow.py", lambda x, d: GROW(x, "--doubling=weights", out=P(d, "grown")), P("grown", "ckpt.pt")),
    ("export-bin", "export.py", lambda x, d: [P(d, "m.bin"), "--version=1", f"--checkpoint={x.w.ckpt}"], "m.bin"),
    ("export-q80", "export.py", lambda x, d: [P(d, "m.bin"), "--version=2", f"--checkpoint={x.w.ckpt}"], "m.bin"),
    ("export-hf", "export.py", lambda x, d: [P(d, "hf"), "--version=-1", f"--checkpoint={x.w.ckpt}"], "hf"),
    ("import-bin", "export.py", lambda x, d: [P(d, "imp"), f"--import_bin={x.w.bin}"], P("imp", "ckpt.pt")),
]


@pytest.mark.parametrize("case", FULL_DISK_TOOLS, ids=[c[0] for c in FULL_DISK_TOOLS])
def test_full_disk_tools(case, world, tmp_path):
    """A tool's output does not fit: one line naming it, exit 1, nothing left on the disk but
    what was there."""
    _, script, argv, shown = case
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    with mounted_tmpfs(tmp_path / "disk", "128k", fill=lambda p: write(P(p, "keep.txt"), "keep me\n")) as disk:
        before = snapshot(disk, world.root)
        proc = run_main(script, argv(ctx, disk))
        assert_error(proc, 1, P(disk, shown), "no space left on device")
        assert_nothing_lost(before, snapshot(disk, world.root), nothing_new=True)


# ---------------------------------------------------------------------- data safety

def test_overwrite_moves_the_old_run_aside_intact(world, tmp_path):
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    run_folder(ctx)
    out = P(ctx.t, "out")
    old = {os.path.relpath(p, out): h for p, h in snapshot(out).items()}
    proc = run_main("train.py", T(ctx, overwrite=True))
    assert proc.returncode == 0, proc.stderr
    aside = [d for d in os.listdir(ctx.t) if d.startswith("out.previous-")]
    assert len(aside) == 1 and f"moved the previous run in {out} to" in proc.stdout
    moved = {os.path.relpath(p, P(ctx.t, aside[0])): h for p, h in snapshot(P(ctx.t, aside[0])).items()}
    assert moved == old  # every file of the old run, byte for byte
    assert torch.load(P(out, "ckpt.pt"), weights_only=True)["iter_num"] == 2 and os.path.isfile(P(out, "config.json"))


def test_failed_resume_leaves_the_run_as_it_was(world, tmp_path):
    """A resume refused after the checkpoint is read (its optimizer is not the configured one):
    config.json, metrics.jsonl and ckpt.pt are untouched (config.json is written only once the run
    really starts)."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    run_folder(ctx)
    before = snapshot(tmp_path)
    proc = run_main("train.py", T(ctx, init_from="resume_train", optimizer="adafactor", max_iters=4))
    assert_error(proc, 2, "trained with optimizer=adamw", "resume_model")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


@pytest.mark.slow
def test_failed_finetune_resume_leaves_the_run_as_it_was(world, tmp_path):
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    ft = P(ctx.t, "ft")
    assert run_main("finetune_t0.py", T0(ctx)).returncode == 0
    before = snapshot(tmp_path)
    proc = run_main("finetune_t0.py", T0(ctx, init_from="resume_train", optimizer="adafactor", max_iters=4))
    assert_error(proc, 2, "trained with optimizer=adamw")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)
    assert os.path.isfile(P(ft, "data_report.json"))


@pytest.mark.slow
def test_import_never_replaces_a_training_checkpoint_cli(world, tmp_path):
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    run_folder(ctx)
    before = snapshot(tmp_path)
    for target in (P(ctx.t, "out"), P(ctx.t, "out", "ckpt.pt")):
        proc = run_cli(["export.py", target, f"--import_bin={world.bin}", "--force"])
        assert_error(proc, 2, "is a training checkpoint", "write to another path")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


# ---------------------------------------------------------------------- two processes, one out_dir

@pytest.mark.slow
def test_second_process_on_a_locked_out_dir_exits_at_once(world, tmp_path):
    """The lock is held (here by this test process): a second train.py exits at once with one line
    naming the holder's pid; grow.py into the same folder too; nothing of the run changes."""
    from tinylab.core.rundir import RunDir

    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    run_folder(ctx)
    out = P(ctx.t, "out")
    holder = RunDir(out).open()
    try:
        before = snapshot(tmp_path)
        t0 = time.time()
        proc = run_cli(["train.py"] + T(ctx, init_from="resume_train", max_iters=4), timeout=60)
        assert time.time() - t0 < 30
        assert_error(proc, 2, f"out_dir {out} is in use by another run (pid {os.getpid()})")
        proc = run_main("grow.py", GROW(ctx, "--doubling=weights", "--force", out=out))
        assert_error(proc, 2, f"(pid {os.getpid()})")
        assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)
    finally:
        holder.close()


# ---------------------------------------------------------------------- Ctrl-C

def wait_for(predicate, proc, timeout=60):
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.slow
def test_ctrl_c_during_setup(world, tmp_path):
    """SIGINT while train.py is still setting up: out_dir created and locked, the base checkpoint
    being read (a FIFO nobody writes: a checkpoint on a slow file system). One line, exit 130, and
    the out_dir this run created is gone again."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    slow = P(ctx.t, "slow")
    os.makedirs(slow)
    os.mkfifo(P(slow, "ckpt.pt"))
    out = P(ctx.t, "out")
    before = snapshot(tmp_path)
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([PYTHON, "train.py"] + T(ctx, init_from="resume_model", model_dir=slow), cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: os.path.exists(P(out, ".lock")), proc)
        time.sleep(0.2)  # well inside the read of the checkpoint
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_error(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), 130, "error: interrupted")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


def test_ctrl_c_before_main_starts():
    """Ctrl-C while a command's modules still load (before cli_main; importing torch alone takes
    seconds): the same one line and exit 130, not an import traceback (tinylab/core/errors.py)."""
    proc = run_cli(["-c", "import tinylab\nraise KeyboardInterrupt"], timeout=60)
    assert_error(proc, 130, "error: interrupted")


@pytest.mark.slow
def test_ctrl_c_during_pretokenize_with_workers(world, tmp_path):
    """SIGINT to the process group of a pretokenize --workers=2 that takes a couple of seconds:
    one line, exit 130, no temp folder or file left, the raw shards untouched, no dataset."""
    from tinylab.data.synthesize import synthesize

    cache = str(tmp_path / "cache")
    synthesize(cache, num_shards=5, stories_per_shard=6000, seed=0, workers=1)
    shutil.copy(TOK8192, cache)
    before = snapshot(tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([PYTHON, "tinystories.py", "pretokenize", f"--vocab_size={VOCAB}", f"--data_cache_dir={cache}",
                             "--workers=2", "--dataset_name=d"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out = P(cache, "tok8192")
    try:
        wait_for(lambda: os.path.isdir(out) and any(n.startswith(".tmp-d-") for n in os.listdir(out)), proc)
        time.sleep(0.5)  # the workers are encoding shards
        assert proc.poll() is None, "pretokenize finished before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert_error(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), 130, "error: interrupted")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


# ---------------------------------------------------------------------- input data at the edge

@pytest.mark.slow
def test_metrics_with_a_non_utf8_line(world, tmp_path):
    """plot.py and a train.py resume skip a metrics.jsonl line that is not UTF-8 with one notice
    line, and go on."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    run_folder(ctx)
    metrics = P(ctx.t, "out", "metrics.jsonl")
    lines = open(metrics, "rb").read().splitlines()
    write(metrics, b"\n".join(lines[:1] + [b'{"iter": 0, "loss/train": "\xff\xfe"}'] + lines[1:]) + b"\n")
    before = snapshot(tmp_path)
    proc = run_main("plot.py", [P(ctx.t, "out"), "--metrics=loss/train", f"--out={P(ctx.t, 'c.png')}"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == f"notice: skipped 1 unreadable line(s) of {metrics}"
    assert_nothing_lost(before, snapshot(tmp_path))
    proc = run_main("train.py", T(ctx, init_from="resume_train", max_iters=3))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == f"notice: skipped 1 unreadable line(s) of {metrics}"
    rows = [json.loads(line) for line in open(metrics, "rb")]  # every line readable again
    assert sorted(r["iter"] for r in rows if r["kind"] == "train") == [0, 1, 2]


def test_lambada_leaves_out_a_word_longer_than_the_window(world, tmp_path):
    """A passage whose last word has more tokens than the model's window is left out with one
    notice; the others are scored."""
    data = P(str(tmp_path), "l.jsonl")
    good = [{"text": "The cat sat on the mat and looked at the dog"}, {"text": "Lily went to the park to play"}]
    write(data, "".join(json.dumps(r) + "\n" for r in good) + open(world.long_word).read())
    proc = run_main("evaluation/eval_lambada.py", EV(SimpleNamespace(t=str(tmp_path), w=world), f"--data={data}"))
    assert proc.returncode == 0, proc.stderr
    assert "notice: 1 passage(s) left out" in proc.stdout and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["n"] == 2


# ---------------------------------------------------------------------- the output guard (tinylab/core/outputs.py)
#
# Every entry point's output flags are collected from its parsers (the ones main() builds and the
# schemas the module defines), never listed by hand: a flag that looks like an output must be
# declared as one (Key(output=...), ArgParser.add_output), and every declared output must have a
# row in OUTPUT_CASES below, whose protected targets are then refused even with --force.


ENTRY_SCRIPTS = sorted({"train.py", "tinystories.py", "grow.py", "finetune_t0.py", "sample.py", "export.py", "sweep.py",
                        "plot.py"} | {os.path.relpath(p, REPO) for pattern in ("evaluation/*.py", "experiments/*.py")
                                     for p in glob.glob(os.path.join(REPO, pattern)) if not p.endswith("__init__.py")})
DRIVER_SCRIPTS = {"train.py", "finetune_t0.py"}  # config-file programs: their module-level SCHEMA is the parser
OUTPUT_LOOKING = re.compile(r"(^out$|^out_|_out$|output|^plots?$|^save$|^save_prefix$|prefix$|^log_dir$|^filepath$|"
                            r"_demo_data$|cache$)")


class _Captured(Exception):
    pass


def _subcommands(module) -> list:
    """The strings main() compares argv[0] with (eval_wikitext.py's `eval` / `train`)."""
    tree = ast.parse(open(module.__file__, encoding="utf-8").read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Subscript) and \
                ast.unparse(node.left) == "argv[0]":
            found += [c.value for c in node.comparators if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return found


def entry_parsers(script):
    """[(label, parser)] of one entry point: what main() parses (captured at its first
    parse_known_args, before any work) for each subcommand, then every Schema the module defines
    that main() did not build."""
    module = importlib.import_module(script[:-3].replace("/", "."))
    parsers, seen = [], set()
    if script not in DRIVER_SCRIPTS:
        original = argparse.ArgumentParser.parse_known_args

        def capture(self, *a, **k):
            raise _Captured(self)
        for sub in [None] + _subcommands(module):
            argparse.ArgumentParser.parse_known_args = capture
            try:
                module.main([] if sub is None else [sub])
            except _Captured as c:
                parser = c.args[0]
                parsers.append((script if sub is None else f"{script} {sub}", parser))
                seen.add(id(getattr(parser, "schema", None)))
            finally:
                argparse.ArgumentParser.parse_known_args = original
    for name, value in sorted(vars(module).items(), key=lambda kv: (kv[0] != "SCHEMA", kv[0])):
        if isinstance(value, Schema) and id(value) not in seen and (value.prog.startswith(script) or script in DRIVER_SCRIPTS
                                                                    and value.prog == script):
            seen.add(id(value))
            parsers.append((f"{script}:{name}", value.argparser("")))
    return parsers


def declared_outputs():
    """{(label, dest): kind} of every output any entry point declares; fails on an undeclared one."""
    found, undeclared = {}, []
    for script in ENTRY_SCRIPTS:
        for label, parser in entry_parsers(script):
            for action in parser._actions:
                if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                    continue
                io = getattr(action, "io", None)
                if io == "output":
                    found[(label, action.dest)] = action.kind
                elif io is None and OUTPUT_LOOKING.search(action.dest):
                    undeclared.append(f"{label} --{action.dest}")
    assert not undeclared, f"flags that look like outputs but are not declared (Key(output=...) / add_output): {undeclared}"
    return found


def training_ckpt(path):
    """A training checkpoint (optimizer state) of a tiny model at `path`."""
    from conftest import save_tiny_checkpoint
    return save_tiny_checkpoint(path, optimizer={"state": {}, "param_groups": []}, iter_num=7)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """Files and folders the guard must protect (snapshotted around every case)."""
    from conftest import save_tiny_checkpoint
    root = str(tmp_path_factory.mktemp("output_targets"))
    t = SimpleNamespace(root=root, run=P(root, "run"))
    t.ckpt = training_ckpt(P(t.run, "ckpt.pt"))
    write(P(t.run, "metrics.jsonl"), '{"iter": 0, "kind": "train", "loss/train": 3.0}\n')
    write(P(t.run, "config.json"), '{"dim": 32}\n')
    t.metrics, t.config = P(t.run, "metrics.jsonl"), P(t.run, "config.json")
    t.weights = save_tiny_checkpoint(P(root, "weights", "ckpt.pt"))  # weights only: an import's output
    t.weights2 = save_tiny_checkpoint(P(root, "weights2.pt"))
    write(P(root, "old.png"), b"\x89PNG\r\n\x1a\n" + b"\0" * 32)
    write(P(root, "old.json"), '{"ppl": 3.0}\n')
    write(P(root, "plotj.png"), '{"a JSON file": "named .png"}\n')
    write(P(root, "old.jsonl"), '{"a": 1}\n{"a": 2}\n')
    write(P(root, "old.bin"), b"\x00\xff" * 16)
    write(P(root, "configs", "my.py"), "learning_rate = 1e-4\n")
    write(P(root, "notes.txt"), "my notes\n")
    write(P(root, "hf", "config.json"), "{}")
    write(P(root, "hf", "model.safetensors"), b"\0" * 8)
    write(P(root, "foreign", "mine.txt"), "x")
    write(P(root, "demo", "mixture.json"), "{}")
    write(P(root, "exp", "results.json"), "{}")
    write(P(root, "sweep", "results.jsonl"), "")
    write(P(root, "s.yaml"), "program: train.py\nmethod: grid\nparameters:\n  learning_rate:\n    values: [0.001]\n")
    write(P(root, "in.jsonl"), '{"inputs": "a", "targets": "b"}\n')
    for suffix in ("_inputs_document.bin", "_inputs_document.idx", "_targets_document.bin", "_targets_document.idx"):
        write(P(root, "pfx" + suffix), b"\x00\xff" * 4)
    write(P(root, "jpfx_inputs_document.bin"), '{"not": "binary"}\n')
    return t


def _file(t, name):
    return {"ckpt": t.ckpt, "metrics": t.metrics, "config": t.config, "png": P(t.root, "old.png"),
            "json": P(t.root, "old.json"), "jsonl": P(t.root, "old.jsonl"), "bin": P(t.root, "old.bin"),
            "py": P(t.root, "configs", "my.py"), "txt": P(t.root, "notes.txt"), "json_png": P(t.root, "plotj.png")}[name]


# (label, dest) -> how to run it with the output at `out`: argv(t, out) (the force flag is added
# by the case), the force flag, the kind's same-kind file (refused without force), the files of
# other kinds to try, and whether an argv(t, out=input) makes the output its own input
EVAL_FILE = dict(force="--force", same="json", others=("ckpt", "metrics", "config", "png", "py", "bin"))
OUTPUT_CASES = {
    ("plot.py", "out"): dict(argv=lambda t, o: [t.run, f"--out={o}"], force="--force", same="png",
                             others=("ckpt", "metrics", "config", "json", "py"), own=lambda t: [t.metrics, f"--out={t.metrics}"]),
    ("evaluation/eval_wikitext.py", "out"): dict(argv=lambda t, o: [f"--checkpoint={t.weights}", f"--out={o}"],
                                                 own=lambda t: [f"--checkpoint={t.weights2}", f"--out={t.weights2}"],
                                                 **EVAL_FILE),
    ("evaluation/eval_wikitext.py eval", "out"): dict(argv=lambda t, o: ["eval", f"--checkpoint-file={t.weights}",
                                                                         f"--out={o}"], **EVAL_FILE),
    ("evaluation/eval_lambada.py", "out"): dict(argv=lambda t, o: [f"--checkpoint={t.weights}", f"--out={o}"], **EVAL_FILE),
    ("evaluation/eval_lambada.py:ORIGINAL", "out"): dict(argv=lambda t, o: [f"--checkpoint-file={t.weights}", f"--out={o}"],
                                                         **EVAL_FILE),
    ("evaluation/eval_features.py", "out"): dict(argv=lambda t, o: [f"--checkpoint={t.weights}", f"--out={o}"],
                                                 **EVAL_FILE),
    ("evaluation/eval_features.py", "generations_out"): dict(
        argv=lambda t, o: [f"--checkpoint={t.weights}", f"--generations_out={o}"], force="--force", same="jsonl",
        others=("ckpt", "metrics", "png", "py", "bin")),
    ("evaluation/eval_features.py", "judge_cache"): dict(  # appended to: an existing cache is not refused
        argv=lambda t, o: [f"--checkpoint={t.weights}", "--judge=llm", f"--judge_cache={o}"], force="--force",
        same=None, others=("ckpt", "metrics", "png", "py", "bin")),
    ("evaluation/probe.py", "out"): dict(argv=lambda t, o: [f"--checkpoint={t.weights}", "--dataset=x", f"--out={o}"],
                                         **EVAL_FILE),
    ("evaluation/eval_rank.py", "out"): dict(argv=lambda t, o: [f"--checkpoint={t.weights}", f"--out={o}"], **EVAL_FILE),
    ("evaluation/eval_harness.py", "out"): dict(argv=lambda t, o: [f"--checkpoint={t.weights}", "--tasks=hellaswag",
                                                                 f"--out={o}"], **EVAL_FILE),
    ("evaluation/compare_checkpoints.py", "out"): dict(argv=lambda t, o: [t.weights, t.weights2, f"--out={o}"],
                                                       own=lambda t: [t.weights, t.weights2, f"--out={t.weights2}"],
                                                       **EVAL_FILE),
    ("evaluation/compare_checkpoints.py", "plot"): dict(argv=lambda t, o: [t.weights, t.weights2, f"--plot={o}"],
                                                        force="--force", same="png",
                                                        others=("ckpt", "metrics", "config", "json", "py")),
    ("export.py", "filepath"): dict(argv=lambda t, o: [o, f"--checkpoint={t.weights}"], force="--force", same="bin",
                                    others=("ckpt", "metrics", "config", "png", "json", "py"),
                                    own=lambda t: [t.weights, f"--checkpoint={t.weights}", "--force"]),
    ("grow.py", "plan_out"): dict(argv=lambda t, o: ["--plan", f"--runs={t.run}", "--budget=1e15", f"--plan_out={o}"],
                                  **EVAL_FILE),
    ("grow.py", "out_dir"): dict(argv=lambda t, o: ["--doubling=weights", f"--resume={t.weights}", f"--out_dir={o}"],
                                 force="--force", folder_of="ckpt.pt", same=None, others=("ckpt",),
                                 own=lambda t: ["--doubling=weights", f"--resume={t.ckpt}", f"--out_dir={t.run}"]),
    ("finetune_t0.py:SCHEMA", "output_prefix"): dict(
        argv=lambda t, o: ["--preprocess", f"--input={P(t.root, 'in.jsonl')}", f"--model_dir={t.weights}",
                           f"--output_prefix={o}"], force="--overwrite=True", prefix=("pfx", "jpfx")),
    ("finetune_t0.py:SCHEMA", "make_demo_data"): dict(argv=lambda t, o: [f"--make_demo_data={o}"], force="--overwrite=True",
                                                      folder=("demo", "foreign", "run")),
    ("sweep.py", "out_dir"): dict(argv=lambda t, o: [P(t.root, "s.yaml"), f"--out_dir={o}", "--dry_run"],
                                  force=None, folder=(None, "foreign", "run"), appends="sweep"),
    ("tinystories.py", "dataset_name"): dict(dataset=True),
    ("experiments/deletion_recovery.py", "out_dir"): dict(argv=lambda t, o: [f"--out_dir={o}", "--jobs=0"], force=None,
                                                           folder=(None, "foreign", "run"), appends="exp"),
    ("experiments/staged_training.py", "out_dir"): dict(argv=lambda t, o: [f"--out_dir={o}", "--plots="],
                                                         force="--force", folder=("exp", "foreign", "run")),
    ("experiments/staged_training.py", "plots"): dict(
        argv=lambda t, o: [f"--out_dir={P(t.root, 'new_exp')}", f"--plots={o[:-len('.png')]}"], force="--force",
        same="png", others=("json_png",)),
    # run folders: rundir.RunDir's rules, which the cases of the table above test (an existing run is
    # refused without --overwrite=True and then moved aside, a file in the way, a read-only folder)
    ("train.py:SCHEMA", "out_dir"): dict(run=True),
    ("train.py:SCHEMA", "save_prefix"): dict(run=True),  # save_dir/save_prefix is out_dir (test_staged_flags_bad_input)
    ("finetune_t0.py:SCHEMA", "out_dir"): dict(run=True),
    ("evaluation/eval_wikitext.py train", "log_dir"): dict(run=True),
}


def test_every_output_flag_is_declared_and_has_a_guard_case():
    found = declared_outputs()
    assert len(found) >= 20, sorted(found)  # the walk sees the tools' outputs
    missing = sorted(set(found) - set(OUTPUT_CASES))
    assert not missing, f"output flags without a case in OUTPUT_CASES (add one, so the guard is tested): {missing}"
    stale = sorted(set(OUTPUT_CASES) - set(found))
    assert not stale, f"OUTPUT_CASES rows no parser has any more: {stale}"


def _guard_cases():
    """(id, label, script, argv(t), fragments): one refused command each, all expected to exit 2
    with one error line and no file changed."""
    out = []
    for (label, dest), c in OUTPUT_CASES.items():
        script = label.split(":")[0].split(" ")[0]
        name = f"{label.replace(':SCHEMA', '').replace(':', '-')}--{dest}"
        if c.get("run") or c.get("dataset"):
            continue
        force = [c["force"]] if c.get("force") else []
        if c.get("prefix"):
            same, other = c["prefix"]
            out.append((f"{name}-exists", script, lambda t, c=c, s=same: c["argv"](t, P(t.root, s)),
                        ("already exists", c["force"])))
            out.append((f"{name}-other-kind", script, lambda t, c=c, o=other, f=force: c["argv"](t, P(t.root, o)) + f,
                        ("a JSON file", "never replaced")))
            continue
        if c.get("folder") or c.get("folder_of"):
            kinds = c.get("folder") or ("run",)
            for kind in kinds:
                if kind is None:
                    continue
                what = {"run": ("training", "never replaced"), "foreign": ("mine.txt", "never replaced"),
                        "demo": ("already exists", c["force"] or ""), "exp": ("already exists", c["force"] or "")}[kind]
                extra = force if kind in ("run", "foreign") else []
                out.append((f"{name}-{kind}", script, lambda t, c=c, k=kind, e=extra: c["argv"](t, P(t.root, k)) + e, what))
        else:
            if c.get("same"):
                out.append((f"{name}-exists", script, lambda t, c=c: c["argv"](t, _file(t, c["same"])),
                            ("already exists", c["force"])))
            for other in c["others"]:
                why = {"ckpt": "training checkpoint", "metrics": "metrics log", "config": "run's config.json"}.get(other,
                                                                                                                   "this command writes")
                out.append((f"{name}-over-{other}", script, lambda t, c=c, o=other, f=force: c["argv"](t, _file(t, o)) + f,
                            (why, "never replaced")))
        if c.get("own"):
            out.append((f"{name}-own-input", script, lambda t, c=c, f=force: c["own"](t) + f, ("own input",)))
    return out


GUARD_CASES = _guard_cases()


@pytest.mark.parametrize("case", GUARD_CASES, ids=[c[0] for c in GUARD_CASES])
def test_output_guard_refuses(case, targets, tmp_path):
    _, script, argv, fragments = case
    before = snapshot(targets.root)
    proc = run_main(script, argv(targets), cwd=str(tmp_path))
    assert_error(proc, 2, *[f for f in fragments if f])
    assert_nothing_lost(before, snapshot(targets.root), nothing_new=True)


@pytest.mark.parametrize("label", ["sweep", "exp"])
def test_output_guard_continues_the_tools_own_folders(label, targets, tmp_path):
    """sweep.py continues its own sweep folder, deletion_recovery.py its own experiment folder."""
    script, argv = {"sweep": ("sweep.py", [P(targets.root, "s.yaml"), f"--out_dir={P(targets.root, 'sweep')}",
                                           "--dry_run"]),
                    "exp": ("experiments/deletion_recovery.py", [f"--out_dir={P(targets.root, 'exp')}", "--jobs=0"])}[label]
    before = snapshot(targets.root)
    proc = run_main(script, argv, cwd=str(tmp_path))
    if label == "sweep":
        assert proc.returncode == 0, proc.stderr
    else:  # past the guard: the next check is the bad --jobs
        assert_error(proc, 2, "--jobs")
    assert_nothing_lost(before, snapshot(targets.root), nothing_new=True)


@pytest.mark.parametrize("kind", ["exists", "foreign", "run", "force-moves-aside"])
def test_pretokenize_into_an_existing_dataset(kind, world, tmp_path):
    """An existing dataset name is refused without --force and moved aside with it; a folder that is
    not a dataset (or holds a run) is refused even with --force."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    cache = copy_raw(ctx)
    folder = P(cache, "tok8192", "base")
    if kind == "foreign":
        write(P(folder, "mine.txt"), "x")
    elif kind == "run":
        shutil.copytree(world.run, folder)
    else:
        assert run_main("tinystories.py", PRE(ctx, "--dataset_name=base")).returncode == 0
    before = snapshot(tmp_path)
    proc = run_main("tinystories.py", PRE(ctx, "--dataset_name=base", "--filtering=features=Twist",
                                          *(["--force"] if kind != "exists" else [])))
    if kind == "force-moves-aside":
        assert proc.returncode == 0, proc.stderr
        aside = [n for n in os.listdir(P(cache, "tok8192")) if n.startswith("base.previous-")]
        assert len(aside) == 1 and "moved the previous base" in proc.stdout
        moved = {p.replace(folder, P(cache, "tok8192", aside[0]), 1): h for p, h in before.items() if p.startswith(folder)}
        assert {p: h for p, h in snapshot(tmp_path).items() if p in moved} == moved  # the old dataset, byte for byte
        assert json.load(open(P(folder, "manifest.json")))["options"]["filtering"] == "features=Twist"
        return
    assert_error(proc, 2, *{"exists": ("already exists", "--force"), "foreign": ("mine.txt", "never replaced"),
                            "run": ("training run", "never replaced")}[kind])
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


@pytest.mark.parametrize("case", ["force-replaces-same-kind", "force-moves-hf-folder-aside"])
def test_force_replaces_an_output_of_the_same_kind(case, world, tmp_path):
    """With --force an earlier output of the same kind is replaced (a file atomically, a folder
    moved aside), and nothing else changes."""
    if case == "force-replaces-same-kind":
        out = P(str(tmp_path), "m.json")
        write(out, '{"old": 1}\n')
        proc = run_main("evaluation/eval_wikitext.py", EV(SimpleNamespace(w=world), f"--data={WIKITEXT}", "--max_rows=3",
                                                          f"--out={out}", "--force"))
        assert proc.returncode == 0, proc.stderr
        assert json.load(open(out))["tokens"] > 0
        return
    out = P(str(tmp_path), "hf")
    assert run_main("export.py", [out, "--version=-1", f"--checkpoint={world.ckpt}"]).returncode == 0
    before = snapshot(out)
    proc = run_main("export.py", [out, "--version=-1", f"--checkpoint={world.ckpt}", "--force"])
    assert proc.returncode == 0, proc.stderr
    aside = [n for n in os.listdir(tmp_path) if n.startswith("hf.previous-")]
    assert len(aside) == 1
    assert {p.replace(out, P(str(tmp_path), aside[0]), 1): h for p, h in before.items()} == snapshot(P(str(tmp_path), aside[0]))


def test_grow_force_replaces_its_own_earlier_output_only(world, tmp_path):
    """grow.py --force may replace the checkpoint an earlier grow.py wrote, never a training run's."""
    out = P(str(tmp_path), "grown")
    assert run_main("grow.py", GROW(SimpleNamespace(t=str(tmp_path), w=world), "--doubling=layers", out=out)).returncode == 0
    assert_error(run_main("grow.py", GROW(SimpleNamespace(t=str(tmp_path), w=world), "--doubling=layers", out=out)), 2,
                 "already exists", "--force")
    proc = run_main("grow.py", GROW(SimpleNamespace(t=str(tmp_path), w=world), "--doubling=layers", "--force", out=out))
    assert proc.returncode == 0, proc.stderr
    # once a run continued it (metrics.jsonl beside it), it is that run's checkpoint
    write(P(out, "metrics.jsonl"), '{"iter": 2}\n')
    assert_error(run_main("grow.py", GROW(SimpleNamespace(t=str(tmp_path), w=world), "--doubling=layers", "--force",
                                          out=out)), 2, "training checkpoint", "never replaced")


SNIFFED = [(b"\x89PNG\r\n\x1a\n....", "x.png", {"png"}), (b'{"a": 1}\n', "x.json", {"json", "jsonl"}),
           (b'{\n "a": 1\n}\n', "x.json", {"json"}), (b'{"a": 1}\n{"a": 2}\n', "x.jsonl", {"jsonl"}),
           (b"lr = 1\n", "x.py", {"python"}), (b"hello\n", "x.txt", {"text"}), (b"\x00\x01\xff", "x.bin", {"binary"}),
           (b"", "x.json", {"empty"}), (b"PK\x03\x04junk", "x.zip", {"zip"})]


@pytest.mark.parametrize("data,name,tags", SNIFFED, ids=[f"{n}-{'-'.join(sorted(t))}" for _, n, t in SNIFFED])
def test_sniff_tells_a_files_kind_by_its_content(data, name, tags, tmp_path):
    from tinylab.core.outputs import sniff
    write(P(str(tmp_path), name), data)
    assert sniff(P(str(tmp_path), name)) == tags


def test_sniff_knows_a_torch_checkpoint_whatever_its_name(tmp_path):
    from tinylab.core.outputs import guard_file, sniff
    path = training_ckpt(P(str(tmp_path), "renamed.json"))
    assert sniff(path) == {"torch"}
    with pytest.raises(Exception, match="training checkpoint"):
        guard_file(path, "json", force=True)


# ---------------------------------------------------------------------- resuming and fine-tuning with other optimizer settings
#
# Resuming with other optimizer settings: the checkpoint's optimizer state is mapped onto the new
# optimizer by parameter name, so a run resumed (train.py init_from=resume_train) or restarted with
# its optimizer state (finetune_t0.py --reset-progress) with another weight decay, betas or eps
# continues with the config's settings (and a notice); a checkpoint whose optimizer state is not
# this model's is still one error line that names the parameter, with nothing lost.
#
# The AdamW step after a change of weight decay is checked against the update written out here;
# checkpoints written before parameter groups were defined by role (groups by the decay's value)
# are rebuilt by hand and still resume.


SHAPE = dict(n_layers=2, max_seq_len=128)


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    """Finished 2-iteration train.py runs (read-only; copy one before resuming it): `decay` with
    weight_decay=0.1, `no_decay` with weight_decay=0, `adafactor` (weight_decay=0.1); `t0` is the
    T0 demo mixture (conftest.make_t0_setup)."""
    root = str(tmp_path_factory.mktemp("optim_runs"))
    out = {}
    for name, over in [("decay", {"weight_decay": 0.1}), ("no_decay", {"weight_decay": 0.0}),
                       ("adafactor", {"weight_decay": 0.1, "optimizer": "adafactor"})]:
        out[name] = os.path.join(root, name)
        proc = run_main("train.py", train_argv(tiny_corpus, out[name], **SHAPE, **over))
        assert proc.returncode == 0, proc.stderr
    out["mixture"], _ = make_t0_setup(os.path.join(root, "t0"))
    return out


def copy_run(runs, name, tmp_path):
    dst = str(tmp_path / name)
    shutil.copytree(runs[name], dst)
    return dst


def resume(tiny_corpus, out, **over):
    return run_main("train.py", train_argv(tiny_corpus, out, **SHAPE, init_from="resume_train", max_iters=4, **over))


def load(path):
    return torch.load(os.path.join(path, "ckpt.pt"), weights_only=True)


def state_by_name(ckpt):
    """{name: saved per-parameter state} of a checkpoint, through its param_names."""
    return {n: ckpt["optimizer"]["state"].get(i, {}) for i, n in enumerate(ckpt["param_names"])}


def groups_by_name(ckpt):
    """{name: its saved parameter group (without params)} of a checkpoint."""
    out = {}
    for g in ckpt["optimizer"]["param_groups"]:
        for i in g["params"]:
            out[ckpt["param_names"][i]] = {k: v for k, v in g.items() if k != "params"}
    return out


# ---------------------------------------------------------------------- works now

@pytest.mark.slow
@pytest.mark.parametrize("start, new", [("decay", 0.0), ("no_decay", 0.1)])
def test_resume_train_with_another_weight_decay(runs, tiny_corpus, tmp_path, start, new):
    out = copy_run(runs, start, tmp_path)
    old = 0.1 if start == "decay" else 0.0
    proc = resume(tiny_corpus, out, weight_decay=new)
    assert proc.returncode == 0, proc.stderr
    assert f"notice: optimizer settings from the config replace the checkpoint's: weight_decay {old} -> {new}" \
        in proc.stdout
    ckpt = load(out)
    assert ckpt["iter_num"] == 4
    groups = groups_by_name(ckpt)
    for name, g in groups.items():
        matrix = ckpt["model"][name].dim() >= 2
        assert g["role"] == ("decay" if matrix else "no_decay"), name
        assert g["weight_decay"] == (new if matrix else 0.0), name
    # the moments went on from the checkpoint's: 2 steps before, 2 after
    assert all(float(st["step"]) == 4 for st in state_by_name(ckpt).values())


@pytest.mark.slow
def test_resume_train_with_other_betas_and_eps(runs, tiny_corpus, tmp_path):
    out = copy_run(runs, "decay", tmp_path)
    proc = resume(tiny_corpus, out, beta1=0.8, beta2=0.99, adam_eps=1e-6)
    assert proc.returncode == 0, proc.stderr
    notice = [l for l in proc.stdout.splitlines() if l.startswith("notice: optimizer settings")]
    assert notice == ["notice: optimizer settings from the config replace the checkpoint's: "
                      "betas (0.9, 0.95) -> (0.8, 0.99); eps 1e-08 -> 1e-06"]
    groups = load(out)["optimizer"]["param_groups"]
    assert {g["role"] for g in groups} == {"decay", "no_decay"}
    assert all(tuple(g["betas"]) == (0.8, 0.99) and g["eps"] == 1e-6 for g in groups)


def test_resume_train_adafactor_with_another_weight_decay(runs, tiny_corpus, tmp_path):
    out = copy_run(runs, "adafactor", tmp_path)
    before = state_by_name(load(out))
    proc = resume(tiny_corpus, out, optimizer="adafactor", weight_decay=0.0)
    assert proc.returncode == 0, proc.stderr
    assert "replace the checkpoint's: weight_decay 0.1 -> 0.0" in proc.stdout
    ckpt = load(out)
    assert [(g["role"], g["weight_decay"]) for g in ckpt["optimizer"]["param_groups"]] == \
        [("decay", 0.0), ("no_decay", 0.0)]
    after = state_by_name(ckpt)
    assert before.keys() == after.keys() and all(after[n]["step"] == before[n]["step"] + 2 for n in before)


def test_finetune_t0_reset_progress_on_a_train_py_checkpoint(runs, tmp_path):
    """finetune_t0.py's weight_decay is 0, the train.py checkpoint's 0.1: the optimizer state is
    kept (by name) under the finetuning config's settings, and the run restarts at iteration 0."""
    base = runs["decay"]
    saved = load(base)
    out = str(tmp_path / "ft")
    argv = [f"--mixture={runs['mixture']}", f"--model_dir={base}", f"--out_dir={out}", "--batch_size=2",
            "--max_iters=2", "--eval_interval=2", "--eval_iters=1", "--rank_eval_examples=2", "--device=cpu",
            "--dtype=float32", "--lr_scheduling=False"]
    cfg = FINETUNE_T0.parse([*argv, "--reset-progress"])
    run = Run.from_config(cfg)
    model, ckpt = init_model(cfg, run)
    trainer = Trainer(TrainerOptions.from_config(cfg), run, model, iter([]), lambda *a: {},
                      training_state(cfg, ckpt, reset_progress=True), config=cfg)
    now = trainer.optimizer.state_dict()
    restored = {n: now["state"][i] for g in now["param_groups"] for i, n in zip(g["params"], g["param_names"])}
    for name, st in state_by_name(saved).items():
        assert all(torch.equal(v, restored[name][k]) for k, v in st.items()), name
    assert all(g["weight_decay"] == 0.0 for g in trainer.optimizer.param_groups) and trainer.iter_num == 0

    proc = run_main("finetune_t0.py", [*argv, "--reset-progress"])
    assert proc.returncode == 0, proc.stderr
    assert "replace the checkpoint's: weight_decay 0.1 -> 0.0" in proc.stdout
    after = load(out)
    assert after["iter_num"] == 2
    assert all(float(st["step"]) == 2 + 2 for st in state_by_name(after).values())  # kept, continued


def test_a_grown_checkpoint_resumes_with_another_weight_decay(runs, tiny_corpus, tmp_path):
    """Exact width growth writes per-parameter overrides (lr_scale, eps, weight_decay_scale): the
    grown checkpoint's groups are by role and overrides, and resuming with weight_decay=0 keeps
    every moment under its name."""
    grown = str(tmp_path / "grown")
    proc = run_main("grow.py", [f"--resume={runs['decay']}/ckpt.pt", f"--out_dir={grown}", "--doubling=weights",
                                "--mode=exact"])
    assert proc.returncode == 0, proc.stderr
    written = load(grown)
    assert {g["role"] for g in written["optimizer"]["param_groups"]} == {"decay", "no_decay"}
    before = state_by_name(written)
    proc = run_main("train.py", train_argv(tiny_corpus, grown, init_from="resume_train", weight_decay=0.0,
                                           max_iters=3, **SHAPE))
    assert proc.returncode == 0, proc.stderr
    assert "weight_decay" in proc.stdout.split("replace the checkpoint's:")[1].splitlines()[0]
    after = load(grown)
    assert all(g["weight_decay"] == 0.0 for g in after["optimizer"]["param_groups"])
    assert all(float(st["step"]) == float(before[n]["step"]) + 1 for n, st in state_by_name(after).items())


def adamw_reference(p, g, m, v, step, lr, wd, beta1, beta2, eps):
    """AdamW (Loshchilov & Hutter, torch's form) in float64: decoupled decay p -= lr*wd*p, then the
    Adam update from the moments m, v after `step` earlier steps, with bias correction."""
    p, g, m, v = (t.double() for t in (p, g, m, v))
    t = step + 1
    p = p - lr * wd * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    return p - lr * m_hat / (v_hat.sqrt() + eps)


@pytest.mark.parametrize("start, new", [("decay", 0.0), ("no_decay", 0.5)])
def test_first_step_after_resume_uses_the_new_weight_decay(runs, tiny_corpus, tmp_path, start, new):
    out = copy_run(runs, start, tmp_path)
    saved = load(out)
    old = saved["config"]["weight_decay"]
    lr = 1e-2  # large enough that decay 0.5 vs 0 changes the step far beyond fp32 rounding
    cfg = TRAIN.parse(train_argv(tiny_corpus, out, **SHAPE, init_from="resume_train", weight_decay=new,
                                 learning_rate=lr))
    run = Run.from_config(cfg)
    model, ckpt = init_model(cfg, run)
    trainer = Trainer(TrainerOptions.from_config(cfg), run, model, iter([]), lambda *a: {}, training_state(cfg, ckpt),
                      config=cfg)
    torch.manual_seed(1)
    x = torch.randint(0, 8192, (2, 16))
    trainer.model(x, x.roll(-1, dims=1), return_logits=False)
    trainer.raw_model.last_loss.backward()
    params = dict(trainer.raw_model.named_parameters())
    names = ["layers.0.attention.wq.weight", "layers.0.attention_norm.weight"]
    grads = {n: params[n].grad.clone() for n in names}
    before = {n: params[n].detach().clone() for n in names}
    for g in trainer.optimizer.param_groups:
        g["lr"] = lr
    trainer.optimizer.step()
    moments = state_by_name(saved)
    for name in names:
        st = moments[name]
        assert torch.equal(before[name], saved["model"][name])
        wd = new if before[name].dim() >= 2 else 0.0  # norms are never decayed
        args = dict(step=int(st["step"]), lr=lr, beta1=cfg["beta1"], beta2=cfg["beta2"], eps=cfg["adam_eps"])
        want = adamw_reference(before[name], grads[name], st["exp_avg"], st["exp_avg_sq"], wd=wd, **args)
        got = params[name].detach().double()
        assert torch.allclose(got, want, rtol=0, atol=1e-7), (name, (got - want).abs().max())
        if before[name].dim() >= 2:  # the old decay would have given another step
            stale = adamw_reference(before[name], grads[name], st["exp_avg"], st["exp_avg_sq"], wd=old, **args)
            assert (got - stale).abs().max() > 1e-5, name


def old_layout(ckpt):
    """The checkpoint as it was written before groups were defined by role: parameters grouped by
    the value of their weight decay (so with weight_decay=0 one group in model order), no "role",
    param_names in the state-dict index order of those groups."""
    by_name, groups = state_by_name(ckpt), groups_by_name(ckpt)
    values = {}
    for name in ckpt["model"]:
        if name in by_name:
            values.setdefault(groups[name]["weight_decay"], []).append(name)
    names = [n for members in values.values() for n in members]
    index = {n: i for i, n in enumerate(names)}
    param_groups = []
    for members in values.values():
        g = {k: v for k, v in groups[members[0]].items() if k not in ("role", "param_names")}
        param_groups.append({**g, "param_names": members, "params": [index[n] for n in members]})
    optimizer = {"state": {index[n]: st for n, st in by_name.items() if st}, "param_groups": param_groups}
    return {**ckpt, "optimizer": optimizer, "param_names": names}


@pytest.mark.slow
@pytest.mark.parametrize("new", [0.0, 0.1])
def test_a_checkpoint_in_the_old_layout_still_resumes(runs, tiny_corpus, tmp_path, new):
    """Built from a weight_decay=0 run: the old layout is one group in model order, the new one
    matrices then norms; the resumed run is the same as from the new-layout checkpoint."""
    new_layout, old = copy_run(runs, "no_decay", tmp_path), str(tmp_path / "old")
    shutil.copytree(new_layout, old)
    legacy = old_layout(load(old))
    assert len(legacy["optimizer"]["param_groups"]) == 1 and legacy["param_names"] != load(old)["param_names"]
    ckpt_lib.save_checkpoint(legacy, os.path.join(old, "ckpt.pt"))
    for out in (new_layout, old):
        proc = resume(tiny_corpus, out, weight_decay=new)
        assert proc.returncode == 0, proc.stderr
        assert ("weight_decay 0.0 -> 0.1" in proc.stdout) == (new == 0.1)
    a, b = load(new_layout), load(old)
    assert a["param_names"] == b["param_names"]  # written back in the new layout
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# ---------------------------------------------------------------------- one line when it cannot

def drop_parameter(ckpt, name):
    """The checkpoint without `name` in its optimizer state (param_names and the indices after it
    shifted, as a hand edit would leave a consistent state dict)."""
    names = [n for n in ckpt["param_names"] if n != name]
    by_name = state_by_name(ckpt)
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "param_names": [n for n in g["param_names"] if n != name],
               "params": [index[n] for n in g["param_names"] if n != name]} for g in ckpt["optimizer"]["param_groups"]]
    return {**ckpt, "param_names": names,
            "optimizer": {"state": {index[n]: by_name[n] for n in names}, "param_groups": groups}}


def add_parameter(ckpt, name):
    st = state_by_name(ckpt)["layers.0.attention.wq.weight"]
    i = len(ckpt["param_names"])
    groups = [dict(g) for g in ckpt["optimizer"]["param_groups"]]
    groups[-1] = {**groups[-1], "params": groups[-1]["params"] + [i], "param_names": groups[-1]["param_names"] + [name]}
    return {**ckpt, "param_names": ckpt["param_names"] + [name],
            "optimizer": {"state": {**ckpt["optimizer"]["state"], i: st}, "param_groups": groups}}


def reshape_moment(ckpt, name):
    i = ckpt["param_names"].index(name)
    state = dict(ckpt["optimizer"]["state"])
    state[i] = {**state[i], "exp_avg": state[i]["exp_avg"][:, :-1].clone()}
    return {**ckpt, "optimizer": {**ckpt["optimizer"], "state": state}}


EDITS = {
    "missing": (lambda c: drop_parameter(c, "layers.0.ffn_norm.weight"),
                "no state for layers.0.ffn_norm.weight"),
    "extra": (lambda c: add_parameter(c, "layers.7.attention.wq.weight"),
              "state for layers.7.attention.wq.weight, which this model does not have"),
    "shape": (lambda c: reshape_moment(c, "layers.0.attention.wq.weight"),
              "exp_avg of layers.0.attention.wq.weight has shape (16, 15), the parameter needs (16, 16)"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("how", ["resume_train", "reset_progress"])
def test_optimizer_state_of_another_model_is_one_error_line(runs, tiny_corpus, tmp_path, edit, how):
    change, fragment = EDITS[edit]
    run = copy_run(runs, "decay", tmp_path)
    ckpt_lib.save_checkpoint(change(load(run)), os.path.join(run, "ckpt.pt"))
    before = snapshot(tmp_path)
    if how == "resume_train":
        proc = resume(tiny_corpus, run, weight_decay=0.0)
    else:
        proc = run_main("finetune_t0.py", [f"--mixture={runs['mixture']}", f"--model_dir={run}",
                                           f"--out_dir={tmp_path / 'ft'}", "--batch_size=2", "--max_iters=2",
                                           "--device=cpu", "--dtype=float32", "--reset-progress"])
    assert_error(proc, 2, "optimizer state does not fit this model's parameters", fragment, "init_from=resume_model")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


# ---------------------------------------------------------------------- rules between keys, sweeps, Ctrl-C endings
#
# Rules between keys that used to be accepted silently, each now one `error:` line before anything
# is written (or, where running is right, a one-line notice and the run goes on): a warmup longer
# than the schedule, growth the run never reaches, `auto:` without an operator, grow.py's restart
# flags, a growth plan from an incomplete config.json, plot names no run has, a rank evaluation
# with nothing to rank, empty raw shards; sweep.py reading a program's keys without running it,
# its failed-run and Ctrl-C endings; the trainer's Ctrl-C ending ("error: interrupted" last).
#
# The same standard as tests/test_bad_input.py: exit code, exactly one error line with the key
# names, no traceback, every file that existed before byte-identical afterwards.


def ctx_of(world, tmp_path):
    return SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# ---------------------------------------------------------------------- the table of refused commands

class RuleCase:
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


def PRE_D(ctx, *extra):
    return ["pretokenize", "--vocab_size=8192", f"--data_cache_dir={P(ctx.t, 'cache')}", "--workers=1",
            "--dataset_name=d", *extra]


QUESTIONS = [{"inputs": f"Is {i} even?", "targets": "yes" if i % 2 == 0 else "no"} for i in range(6)]

RULE_CASES = [
    # a scheduled run whose warmup never ends (the decay ends at max_iters with lr_decay_iters=0)
    *[RuleCase(f"warmup-longer-than-run-{kind}", "train.py", lambda x, k=kind: T(x, warmup_iters=5, lr_schedule=k),
           "warmup_iters=5", "max_iters=2", f"the {kind} schedule") for kind in ("cosine", "linear", "constant")],
    RuleCase("warmup-longer-than-one-step", "train.py", lambda x: T(x, warmup_iters=2, max_iters=1, eval_interval=1),
         "warmup_iters=2", "max_iters=1"),
    RuleCase("warmup-longer-than-finetune", "finetune_t0.py", lambda x: T0(x, lr_scheduling=True, warmup_iters=5),
         "warmup_iters=5", "max_iters=2"),
    # growth the run never reaches
    RuleCase("grow-step-beyond-max-iters", "train.py", lambda x: T(x, grow_schedule="3:weights"),
         "grow_schedule step 3", "max_iters=2"),
    RuleCase("grow-step-beyond-the-shifted-end", "train.py", lambda x: T(x, grow_schedule="2:weights,5:layers"),
         "grow_schedule step 5", "max_iters=2", "iteration 3"),  # 2 -> round(2 / 1.776) = 1: the end moves to 3
    RuleCase("grow-step-beyond-exact-mode", "train.py", lambda x: T(x, grow_schedule="3:weights", grow_mode="exact"),
         "grow_schedule step 3", "max_iters=2"),
    # auto without an operator
    *[RuleCase(f"grow-auto-{i}", "train.py", lambda x, s=s: T(x, grow_schedule=s), "grow_schedule=", what)
      for i, (s, what) in enumerate([("auto:", "no operator"), ("auto: , ", "no operator"),
                                     ("auto:weights,", "an empty operator")])],
    # grow.py's restart flags against the checkpoint's schedule (the world's run: max_iters=2)
    RuleCase("grow-restart-warmup-too-long", "grow.py",
         lambda x: GROW(x, "--doubling=weights", "--restart_steps=1", "--restart_warmup_steps=5"),
         "--restart_warmup_steps=5", "--restart_steps=1", "max_iters=2"),
    RuleCase("grow-restart-warmup-too-long-from-0", "grow.py",
         lambda x: GROW(x, "--doubling=layers", "--restart_steps=0", "--restart_warmup_steps=3"),
         "--restart_warmup_steps=3", "max_iters=2"),
    RuleCase("grow-reset-lr-without-restart", "grow.py", lambda x: GROW(x, "--doubling=weights", "--reset_lr_scheduler"),
         "--reset_lr_scheduler needs --restart_steps"),
    RuleCase("grow-restart-warmup-without-restart", "grow.py",
         lambda x: GROW(x, "--doubling=weights", "--restart_warmup_steps=2"), "--restart_warmup_steps needs --restart_steps"),
    # grow.py --plan on a config.json without what the planner reads
    *[RuleCase(f"plan-config-without-{'-'.join(keys)}", "grow.py", PLAN, "runs/small", "config.json has no", *keys,
           setup=lambda x, k=keys: plan_run(x, k))
      for keys in (("dim",), ("n_heads", "vocab_size"), ("batch_size",), ("warmup_iters",))],
    # plot names no run has
    RuleCase("plot-x-unknown", "plot.py", lambda x: PLOT(x, "--x=tokens"), "--x=tokens", "they have:", "loss/train",
         setup=plot_log),
    RuleCase("plot-metric-unknown", "plot.py", lambda x: PLOT(x, "--metrics=loss/train,loss/nope"), "--metrics",
         "loss/nope", "available:", setup=plot_log),
    RuleCase("plot-metric-never-with-x", "plot.py", lambda x: PLOT(x, "--metrics=loss/test", "--x=tokens_per_s"),
         "'loss/test'", "--x=tokens_per_s", setup=plot_log),
    # a rank evaluation with nothing to rank
    RuleCase("rank-no-choices", "evaluation/eval_rank.py", RANK, "no record to rank", "6 record(s) read",
         "6 with fewer than 2 non-empty answer_choices", setup=rank_file(QUESTIONS)),
    RuleCase("rank-target-not-a-choice", "evaluation/eval_rank.py", RANK, "no record to rank",
         "6 with a target that is not one of its answer_choices",
         setup=rank_file([dict(q, answer_choices=["true", "false"]) for q in QUESTIONS])),
    RuleCase("rank-mixed-reasons", "evaluation/eval_rank.py", RANK, "3 record(s) read", "1 with no inputs/targets text",
         "1 with fewer than 2", "1 with a target that is not",
         setup=rank_file([{"inputs": " ", "targets": "yes", "answer_choices": ["yes", "no"]},
                          {"inputs": "Q?", "targets": "yes", "answer_choices": ["yes"]},
                          {"inputs": "Q?", "targets": "maybe", "answer_choices": ["yes", "no"]}])),
    RuleCase("rank-empty-file", "evaluation/eval_rank.py", RANK, "q.jsonl is empty",
         setup=lambda x: write(P(x.t, "q.jsonl"), "")),
    # raw shards that are all empty lists
    RuleCase("pretokenize-all-shards-empty", "tinystories.py", PRE_D, "hold no stories", "all 3 are empty lists",
         setup=empty_shards(["data00.json", "data01.json", "data02.json"])),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in RULE_CASES])
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
    proc = run_main("tinystories.py", PRE_D(ctx, "--filtering=features!=Twist"))
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
from tinylab.core.config import Schema
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


@pytest.mark.slow
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


# ---------------------------------------------------------------------- sizes checked before allocation, allocation failures, failed runs rolled back
#
# Sizes that cannot fit, allocation failures, and runs that fail before doing any work.
#
# - Values too large for this machine (a huge dim, max_seq_len, batch_size, ...) are refused before
#   anything is built or written, with one line naming the key (tinylab/core/memory_budget.py), at every
#   command that allocates by them; "this machine's memory" is pretended small where the cases'
#   values are sane (the evaluation tools' batches are bounded by their data).
# - An allocation that still fails is one line, exit 1 (tinylab/core/errors.py); other errors stay
#   tracebacks.
# - A new run that fails before any work leaves no folder, and the same command then runs; a run
#   that logged training records keeps its folder (tinylab/core/rundir.py).
# - The estimate against independent references: model.num_params(), the bytes autograd saves
#   (saved_tensors_hooks), the optimizers' real state, and a measured peak RSS.


HUGE = 10 ** 14




def TS(ctx, **over):
    """test_bad_input's tiny train.py run (dim 16, one layer, GQA) on the session's corpus."""
    return train_argv(ctx.c, **{"out_dir": P(ctx.t, "out"), **over})


def lambada_file(ctx):
    with open(P(ctx.t, "l.jsonl"), "w") as f:
        for i in range(6):
            f.write(json.dumps({"text": f"Once upon a time there was a little dog named Spot number {i}"}) + "\n")


class SizeCase:
    """A command that must be refused: `memory` (bytes) pretends this machine has that much."""

    def __init__(self, id, script, argv, *fragments, code=2, memory=None, setup=None):
        self.id, self.script, self.argv, self.fragments = id, script, argv, fragments
        self.code, self.memory, self.setup = code, memory, setup


MiB = 2 ** 20
SIZE_CASES = [
    # train.py: every key a training step allocates by
    SizeCase("train-dim", "train.py", lambda x: TS(x, dim=10 ** 12, n_heads=2, n_kv_heads=1), "dim=1000000000000:",
         "training needs at least", "e+25 bytes", "parameters", "AdamW state", "lower dim"),
    SizeCase("train-max-seq-len", "train.py", lambda x: TS(x, max_seq_len=HUGE), f"max_seq_len={HUGE}:", "activations"),
    SizeCase("train-batch-size", "train.py", lambda x: TS(x, batch_size=HUGE), f"batch_size={HUGE}:", "lower batch_size",
         "activation_checkpointing=True"),
    SizeCase("train-batch-size-1e9", "train.py", lambda x: TS(x, batch_size=10 ** 9), "batch_size=1000000000:", "TiB"),
    SizeCase("train-n-layers-400-digits", "train.py", lambda x: TS(x, n_layers=10 ** 400), "n_layers=1.0e+400:", "e+4"),
    SizeCase("train-hidden-dim", "train.py", lambda x: TS(x, hidden_dim=10 ** 12), "hidden_dim=1000000000000:"),
    SizeCase("train-eval-batch-size", "train.py", lambda x: TS(x, eval_batch_size=HUGE), f"eval_batch_size={HUGE}:",
         "the loss evaluation needs"),
    SizeCase("train-generation-batch-size", "train.py", lambda x: TS(x, generation_batch_size=HUGE, max_new_tokens=8),
         f"generation_batch_size={HUGE}:", "KV cache"),
    SizeCase("train-checkpointing-still-too-big", "train.py", lambda x: TS(x, batch_size=HUGE, activation_checkpointing=True),
         f"batch_size={HUGE}:"),
    SizeCase("train-sane-values-small-machine", "train.py", lambda x: TS(x, batch_size=64, max_seq_len=32), "batch_size=64",
         "this machine has 1.0 MiB available", memory=MiB),
    # a resumed or fine-tuned run: the checkpoint's shape, the config's batch (checked in init_model)
    SizeCase("train-resume-model-batch", "train.py", lambda x: TS(x, init_from="resume_model", model_dir=x.w.run,
                                                              batch_size=HUGE), f"batch_size={HUGE}:"),
    # finetune_t0.py: the base checkpoint's shape; every micro-batch of a step is packed at once
    SizeCase("t0-batch-size", "finetune_t0.py", lambda x: T0(x, batch_size=HUGE), f"batch_size={HUGE}:"),
    SizeCase("t0-grad-accum", "finetune_t0.py", lambda x: T0(x, gradient_accumulation_steps=HUGE),
         f"gradient_accumulation_steps={HUGE}:", "batch buffers"),
    # sample.py: the KV cache and the sampling tables
    SizeCase("sample-num-samples", "sample.py", lambda x: EV(x, f"--num_samples={HUGE}"), f"--num_samples={HUGE}:",
         "generation needs at least"),
    SizeCase("sample-max-new-tokens", "sample.py", lambda x: EV(x, f"--max_new_tokens={HUGE}"),
         f"--max_new_tokens={HUGE}:", "the sampling schedule"),
    # the evaluation tools
    SizeCase("features-batch-size", "evaluation/eval_features.py", lambda x: EV(x, "--prompts_from=pretrain-all",
                                                                             f"--batch_size={HUGE}"),
         f"--batch_size={HUGE}:", "prompt windows"),
    SizeCase("features-num-samples", "evaluation/eval_features.py", lambda x: EV(x, "--prompts_from=pretrain-all",
                                                                              f"--num_samples={HUGE}"),
         f"--num_samples={HUGE}:"),
    SizeCase("wikitext-batch-size", "evaluation/eval_wikitext.py", lambda x: EV(x, f"--data={WIKITEXT}", f"--batch_size={HUGE}"),
         "--batch_size=", "logits", memory=MiB),
    SizeCase("lambada-batch-size", "evaluation/eval_lambada.py", lambda x: EV(x, f"--data={P(x.t, 'l.jsonl')}",
                                                                          f"--batch_size={HUGE}"),
         "--batch_size=6:", "logits", memory=MiB // 4, setup=lambada_file),
    SizeCase("lambada-original-batch", "evaluation/eval_lambada.py", lambda x: [f"--checkpoint-file={x.w.ckpt}",
                                                                            f"--path={P(x.t, 'l.jsonl')}", f"--batch={HUGE}",
                                                                            "--device=cpu"],
         "--batch=6:", memory=MiB // 4, setup=lambada_file),
    SizeCase("rank-batch-size", "evaluation/eval_rank.py", lambda x: EV(x, f"--mixture={x.w.mixture}", f"--batch_size={HUGE}"),
         "--batch_size=", "logits", memory=MiB // 4),
    # grow.py: the grown weights and moments (check_limits' sizes are fine here)
    SizeCase("grow-memory", "grow.py", lambda x: GROW(x, "--doubling=weights"), "growing to dim 32, 1 layers needs at least",
         "grown AdamW state", "grow on a machine with more memory", memory=64 * 1024),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in SIZE_CASES])
def test_size_refused(case, world, tmp_path, monkeypatch):
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    if case.setup:
        case.setup(ctx)
    if case.memory is not None:
        text = f"this machine has {memory_budget.bytes_text(case.memory)} available"
        monkeypatch.setattr(memory_budget, "available_memory", lambda device: (case.memory, text))
    roots = (tmp_path, world.root, world.corpus.cache_dir)
    before = snapshot(*roots)
    proc = run_main(case.script, case.argv(ctx), cwd=str(tmp_path))
    assert_error(proc, case.code, *case.fragments)
    assert_nothing_lost(before, snapshot(*roots), nothing_new=True)  # no out_dir, no output


# ---------------------------------------------------------------------- the error boundary

def _raise(e):
    def main():
        raise e
    return main


@pytest.mark.parametrize("exc, fragment", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
                  "to allocate 32768000000000000 bytes. Error code 12 (Cannot allocate memory)"),
     "error: out of memory: RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 32768000000000000"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB.\nGPU 0 has a total capacity of 79 GiB"),
     "error: out of memory: OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB."),
    (MemoryError(), "error: out of memory: MemoryError (lower batch_size"),
    (RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"), "out of memory: RuntimeError: MPS backend out of memory"),
    (OverflowError("Python int too large to convert to C long"), "error: a number too large: OverflowError: Python int"),
], ids=["cpu-allocator", "cuda-oom", "memory-error", "mps", "overflow"])
def test_allocation_failure_is_one_line(exc, fragment, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(_raise(exc))
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert_one_line_error(SimpleNamespace(returncode=1, stderr=err), fragment)


def test_numpy_allocation_failure_is_one_line(capsys):
    import numpy as np
    with pytest.raises(SystemExit) as e:
        cli_main(lambda: np.arange(HUGE, dtype=np.int64))  # numpy's _ArrayMemoryError, a MemoryError
    assert e.value.code == 1
    assert_one_line_error(SimpleNamespace(returncode=1, stderr=capsys.readouterr().err), "out of memory", "Unable to allocate")


def test_other_runtime_errors_stay_tracebacks():
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        cli_main(_raise(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")))


# ---------------------------------------------------------------------- a failed run never blocks the next

def fail_at_training_forward(monkeypatch, after=0):
    """The model's training forward passes raise the CPU allocator's error, from the (after+1)-th on
    (evaluation forwards in eval mode run)."""
    calls = {"n": 0}
    forward = Transformer.forward

    def failing(self, *a, **k):
        if self.training:
            calls["n"] += 1
            if calls["n"] > after:
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                                   "memory: you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)")
        return forward(self, *a, **k)
    monkeypatch.setattr(Transformer, "forward", failing)


def _argv(script, ctx, **over):
    return TS(ctx, max_new_tokens=4, **over) if script == "train.py" else T0(ctx, **over)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train.py", "finetune_t0.py"])
def test_allocation_failure_at_the_first_step_leaves_no_folder(script, world, tmp_path, monkeypatch):
    """The first training step cannot allocate (after the evaluation at iteration 0 was logged): one
    line, exit 1, no out_dir; the identical command then runs."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    out = P(ctx.t, "ft" if script == "finetune_t0.py" else "out")
    before = snapshot(tmp_path, world.root)
    with monkeypatch.context() as m:
        fail_at_training_forward(m)
        proc = run_main(script, _argv(script, ctx), cwd=str(tmp_path))
    assert_error(proc, 1, "error: out of memory: RuntimeError: DefaultCPUAllocator: can't allocate memory",
                 "(lower batch_size")
    assert not os.path.exists(out)
    assert_nothing_lost(before, snapshot(tmp_path, world.root), nothing_new=True)
    proc = run_main(script, _argv(script, ctx), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert os.path.isfile(P(out, "ckpt.pt")) and os.path.isfile(P(out, "config.json"))


def test_failed_first_step_in_a_users_folder_removes_only_the_runs_files(world, tmp_path, monkeypatch):
    """out_dir existed (with a file of the user's): the run's config.json and metrics.jsonl go, the
    folder and the user's file stay."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    out = P(ctx.t, "out")
    os.makedirs(out)
    with open(P(out, "notes.txt"), "w") as f:
        f.write("mine\n")
    before = snapshot(tmp_path)
    fail_at_training_forward(monkeypatch)
    assert_error(run_main("train.py", TS(ctx), cwd=str(tmp_path)), 1, "out of memory")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


def test_failed_first_step_with_overwrite_keeps_the_old_run_aside(world, tmp_path, monkeypatch):
    """--overwrite=True moved the old run aside before the step failed: it is there, byte for byte;
    out_dir holds nothing of the failed run, so the same command runs again."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    shutil.copytree(world.run, P(ctx.t, "out"))
    old = {os.path.relpath(p, P(ctx.t, "out")): h for p, h in snapshot(P(ctx.t, "out")).items()}
    with monkeypatch.context() as m:
        fail_at_training_forward(m)
        assert_error(run_main("train.py", TS(ctx, overwrite=True), cwd=str(tmp_path)), 1, "out of memory")
    aside = [d for d in os.listdir(ctx.t) if d.startswith("out.previous-")]
    assert len(aside) == 1
    assert {os.path.relpath(p, P(ctx.t, aside[0])): h for p, h in snapshot(P(ctx.t, aside[0])).items()} == old
    assert [e for e in os.listdir(P(ctx.t, "out")) if e != ".lock"] == []
    assert run_main("train.py", TS(ctx), cwd=str(tmp_path)).returncode == 0


def test_run_that_logged_training_keeps_its_folder(world, tmp_path, monkeypatch):
    """The second step fails after the first was logged: the folder is kept (real work), and the
    next run is told it holds a run."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    out = P(ctx.t, "out")
    with monkeypatch.context() as m:
        fail_at_training_forward(m, after=1)
        assert_error(run_main("train.py", TS(ctx, max_iters=4), cwd=str(tmp_path)), 1, "out of memory")
    rows = [json.loads(line) for line in open(P(out, "metrics.jsonl"))]
    assert [r["iter"] for r in rows if r["kind"] == "train"] == [0] and os.path.isfile(P(out, "config.json"))
    before = snapshot(tmp_path)
    assert_error(run_main("train.py", TS(ctx, max_iters=4), cwd=str(tmp_path)), 2, "already holds a run", "--overwrite=True")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


def test_failed_in_place_resume_is_never_rolled_back(world, tmp_path, monkeypatch):
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    out = P(ctx.t, "out")
    shutil.copytree(world.run, out)
    before = snapshot(tmp_path)
    fail_at_training_forward(monkeypatch)
    assert_error(run_main("train.py", TS(ctx, init_from="resume_train", max_iters=4), cwd=str(tmp_path)), 1, "out of memory")
    # the checkpoint as it was, the log's training records kept (the resume redid the evaluation at
    # iteration 2), config.json describes the resumed run: the folder stays as any resume leaves it
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True,
                        may_change={P(out, "config.json"), P(out, "metrics.jsonl")})
    assert [r["iter"] for r in map(json.loads, open(P(out, "metrics.jsonl"))) if r["kind"] == "train"] == [0, 1]


# ---------------------------------------------------------------------- the estimate against references

SHAPES = [
    dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=100, multiple_of=32),
    dict(dim=64, n_layers=3, n_heads=8, n_kv_heads=2, vocab_size=100, multiple_of=7),  # GQA
    dict(dim=48, n_layers=1, n_heads=4, n_kv_heads=1, vocab_size=33, multiple_of=16, tie_embeddings=False),  # untied
    dict(dim=96, n_layers=2, n_heads=6, n_kv_heads=3, vocab_size=50, hidden_dim=100),  # hidden_dim given
    dict(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=8192, multiple_of=32),  # base8M
    dict(dim=1024, n_layers=16, n_heads=16, n_kv_heads=4, vocab_size=32000, multiple_of=256, tie_embeddings=False),
]


@pytest.mark.parametrize("args", SHAPES)
def test_param_count_is_num_params(args):
    with torch.device("meta"):  # shapes only: nothing is allocated
        model = Transformer(ModelArgs(**args))
    assert memory_budget.param_count(memory_budget.Shape.from_model_args(model.params)) == model.num_params()
    cfg = {**TRAIN.defaults(), **args, "hidden_dim": args.get("hidden_dim", 0)}
    assert memory_budget.param_count(memory_budget.Shape.from_config(cfg)) == model.num_params()


def test_ffn_hidden_dim_is_the_models_rule():
    for multiple_of in (1, 7, 32, 256):
        for dim in list(range(1, 600)) + [4096, 5120, 10 ** 9 + 7]:
            assert memory_budget.ffn_hidden_dim(dim, multiple_of) == ModelArgs(dim=dim, multiple_of=multiple_of).ffn_hidden_dim()


def saved_for_backward(args, B, TS, checkpointing=False):
    """Bytes of the tensors autograd saves in one training forward (parameters left out), counted
    by storage through saved_tensors_hooks: an independent measurement of the activations."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**args)).train()
    model.activation_checkpointing = checkpointing
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t
    x = torch.randint(0, args["vocab_size"], (B, TS))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, x, return_logits=False)
    return sum(seen.values())


@pytest.mark.parametrize("args", [dict(dim=64, n_heads=4, n_kv_heads=4), dict(dim=128, n_heads=8, n_kv_heads=2),
                                  dict(dim=96, n_heads=4, n_kv_heads=2, hidden_dim=160)], ids=["mha", "gqa", "hidden"])
def test_activations_per_block_are_what_autograd_keeps(args):
    """One more block adds at least the estimate's 10 dim + 4 hidden fp32 values per token, and
    at most 15% more (the attention's per-head statistics)."""
    args = dict(vocab_size=256, multiple_of=32, max_seq_len=64, **args)
    B, TS = 4, 64
    per_block = saved_for_backward({**args, "n_layers": 2}, B, TS) - saved_for_backward({**args, "n_layers": 1}, B, TS)
    hidden = ModelArgs(**args).ffn_hidden_dim()
    estimate = B * TS * (10 * args["dim"] + 4 * hidden) * 4
    assert estimate <= per_block <= 1.15 * estimate, (per_block, estimate)


def test_activation_checkpointing_keeps_each_blocks_input():
    args = dict(vocab_size=256, multiple_of=32, max_seq_len=64, dim=64, n_heads=4, n_kv_heads=4)
    per_block = (saved_for_backward({**args, "n_layers": 3}, 4, 64, True)
                 - saved_for_backward({**args, "n_layers": 2}, 4, 64, True))
    assert per_block == 4 * 64 * 64 * 4  # its input, fp32


@pytest.mark.parametrize("optimizer, beta1", [("adamw", 0.0), ("adafactor", 0.0), ("adafactor", 0.9)])
def test_optimizer_state_is_the_real_state(optimizer, beta1):
    from tinylab.training.optim import build_optimizer
    args = SHAPES[1]
    cfg = {**TRAIN.defaults(), **args, "optimizer": optimizer, "adafactor_beta1": beta1, "adafactor_relative_step": False}
    model = Transformer(ModelArgs(**args))
    opt = build_optimizer(model, OptimizerOptions.from_config(cfg))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0)
    est = memory_budget.optimizer_state(memory_budget.Shape.from_config({**cfg, "hidden_dim": 0}),
                                        memory_budget.TrainingLoad.from_config(cfg), 4).bytes
    assert est == state


PEAK = r"""
import json, resource, sys, torch
sys.path.insert(0, sys.argv[1])
from model import ModelArgs, Transformer
from tinylab.core import memory_budget
from tinylab.training.optim import build_optimizer
from tinylab.training.options import OptimizerOptions
from tinylab.schema import TRAIN
torch.set_num_threads(1)
B = int(sys.argv[2])
shape = dict(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=32)
cfg = TRAIN.parse([f"--{k}={v}" for k, v in shape.items()] + [f"--batch_size={B}", "--max_seq_len=256"])
def steps(x, n):
    model = Transformer(ModelArgs(**shape, max_seq_len=256))
    opt = build_optimizer(model, OptimizerOptions.from_config(cfg))
    for _ in range(n):  # the second step with the optimizer's state
        model(x[:, :-1], x[:, 1:], return_logits=False)
        model.last_loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
steps(torch.randint(0, 512, (1, 9)), 1)  # the code and buffers of a first step, not measured
x = torch.randint(0, 512, (B, 257))
with open("/proc/self/statm") as f:
    before = int(f.read().split()[1]) * resource.getpagesize()  # the resident set now: Python, torch, the data
torch.manual_seed(0)
steps(x, 2)
# this process image's peak resident set (ru_maxrss would carry the forking parent's over exec)
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
est = memory_budget.training_estimate(cfg, memory_budget.Shape.from_config(cfg)).total
print(json.dumps({"measured": peak - before, "estimate": est}))
"""


def measured_peak(batch_size):
    proc = subprocess.run([PYTHON, "-c", PEAK, REPO, str(batch_size)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_estimate_is_below_a_measured_peak():
    """Fresh processes train two steps of a small model at 8 and 32 sequences of 256 tokens (fp32,
    AdamW; peak RSS, VmHWM, over the RSS before the model was built, after a tiny first step loaded
    the code; a fresh process each, as the peak only grows): each peak is above the estimate (a lower
    bound), and what 24 more sequences add is between 1x and 2x what the estimate adds for them
    (the per-token cost is honest)."""
    small, big = measured_peak(8), measured_peak(32)
    for r in (small, big):
        assert r["estimate"] <= r["measured"], r
    added, estimated = big["measured"] - small["measured"], big["estimate"] - small["estimate"]
    assert estimated > 100 * MiB  # activations dominate: 6144 more tokens
    assert estimated <= added <= 2 * estimated, (small, big)


@pytest.mark.parametrize("config, checkpointing, fits", [
    ("base8M", False, True), ("base30M", False, True), ("base91M", False, False), ("base210M", False, False),
    ("base91M", True, True), ("base210M", True, True)])
def test_the_repos_configs_on_a_24_gib_cpu(config, checkpointing, fits):
    """On a 24 GiB CPU (fp32) the configs' own batches: base8M and base30M pass; base91M (at least
    25 GiB) and base210M (at least 171 GiB) cannot fit and are refused, and fit with activation
    checkpointing."""
    cfg = TRAIN.parse([P(REPO, "configs", f"{config}.py"), "--wandb_log=False", f"--activation_checkpointing={checkpointing}"])
    est = memory_budget.training_estimate(cfg, memory_budget.Shape.from_config(cfg))
    assert (est.total <= 24 * 2 ** 30) == fits, memory_budget.bytes_text(est.total)


def test_eval_only_needs_no_training_memory():
    """eval_only=True takes no step: base210M evaluates on the 24 GiB machine that cannot train it."""
    cfg = TRAIN.parse([P(REPO, "configs", "base210M.py"), "--wandb_log=False", "--eval_only=True"])
    est = memory_budget.training_estimate(cfg, memory_budget.Shape.from_config(cfg))
    assert est.what != "training" and est.total <= 24 * 2 ** 30
    assert all(t.name not in ("gradients", "AdamW state") for t in est.terms)


def test_available_memory_is_this_machines():
    avail, text = memory_budget.available_memory("cpu")
    assert 0 < avail <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert text.startswith("this machine has ") and text.endswith(" available")


def test_processes_on_one_machine_share_it(monkeypatch):
    monkeypatch.setattr(memory_budget, "available_memory", lambda d: (8 * 2 ** 30, "this machine has 8.0 GiB available"))
    est = memory_budget.Estimate("training", [memory_budget.Term("activations", 3 * 2 ** 30, {"batch_size": 9})])
    memory_budget.check(est, "cpu", processes=2)
    with pytest.raises(Exception, match="batch_size=9: training needs at least 3.0 GiB .* available for 4 processes"):
        memory_budget.check(est, "cpu", processes=4)
