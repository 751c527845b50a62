"""Shared test helpers, used by every test file (no per-file copies):

    paths           REPO, TOK8192, LLAMA2_TOKENIZER, WIKITEXT, PYTHON
    entry scripts   run_main (in this process: the default), run_cli (a real subprocess: only where
                    the process is what is tested: exit by signal, torchrun, fresh imports, a
                    shell script), run_ranks (the processes of one DDP/FSDP group, started as
                    torchrun starts them), kill_when_file_appears, assert_one_line_error
    models          tiny_model, save_tiny_checkpoint
    data            fixtures tiny_corpus and lab_corpus (session-scoped, read-only), t0_setup
                    (make_t0_setup, t0_args)
    run outputs     read_metrics, records, train_losses (metrics.jsonl through tinylab.core.metrics)

Tests run with one torch thread, as the subprocesses did (OMP_NUM_THREADS=1): tiny models are
fastest so, and a 2-core machine shared with other jobs does not oversubscribe. Tests that take
more than a few seconds end to end are marked `slow` (pytest.ini): `pytest -m "not slow"` is the
quick loop; CI runs everything.
"""
import gc
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# reference files that ship in the repository (tokenizers/README.md, tests/fixtures/README.md)
TOK8192 = os.path.join(REPO, "tokenizers", "tok8192.model")
LLAMA2_TOKENIZER = os.path.join(REPO, "tokenizers", "tokenizer.model")
WIKITEXT = os.path.join(REPO, "tests", "fixtures", "wikitext2_test_excerpt.txt")
PYTHON = sys.executable

if REPO not in sys.path:
    sys.path.insert(0, REPO)

# A test worker holds torch, transformers and lm-eval at once: millions of long-lived objects that
# every collection of the oldest generation walks (0.28 s each, ~30 per worker in the full suite:
# 8-9 s). Young reference cycles are still collected as usual; the oldest generation 10x less often.
gc.set_threshold(700, 10, 100)

# never talk to a wandb server or the HF hub from tests
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="session")
def _no_environment_report():
    """lm-eval's simple_evaluate adds torch.utils.collect_env's report to every result (it runs
    `pip list` and other commands: 1.2 s a call); no test reads it. Subprocesses still collect it."""
    import torch.utils.collect_env
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.utils.collect_env, "get_pretty_env_info", lambda: "(not collected in tests)")
        yield


def child_env(**extra):
    """The environment of a test's subprocess: no wandb, unbuffered output, one torch thread."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.update(extra)  # a test's own settings win (WANDB_MODE=offline)
    return env


def run_cli(args, cwd=REPO, env=None, timeout=600, check=False):
    """Run `python <args>` in a subprocess; returns CompletedProcess with text stdout/stderr."""
    full_env = child_env(**(env or {}))
    proc = subprocess.run([PYTHON] + list(args), cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"command failed ({proc.returncode}): {args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(*runs, nproc=2, timeout=600):
    """Run `python <args>` as the `nproc` processes of one process group on this machine, with
    the environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT: the env:// rendezvous init_process_group reads), and wait for all.
    Several runs (each an argv starting with its entry script) run one after the other in the
    same `nproc` processes (tests/rank_runs.py: each run its own process group and port): a run
    stopped at a checkpoint and its resumption cost one start of the ranks, not two.

    For tests of what the ranks compute: it spares torchrun's launcher, a third interpreter that
    imports torch before the ranks start (3 s of CPU and 2 s of latency per run). The command
    users type, torchrun itself, runs train.py end to end with DDP and FSDP in
    tests/test_gpu_check.py (the GPU check's dry run). A rank that fails stops the others, as
    torchrun does.
    Returns a CompletedProcess: the first failing rank's exit code (else 0), rank 0's stdout and
    every rank's stderr."""
    import tempfile
    import time
    if len(runs) == 1:
        args, port = list(runs[0]), free_port()
    else:
        ports = []
        while len(ports) < len(runs):  # distinct, though the OS may offer a port twice
            ports += [p for p in [free_port()] if p not in ports]
        args, port = [os.path.join(REPO, "tests", "rank_runs.py"), json.dumps([list(r) for r in runs]), json.dumps(ports)], ports[0]
    procs, logs = [], []
    for rank in range(nproc):
        env = child_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        logs.append((out, err))
        procs.append(subprocess.Popen([PYTHON] + list(args), cwd=REPO, env=env, stdout=out, stderr=err, text=True))
    deadline, code = time.time() + timeout, 0
    while any(p.poll() is None for p in procs):
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if failed or time.time() > deadline:
            code = failed[0] if failed else -9
            time.sleep(1)  # the others' own error lines first
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.05)
    for p in procs:
        p.wait()
    code = code or next((p.returncode for p in procs if p.returncode != 0), 0)
    texts = []
    for out, err in logs:
        out.seek(0)
        err.seek(0)
        texts.append((out.read(), err.read()))
        out.close()
        err.close()
    return subprocess.CompletedProcess(list(args), code, texts[0][0], "".join(e for _, e in texts))


