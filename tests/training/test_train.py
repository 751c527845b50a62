"""train.py end to end on a tiny synthesized corpus: metrics, exact resume after SIGKILL, atomic
checkpoints, 2-process DDP vs 1 process, NaN guard, SIGINT, resume_model, eval_only, errors.

Runs are in this process (conftest.run_main) unless the process itself is tested: SIGKILL,
SIGINT, the 2 DDP processes; two runs whose losses are compared bit for bit run in the same kind of process
(a resumed run's checkpoint may come from a killed subprocess)."""
import os
import signal
import subprocess
import sys
import time
import types

import pytest
import torch
from conftest import (
    PYTHON,
    REPO,
    assert_one_line_error,
    kill_when_file_appears,
    read_metrics,
    run_main,
    run_ranks,
    train_losses,
)

VOCAB = 1024  # lab_corpus's trained tokenizer and its datasets: the default one and filter-Twist


@pytest.fixture(scope="module")
def corpus(lab_corpus):
    return lab_corpus.cache_dir


def tiny_args(corpus, out_dir, **over):
    cfg = dict(data_cache_dir=corpus, vocab_size=VOCAB, out_dir=out_dir, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
               multiple_of=16, max_seq_len=64, batch_size=4, gradient_accumulation_steps=2, learning_rate=3e-3,
               warmup_iters=5, max_iters=30, eval_interval=10, eval_iters=2, log_interval=1, max_new_tokens=8,
               generation_batch_size=2, device="cpu", dtype="float32", dropout=0.1)
    cfg.update(over)
    return ["train.py"] + [f"--{k}={v}" for k, v in cfg.items()]


def train(argv, **kw):
    """train.py in this process; argv as tiny_args gives it (starting with the script)."""
    return run_main(argv[0], argv[1:], **kw)



@pytest.mark.slow
def test_train_logs_metrics_and_generations(corpus, tmp_path):
    out = str(tmp_path / "run")
    # windows must be long enough to hold a whole instruction header for generation prompts
    train(tiny_args(corpus, out, eval_dataset_names=["filter-Twist"], max_seq_len=256, max_new_tokens=16), check=True)
    rows = read_metrics(out)
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["iter"] for r in train_rows] == list(range(30))
    assert all(r["loss/train"] > 0 and r["lr"] > 0 and r["tokens_per_s"] > 0 for r in train_rows)
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["iter"] for r in evals] == [0, 10, 20, 30]
    for r in evals:
        assert {"loss/train", "loss/test", "loss/filter-Twist", "best_val_loss"} <= set(r)
    assert evals[-1]["loss/test"] < evals[0]["loss/test"]  # it learns
    assert evals[-1]["best_val_loss"] == min(r["loss/test"] for r in evals)  # and best really tracks the best
    tables = [r for r in rows if r["kind"] == "table"]
    assert {k for r in tables for k in r if k.startswith("generations/")} == {"generations/id", "generations/filter-Twist"}
    g = tables[0]["generations/id"][0]
    assert set(g) == {"prefix", "clean_prefix", "generation", "target", "iter_num"} and "Story:" in g["prefix"]
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["iter_num"] == 30
    assert {"model", "optimizer", "model_args", "iter_num", "best_val_loss", "config"} <= set(ckpt)
    assert ckpt["best_val_loss"] == evals[-1]["best_val_loss"]


@pytest.mark.slow
def test_exact_resume_after_sigkill(corpus, tmp_path):
    ref, killed = str(tmp_path / "ref"), str(tmp_path / "killed")
    common = dict(max_iters=60, checkpoint_interval=10, eval_interval=20, max_new_tokens=0)
    # only the killed run is a process of its own (SIGKILL is what is tested); the reference and
    # the resumed run, whose losses are compared bit for bit, both run in this process
    train(tiny_args(corpus, ref, **common), check=True)
    ckpt_path = os.path.join(killed, "ckpt.pt")
    kill_when_file_appears(tiny_args(corpus, killed, **common), ckpt_path)
    start = torch.load(ckpt_path, weights_only=True)["iter_num"]
    assert 10 <= start < 60
    train(tiny_args(corpus, killed, init_from="resume_train", **common), check=True)
    a, b = train_losses(ref), train_losses(killed)
    assert sorted(b) == list(range(60))  # the resumed run dropped and redid the killed run's tail
    for it in range(start, 60):
        assert a[it] == b[it], (it, a[it], b[it])  # bit for bit


