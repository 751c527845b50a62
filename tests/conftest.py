"""Shared test helpers: paths, a CLI runner, and environment that keeps tests offline."""
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

# never talk to a wandb server or the HF hub from tests
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def run_cli(args, cwd=REPO, env=None, timeout=600, check=False):
    """Run `python <args>` in a subprocess; returns CompletedProcess with text stdout/stderr."""
    full_env = dict(os.environ)
    full_env.update({"WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    if env:
        full_env.update(env)
    proc = subprocess.run([PYTHON] + list(args), cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"command failed ({proc.returncode}): {args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def run_main(script, argv, cwd=None):
    """Run an entry script's main(argv) in this process, behind the same error boundary as the
    command line (errors.cli_main), and return what `run_cli` would: a CompletedProcess with
    returncode, stdout and stderr. `script` is a path relative to the repository
    ("train.py", "evaluation/eval_wikitext.py"). No `import torch` per call: use it wherever the
    subprocess itself is not what a test is about."""
    import contextlib
    import importlib
    import io

    from tinylab.errors import cli_main
    module = importlib.import_module(script[:-3].replace("/", "."))
    out, err = io.StringIO(), io.StringIO()
    code = 0
    old_cwd = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli_main(module.main, list(argv))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(old_cwd)
    return subprocess.CompletedProcess([script, *argv], code, out.getvalue(), err.getvalue())


def kill_when_file_appears(args, path, timeout=300):
    """Run `python <args>` and SIGKILL it as soon as `path` exists (e.g. its first checkpoint);
    fails if the run ended before it could be killed."""
    import signal
    import time
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([PYTHON] + list(args), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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

    from tinylab import tinystories_data as tinystories
    from tinylab.dataset_spec import parse_spec

    cache = str(tmp_path_factory.mktemp("tiny_corpus"))
    num_shards, per_shard = 3, 300
    raw = tinystories.synthesize(cache, num_shards=num_shards, stories_per_shard=per_shard, seed=0)
    tok = os.path.join(cache, "tok8192.model")
    shutil.copy(TOK8192, tok)
    manifest = tinystories.pretokenize(cache, 8192, parse_spec(), dataset_name="pretrain-all", seed=0, workers=1)
    return SimpleNamespace(cache_dir=cache, raw_dir=raw, vocab_size=8192, tokenizer_model=tok,
                           dataset_name="pretrain-all", dataset_dir=os.path.join(cache, "tok8192", "pretrain-all"),
                           num_shards=num_shards, stories_per_shard=per_shard, manifest=manifest)