def run_main(script, argv, cwd=None, env=None, check=False):
    """Run an entry script's main(argv) in this process, behind the same error boundary as the
    command line (errors.cli_main), and return what `run_cli` would: a CompletedProcess with
    returncode, stdout and stderr. `script` is a path relative to the repository
    ("train.py", "evaluation/eval_wikitext.py"). No `import torch` per call: use it wherever the
    subprocess itself is not what a test is about. During the call sys.argv is the command line
    (argparse names the script in its messages), `env` entries are set in os.environ (None
    removes one) and `cwd` is the working directory; all three are restored afterwards."""
    import contextlib
    import importlib
    import io

    from tinylab.core.errors import cli_main
    module = importlib.import_module(script[:-3].replace("/", "."))
    out, err = io.StringIO(), io.StringIO()
    code = 0
    old_cwd, old_argv = os.getcwd(), sys.argv
    old_env = {k: os.environ.get(k) for k in (env or {})}
    try:
        for k, v in (env or {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if cwd:
            os.chdir(cwd)
        sys.argv = [script, *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli_main(module.main, list(argv))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    proc = subprocess.CompletedProcess([script, *argv], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"{script} failed ({code}): {argv}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def kill_when_file_appears(args, path, timeout=300):
    """Run `python <args>` and SIGKILL it as soon as `path` exists (e.g. its first checkpoint);
    fails if the run ended before it could be killed."""
    import signal
    import time
    proc = subprocess.Popen([PYTHON] + list(args), cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while not os.path.exists(path) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"


def assert_one_line_error(proc, *fragments):
    """Bad input: non-zero exit, a single 'error: ...' line on stderr, no traceback."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One torch thread for the whole session, as the subprocesses had (OMP_NUM_THREADS=1)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------------- tiny models and checkpoints

TINY_ARGS = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=8192, multiple_of=16, max_seq_len=64)


def tiny_model(seed=0, dtype=None, **args):
    """A small random Transformer in eval mode: ModelArgs(**TINY_ARGS, **args) built right after
    torch.manual_seed(seed) (so the same arguments give the same weights), cast to `dtype`."""
    import torch

    from model import ModelArgs, Transformer
    torch.manual_seed(seed)
    model = Transformer(ModelArgs(**{**TINY_ARGS, **args}))
    return (model if dtype is None else model.to(dtype)).eval()


def save_tiny_checkpoint(path, model=None, cache_dir=None, config=None, **fields):
    """Save `model` (default: tiny_model()) as a checkpoint file at `path` (returned): its weights,
    model_args, iter_num 0 and a config naming its tokenizer: the data cache `cache_dir` (so
    cache_dir/tok{vocab}.model), or else the released tok8192 directly. `config` replaces that
    config, `fields` add or replace top-level entries (iter_num, optimizer, ...)."""
    from tinylab.core import checkpoint as ckpt_lib
    model = tiny_model() if model is None else model
    vocab = model.params.vocab_size
    if config is None:
        config = ({"vocab_size": vocab, "vocab_source": "custom", "data_cache_dir": cache_dir} if cache_dir
                  else {"tokenizer_model": TOK8192, "vocab_size": vocab})
    ckpt_lib.save_checkpoint({"model": model.state_dict(), "model_args": ckpt_lib.model_args_dict(model),
                              "iter_num": 0, "config": config, **fields}, str(path))
    return str(path)


# ---------------------------------------------------------------------- run outputs

def write_tokens(path, ids):
    import numpy as np

    np.asarray(ids, dtype=np.uint16).tofile(str(path))
    return str(path)


def save_tiny_gpt2(folder, n_positions=64, n_head=4, n_embd=32, seed=0):
    """A tiny GPT-2 (transformers) with a byte-level BPE tokenizer of 256 bytes + <|endoftext|>
    (no merges), saved with save_pretrained: a local --model-name, no network."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    os.makedirs(folder, exist_ok=True)
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    vocab["<|endoftext|>"] = 256
    with open(os.path.join(folder, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(folder, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    GPT2Tokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")).save_pretrained(folder)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=257, n_positions=n_positions, n_embd=n_embd, n_layer=2,
                                       n_head=n_head, bos_token_id=256, eos_token_id=256))
    model.save_pretrained(folder)
    return str(folder), model.eval()


def read_metrics(run):
    """Every record of a run's metrics.jsonl (`run`: the run folder or the file), read with
    tinylab.core.metrics.read_metrics; unlike it, a line that is not a JSON record fails the test."""
    from tinylab.core import metrics
    path = os.path.join(run, "metrics.jsonl") if os.path.isdir(run) else run
    rows = metrics.read_metrics(path, notice=False)
    lines = [line for line in open(path, "rb").read().split(b"\n") if line.strip()]
    assert len(rows) == len(lines), f"{path}: {len(lines) - len(rows)} line(s) are not JSON records"
    return rows


def records(run, kind):
    """The records of one kind ("train", "eval", "table", "growth", ...)."""
    return [r for r in read_metrics(run) if r.get("kind") == kind]


def train_losses(run):
    """{iteration: loss/train} of the run's train records."""
    return {r["iter"]: r["loss/train"] for r in records(run, "train")}


# ---------------------------------------------------------------------- data

@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """A small data cache shared by the whole test session (treat it as read-only):

        cache_dir/TinyStories_all_data/data00..02.json   `synthesize`, 3 shards x 300 stories, seed 0
        cache_dir/tok8192.model                          the released study tokenizer (tokenizers/)
        cache_dir/tok8192/pretrain-all/                  `pretokenize`, no transforms, seed 0

    Returns a SimpleNamespace: cache_dir, raw_dir, vocab_size (8192), tokenizer_model,
    dataset_name ("pretrain-all"), dataset_dir, num_shards, stories_per_shard, manifest.
    Shard 0 is the test split, shards 1-2 train. Builds in about a second.
    """
    import shutil
    from types import SimpleNamespace

    from tinylab.data.dataset_spec import parse_spec
    from tinylab.data.pretokenize import pretokenize
    from tinylab.data.synthesize import synthesize

    cache = str(tmp_path_factory.mktemp("tiny_corpus"))
    num_shards, per_shard = 3, 300
    raw = synthesize(cache, num_shards=num_shards, stories_per_shard=per_shard, seed=0)
    tok = os.path.join(cache, "tok8192.model")
    shutil.copy(TOK8192, tok)
    manifest = pretokenize(cache, 8192, parse_spec(), dataset_name="pretrain-all", seed=0, workers=1)
    return SimpleNamespace(cache_dir=cache, raw_dir=raw, vocab_size=8192, tokenizer_model=tok,
                           dataset_name="pretrain-all", dataset_dir=os.path.join(cache, "tok8192", "pretrain-all"),
                           num_shards=num_shards, stories_per_shard=per_shard, manifest=manifest)


@pytest.fixture(scope="session")
def lab_corpus(tiny_corpus, tmp_path_factory):
    """tiny_corpus's raw shards (a link to them; 3 x 300 stories, shard 0 the test split) in a
    data cache of its own with more datasets (treat it as read-only; the classifier judge caches
    itself in cache_dir/judges/, as it does in any data cache):

        tok8192.model, tok8192/pretrain-all, tok8192/filter-adv-Twist     the released tokenizer
        tok1024.model (train_vocab), tok1024/<the default spec name>, tok1024/filter-Twist

    Returns a SimpleNamespace: cache_dir, raw_dir, tokenizer_model (tok8192), num_shards,
    stories_per_shard, and dataset(name, vocab=8192) -> the dataset's folder.
    """
    import shutil
    from types import SimpleNamespace

    from tinylab.data.dataset_spec import parse_spec
    from tinylab.data.pretokenize import pretokenize
    from tinylab.data.vocab import train_vocab

    cache = str(tmp_path_factory.mktemp("lab_corpus"))
    raw = os.path.join(cache, "TinyStories_all_data")
    os.symlink(tiny_corpus.raw_dir, raw)
    tok = os.path.join(cache, "tok8192.model")
    shutil.copy(TOK8192, tok)
    train_vocab(cache, 1024, vocab_shards=10, seed=0)
    for vocab, name, spec in [
            (8192, "pretrain-all", parse_spec()),
            (8192, "filter-adv-Twist", parse_spec(filtering="features!=Twist", adversarial_training="features=Twist:1.0")),
            (1024, None, parse_spec()),  # train.py's default dataset_name: the spec string
            (1024, "filter-Twist", parse_spec(filtering="features!=Twist"))]:
        pretokenize(cache, vocab, spec, dataset_name=name, seed=0, workers=1)
    return SimpleNamespace(cache_dir=cache, raw_dir=raw, tokenizer_model=tok, num_shards=tiny_corpus.num_shards,
                           stories_per_shard=tiny_corpus.stories_per_shard,
                           dataset=lambda name, vocab=8192: os.path.join(cache, f"tok{vocab}", name))


# ---------------------------------------------------------------------- T0 finetuning

def make_t0_setup(root):
    """root/demo/mixture.json (+ task files: the built-in multitask set, 40 training and 10
    validation rows per task) and root/base/ckpt.pt (a tiny random base model, max_seq_len 128,
    naming the released tok8192); returns (mixture, base_dir)."""
    from tinylab.t0.demo import write_demo_data
    demo, base = os.path.join(root, "demo"), os.path.join(root, "base")
    write_demo_data(demo, seed=0, n_train=40, n_valid=10)
    save_tiny_checkpoint(os.path.join(base, "ckpt.pt"), tiny_model(max_seq_len=128))
    return os.path.join(demo, "mixture.json"), base


@pytest.fixture(scope="session")
def t0_setup(tmp_path_factory):
    """make_t0_setup once per session (read-only): (mixture, base_dir)."""
    return make_t0_setup(str(tmp_path_factory.mktemp("t0")))


def t0_args(mixture, base, out_dir, **over):
    """finetune_t0.py's argv (without the script) of a tiny run on the T0 setup."""
    cfg = dict(mixture=mixture, model_dir=base, out_dir=out_dir, batch_size=4, gradient_accumulation_steps=2,
               learning_rate=3e-3, max_iters=12, eval_interval=6, eval_iters=1, log_interval=1, rank_eval_examples=6,
               device="cpu", dtype="float32")
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()]


def staged_training_lr_lambda(step, warmup, total, restart_steps=0, restart_warmup=0):
    """The reference for staged-training's schedule: gpt_pretrain.py's
    get_restart_linear_schedule_with_warmup lr_lambda (lines 48-88), verbatim in meaning; without
    the restart flags it is get_linear_schedule_with_warmup's."""
    if restart_steps != 0 and restart_warmup != 0 and restart_steps <= step < restart_steps + restart_warmup:
        if step < warmup:
            return (step - restart_steps) / max(1, restart_warmup) * (restart_steps + restart_warmup) / max(1, warmup)
        return (step - restart_steps) / max(1, restart_warmup) * (total - restart_steps - restart_warmup) / \
            max(1, total - warmup)
    if step < warmup:
        return step / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))