@pytest.mark.slow
def test_checkpoint_write_is_atomic_under_kill(tmp_path):
    """Stop a process at moments while it rewrites a large checkpoint, then kill it: the file is
    always a whole one. (A process frozen by SIGSTOP has left on disk exactly what SIGKILL at
    that moment would leave; one process stopped three times costs one start, not three.)"""
    path = str(tmp_path / "ckpt.pt")
    script = (
        "import sys, torch; sys.path.insert(0, %r)\n"
        "from tinylab.core.checkpoint import save_checkpoint\n"
        "i = 0\n"
        "while True:\n"
        "    save_checkpoint({'model': {'w': torch.full((4_000_000,), float(i))}, 'model_args': {}, 'iter_num': i}, %r)\n"
        "    print(i, flush=True); i += 1\n" % (REPO, path))

    def assert_whole():
        ckpt = torch.load(path, weights_only=True)
        w = ckpt["model"]["w"]
        assert w.numel() == 4_000_000 and torch.all(w == ckpt["iter_num"])
        return ckpt["iter_num"]

    proc = subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()  # at least one complete save
        seen = []
        for delay in (0.13, 0.29, 0.41):  # not a multiple of one save's time: other phases of it
            time.sleep(delay)
            proc.send_signal(signal.SIGSTOP)
            seen.append(assert_whole())
            proc.send_signal(signal.SIGCONT)
        time.sleep(0.37)
    finally:
        proc.kill()
        proc.wait()
    seen.append(assert_whole())
    assert seen == sorted(seen) and seen[-1] > seen[0]  # it kept saving between the stops
    leftovers = [f for f in os.listdir(tmp_path) if f != "ckpt.pt"]
    assert all(f.startswith(".tmp_") for f in leftovers)  # only temp files, never a half ckpt.pt


DDP_EQUAL = dict(max_iters=6, eval_interval=100, max_new_tokens=0, dropout=0.0, gradient_accumulation_steps=2)
DDP_DROPOUT = dict(eval_interval=100, checkpoint_interval=5, max_new_tokens=0, dropout=0.2, lr_scheduling=False)


@pytest.fixture(scope="module")
def ddp_runs(corpus, tmp_path_factory):
    """The 2-process runs of the two tests below, one after the other in one start of the 2
    processes torchrun starts (conftest.run_ranks): a 6-iteration run, then with dropout a run
    stopped at its checkpoint, the uninterrupted run and the resumption, the uninterrupted run
    between the other two so that nothing the stopped run leaves in the processes can stand in
    for what the checkpoint must restore. (The torchrun command itself: tests/test_gpu_check.py.)"""
    root = tmp_path_factory.mktemp("ddp")
    paths = {name: str(root / name) for name in ("two", "full", "split")}
    proc = run_ranks(tiny_args(corpus, paths["two"], **DDP_EQUAL),
                     tiny_args(corpus, paths["split"], max_iters=5, **DDP_DROPOUT),
                     tiny_args(corpus, paths["full"], max_iters=10, **DDP_DROPOUT),
                     tiny_args(corpus, paths["split"], max_iters=10, init_from="resume_train", **DDP_DROPOUT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return paths


@pytest.mark.slow
def test_ddp_two_processes_equal_one(corpus, ddp_runs, tmp_path):
    one = str(tmp_path / "one")
    train(tiny_args(corpus, one, **DDP_EQUAL), check=True)  # the 1-process reference, in this process
    a, b = train_losses(one), train_losses(ddp_runs["two"])
    assert sorted(a) == sorted(b) == list(range(6))
    for it in a:
        assert abs(a[it] - b[it]) < 1e-5, (it, a[it], b[it])


@pytest.mark.slow
def test_ddp_resume_with_dropout_is_exact(ddp_runs):
    """2 processes with dropout: a run stopped at a checkpoint and resumed gives the uninterrupted
    run's losses bit for bit (each rank's generators are saved and restored)."""
    a, b = train_losses(ddp_runs["full"]), train_losses(ddp_runs["split"])
    assert sorted(a) == sorted(b) == list(range(10))
    assert all(a[it] == b[it] for it in range(10)), [(it, a[it], b[it]) for it in range(10) if a[it] != b[it]]


def test_nan_guard_keeps_last_good_checkpoint(corpus, tmp_path):
    out = str(tmp_path / "nan")
    train(tiny_args(corpus, out, max_iters=4, warmup_iters=2, eval_interval=2, max_new_tokens=0), check=True)
    proc = train(tiny_args(corpus, out, init_from="resume_train", max_iters=40, eval_interval=2, max_new_tokens=0,
                           learning_rate=1e30, lr_scheduling=False, grad_clip=0.0))
    assert_one_line_error(proc, "nan/inf at iteration", "last good checkpoint kept")
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


@pytest.mark.slow
def test_sigint_stops_with_a_checkpoint(corpus, tmp_path):
    out = str(tmp_path / "int")
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([PYTHON] + tiny_args(corpus, out, max_iters=100000, eval_interval=1000, max_new_tokens=0),
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and (not os.path.exists(metrics) or len(open(metrics).readlines()) < 5):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["iter_num"] >= 4 and max(train_losses(out)) == ckpt["iter_num"] - 1


@pytest.mark.slow
def test_resume_model_and_eval_only(corpus, tmp_path):
    base, ft = str(tmp_path / "base"), str(tmp_path / "ft")
    train(tiny_args(corpus, base, max_iters=6, max_new_tokens=0), check=True)
    # fine-tune: weights from model_dir, new optimizer, iteration 0; the shape comes from the
    # checkpoint even if the config says otherwise (with a notice)
    proc = train(tiny_args(corpus, ft, init_from="resume_model", model_dir=base, dataset_name="filter-Twist",
                           dim=64, max_iters=3, max_new_tokens=0, lr_scheduling=False), check=True)
    assert "notice: model shape taken from" in proc.stdout
    assert sorted(train_losses(ft)) == [0, 1, 2]
    proc = train(tiny_args(corpus, base, init_from="resume_train", eval_only=True, max_new_tokens=0), check=True)
    assert "loss/test" in proc.stdout and "notice: optimizer settings" not in proc.stdout
    # resume_train with other optimizer settings: the config wins, with a notice
    proc = train(tiny_args(corpus, base, init_from="resume_train", max_iters=8, max_new_tokens=0, weight_decay=0.05,
                           beta2=0.99), check=True)
    assert "notice: optimizer settings from the config replace the checkpoint's" in proc.stdout
    groups = torch.load(os.path.join(base, "ckpt.pt"), weights_only=True)["optimizer"]["param_groups"]
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.05] and all(g["betas"][1] == 0.99 for g in groups)


@pytest.mark.slow
def test_always_save_checkpoint_false_saves_only_after_improvement(corpus, tmp_path):
    # learning rate 0: loss/test is the same at every evaluation, so only the first one improves
    out = str(tmp_path / "a")
    proc = train(tiny_args(corpus, out, max_iters=20, eval_interval=5, checkpoint_interval=5, learning_rate=0,
                           max_new_tokens=0, always_save_checkpoint=False, eval_batch_size=3), check=True)
    saved = [int(l.rsplit("(iter ", 1)[1].rstrip(")")) for l in proc.stdout.splitlines() if l.startswith("saved checkpoint")]
    assert saved == [5, 20]  # after the improving eval at 0, and the final one; not at 10 or 15
    proc = train(tiny_args(corpus, str(tmp_path / "b"), max_iters=10, eval_interval=5, checkpoint_interval=5,
                           learning_rate=0, max_new_tokens=0), check=True)
    assert sum(l.startswith("saved checkpoint") for l in proc.stdout.splitlines()) == 2  # default: every interval


def test_bad_input_errors(corpus, tmp_path):
    out = str(tmp_path / "bad")
    assert_one_line_error(train(tiny_args(corpus, out, dataset_name="no-such-dataset")), "pretokenize")
    assert_one_line_error(train(tiny_args(corpus, out, init_from="resume_train")), "no checkpoint")
    assert_one_line_error(train(tiny_args(corpus, out, vocab_size=512)), "512")
    assert_one_line_error(train(tiny_args(corpus, out, init_from="foo")), "--init_from='foo': must be one of")


# the real wandb offline (a subprocess): tests/training/test_train_outputs.py's
# test_wandb_offline_never_stops_training, which shares its launch with the resume test there


def test_broken_wandb_never_stops_training(corpus, tmp_path, monkeypatch):
    # a wandb whose init raises (no server, no login, ...): a warning, and training goes on
    def init(**kw):
        raise RuntimeError("no server")
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    out2 = str(tmp_path / "wb2")
    proc = train(tiny_args(corpus, out2, max_iters=3, warmup_iters=2, wandb_log=True))
    assert proc.returncode == 0 and "wandb could not start" in proc.stderr
    assert sorted(train_losses(out2)) == [0, 1, 2]


@pytest.mark.slow
def test_generation_eval_stops_rows_at_bos_and_logs_the_same_stories(tiny_corpus, monkeypatch):
    """The generation evaluation stops each row at BOS (the next example's start) and a batch
    when all its rows have: here every batch stops long before max_new_tokens, and the logged
    rows are exactly those of generating every token and cutting at BOS afterwards (the old
    way), later batches included (the shared generator advances as if nothing had stopped)."""
    from conftest import tiny_model

    import model as model_lib
    from tinylab.data.tokenizer import Tokenizer
    from tinylab.eval.lm_eval import generate_rows
    tok = Tokenizer(tiny_corpus.tokenizer_model)
    m = tiny_model(max_seq_len=256, tie_embeddings=False)
    with torch.no_grad():
        m.output.weight[tok.bos_id] *= 40  # BOS becomes likely: rows end after a few dozen tokens
    args = (m, tok, {}, tiny_corpus.cache_dir, "pretrain-all", 6, 2, 250, 1.0, 0, 0)
    real, generated = model_lib.Transformer.generate, []

    def stopping(self, idx, new, **kw):
        assert kw["stop_token"] == tok.bos_id
        out = real(self, idx, new, **kw)
        generated.append(out.shape[1] - idx.shape[1])
        return out

    monkeypatch.setattr(model_lib.Transformer, "generate", stopping)
    rows = generate_rows(*args)
    assert len(generated) == 3 and max(generated) < 100, generated
    monkeypatch.setattr(model_lib.Transformer, "generate", lambda self, idx, new, stop_token=None, **kw: real(self, idx, new, **kw))
    assert generate_rows(*args) == rows
