"""Sizes that cannot fit, allocation failures, and runs that fail before doing any work.

  - Values too large for this machine (a huge dim, max_seq_len, batch_size, ...) are refused before
    anything is built or written, with one line naming the key (tinylab/memory_budget.py), at every
    command that allocates by them; "this machine's memory" is pretended small where the cases'
    values are sane (the evaluation tools' batches are bounded by their data).
  - An allocation that still fails is one line, exit 1 (tinylab/errors.py); other errors stay
    tracebacks.
  - A new run that fails before any work leaves no folder, and the same command then runs; a run
    that logged training records keeps its folder (tinylab/rundir.py).
  - The estimate against independent references: model.num_params(), the bytes autograd saves
    (saved_tensors_hooks), the optimizers' real state, and a measured peak RSS.
"""
import json
import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import test_bad_input
import torch
from conftest import PYTHON, REPO, WIKITEXT, assert_one_line_error, run_main
from test_bad_input import EV, GROW, T0, assert_error, assert_nothing_lost, snapshot, train_argv

from model import ModelArgs, Transformer
from tinylab import memory_budget
from tinylab.errors import cli_main
from tinylab.schema import TRAIN

P = os.path.join
HUGE = 10 ** 14


world, one_thread = test_bad_input.world, test_bad_input.one_thread  # its fixtures: the inputs, one torch thread


def T(ctx, **over):
    """test_bad_input's tiny train.py run (dim 16, one layer, GQA) on the session's corpus."""
    return train_argv(ctx.c, **{"out_dir": P(ctx.t, "out"), **over})


def lambada_file(ctx):
    with open(P(ctx.t, "l.jsonl"), "w") as f:
        for i in range(6):
            f.write(json.dumps({"text": f"Once upon a time there was a little dog named Spot number {i}"}) + "\n")


class Case:
    """A command that must be refused: `memory` (bytes) pretends this machine has that much."""

    def __init__(self, id, script, argv, *fragments, code=2, memory=None, setup=None):
        self.id, self.script, self.argv, self.fragments = id, script, argv, fragments
        self.code, self.memory, self.setup = code, memory, setup


MiB = 2 ** 20
CASES = [
    # train.py: every key a training step allocates by
    Case("train-dim", "train.py", lambda x: T(x, dim=10 ** 12, n_heads=2, n_kv_heads=1), "dim=1000000000000:",
         "training needs at least", "e+25 bytes", "parameters", "AdamW state", "lower dim"),
    Case("train-max-seq-len", "train.py", lambda x: T(x, max_seq_len=HUGE), f"max_seq_len={HUGE}:", "activations"),
    Case("train-batch-size", "train.py", lambda x: T(x, batch_size=HUGE), f"batch_size={HUGE}:", "lower batch_size",
         "activation_checkpointing=True"),
    Case("train-batch-size-1e9", "train.py", lambda x: T(x, batch_size=10 ** 9), "batch_size=1000000000:", "TiB"),
    Case("train-n-layers-400-digits", "train.py", lambda x: T(x, n_layers=10 ** 400), "n_layers=1.0e+400:", "e+4"),
    Case("train-hidden-dim", "train.py", lambda x: T(x, hidden_dim=10 ** 12), "hidden_dim=1000000000000:"),
    Case("train-eval-batch-size", "train.py", lambda x: T(x, eval_batch_size=HUGE), f"eval_batch_size={HUGE}:",
         "the loss evaluation needs"),
    Case("train-generation-batch-size", "train.py", lambda x: T(x, generation_batch_size=HUGE, max_new_tokens=8),
         f"generation_batch_size={HUGE}:", "KV cache"),
    Case("train-checkpointing-still-too-big", "train.py", lambda x: T(x, batch_size=HUGE, activation_checkpointing=True),
         f"batch_size={HUGE}:"),
    Case("train-sane-values-small-machine", "train.py", lambda x: T(x, batch_size=64, max_seq_len=32), "batch_size=64",
         "this machine has 1.0 MiB available", memory=MiB),
    # a resumed or fine-tuned run: the checkpoint's shape, the config's batch (checked in init_model)
    Case("train-resume-model-batch", "train.py", lambda x: T(x, init_from="resume_model", model_dir=x.w.run,
                                                              batch_size=HUGE), f"batch_size={HUGE}:"),
    # finetune_t0.py: the base checkpoint's shape; every micro-batch of a step is packed at once
    Case("t0-batch-size", "finetune_t0.py", lambda x: T0(x, batch_size=HUGE), f"batch_size={HUGE}:"),
    Case("t0-grad-accum", "finetune_t0.py", lambda x: T0(x, gradient_accumulation_steps=HUGE),
         f"gradient_accumulation_steps={HUGE}:", "batch buffers"),
    # sample.py: the KV cache and the sampling tables
    Case("sample-num-samples", "sample.py", lambda x: EV(x, f"--num_samples={HUGE}"), f"--num_samples={HUGE}:",
         "generation needs at least"),
    Case("sample-max-new-tokens", "sample.py", lambda x: EV(x, f"--max_new_tokens={HUGE}"),
         f"--max_new_tokens={HUGE}:", "the sampling schedule"),
    # the evaluation tools
    Case("features-batch-size", "evaluation/eval_features.py", lambda x: EV(x, "--prompts_from=pretrain-all",
                                                                             f"--batch_size={HUGE}"),
         f"--batch_size={HUGE}:", "prompt windows"),
    Case("features-num-samples", "evaluation/eval_features.py", lambda x: EV(x, "--prompts_from=pretrain-all",
                                                                              f"--num_samples={HUGE}"),
         f"--num_samples={HUGE}:"),
    Case("wikitext-batch-size", "evaluation/eval_wikitext.py", lambda x: EV(x, f"--data={WIKITEXT}", f"--batch_size={HUGE}"),
         "--batch_size=", "logits", memory=MiB),
    Case("lambada-batch-size", "evaluation/eval_lambada.py", lambda x: EV(x, f"--data={P(x.t, 'l.jsonl')}",
                                                                          f"--batch_size={HUGE}"),
         "--batch_size=6:", "logits", memory=MiB // 4, setup=lambada_file),
    Case("lambada-original-batch", "evaluation/eval_lambada.py", lambda x: [f"--checkpoint-file={x.w.ckpt}",
                                                                            f"--path={P(x.t, 'l.jsonl')}", f"--batch={HUGE}",
                                                                            "--device=cpu"],
         "--batch=6:", memory=MiB // 4, setup=lambada_file),
    Case("rank-batch-size", "evaluation/eval_rank.py", lambda x: EV(x, f"--mixture={x.w.mixture}", f"--batch_size={HUGE}"),
         "--batch_size=", "logits", memory=MiB // 4),
    # grow.py: the grown weights and moments (check_limits' sizes are fine here)
    Case("grow-memory", "grow.py", lambda x: GROW(x, "--doubling=weights"), "growing to dim 32, 1 layers needs at least",
         "grown AdamW state", "grow on a machine with more memory", memory=64 * 1024),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
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
    return T(ctx, max_new_tokens=4, **over) if script == "train.py" else T0(ctx, **over)


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
    assert_error(run_main("train.py", T(ctx), cwd=str(tmp_path)), 1, "out of memory")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


def test_failed_first_step_with_overwrite_keeps_the_old_run_aside(world, tmp_path, monkeypatch):
    """--overwrite=True moved the old run aside before the step failed: it is there, byte for byte;
    out_dir holds nothing of the failed run, so the same command runs again."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    shutil.copytree(world.run, P(ctx.t, "out"))
    old = {os.path.relpath(p, P(ctx.t, "out")): h for p, h in snapshot(P(ctx.t, "out")).items()}
    with monkeypatch.context() as m:
        fail_at_training_forward(m)
        assert_error(run_main("train.py", T(ctx, overwrite=True), cwd=str(tmp_path)), 1, "out of memory")
    aside = [d for d in os.listdir(ctx.t) if d.startswith("out.previous-")]
    assert len(aside) == 1
    assert {os.path.relpath(p, P(ctx.t, aside[0])): h for p, h in snapshot(P(ctx.t, aside[0])).items()} == old
    assert [e for e in os.listdir(P(ctx.t, "out")) if e != ".lock"] == []
    assert run_main("train.py", T(ctx), cwd=str(tmp_path)).returncode == 0


def test_run_that_logged_training_keeps_its_folder(world, tmp_path, monkeypatch):
    """The second step fails after the first was logged: the folder is kept (real work), and the
    next run is told it holds a run."""
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    out = P(ctx.t, "out")
    with monkeypatch.context() as m:
        fail_at_training_forward(m, after=1)
        assert_error(run_main("train.py", T(ctx, max_iters=4), cwd=str(tmp_path)), 1, "out of memory")
    rows = [json.loads(line) for line in open(P(out, "metrics.jsonl"))]
    assert [r["iter"] for r in rows if r["kind"] == "train"] == [0] and os.path.isfile(P(out, "config.json"))
    before = snapshot(tmp_path)
    assert_error(run_main("train.py", T(ctx, max_iters=4), cwd=str(tmp_path)), 2, "already holds a run", "--overwrite=True")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)


def test_failed_in_place_resume_is_never_rolled_back(world, tmp_path, monkeypatch):
    ctx = SimpleNamespace(t=str(tmp_path), w=world, c=world.corpus)
    out = P(ctx.t, "out")
    shutil.copytree(world.run, out)
    before = snapshot(tmp_path)
    fail_at_training_forward(monkeypatch)
    assert_error(run_main("train.py", T(ctx, init_from="resume_train", max_iters=4), cwd=str(tmp_path)), 1, "out of memory")
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


def saved_for_backward(args, B, T, checkpointing=False):
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
    x = torch.randint(0, args["vocab_size"], (B, T))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, x, return_logits=False)
    return sum(seen.values())


@pytest.mark.parametrize("args", [dict(dim=64, n_heads=4, n_kv_heads=4), dict(dim=128, n_heads=8, n_kv_heads=2),
                                  dict(dim=96, n_heads=4, n_kv_heads=2, hidden_dim=160)], ids=["mha", "gqa", "hidden"])
def test_activations_per_block_are_what_autograd_keeps(args):
    """One more block adds at least the estimate's 10 dim + 4 hidden fp32 values per token, and
    at most 15% more (the attention's per-head statistics)."""
    args = dict(vocab_size=256, multiple_of=32, max_seq_len=64, **args)
    B, T = 4, 64
    per_block = saved_for_backward({**args, "n_layers": 2}, B, T) - saved_for_backward({**args, "n_layers": 1}, B, T)
    hidden = ModelArgs(**args).ffn_hidden_dim()
    estimate = B * T * (10 * args["dim"] + 4 * hidden) * 4
    assert estimate <= per_block <= 1.15 * estimate, (per_block, estimate)


def test_activation_checkpointing_keeps_each_blocks_input():
    args = dict(vocab_size=256, multiple_of=32, max_seq_len=64, dim=64, n_heads=4, n_kv_heads=4)
    per_block = (saved_for_backward({**args, "n_layers": 3}, 4, 64, True)
                 - saved_for_backward({**args, "n_layers": 2}, 4, 64, True))
    assert per_block == 4 * 64 * 64 * 4  # its input, fp32


@pytest.mark.parametrize("optimizer, beta1", [("adamw", 0.0), ("adafactor", 0.0), ("adafactor", 0.9)])
def test_optimizer_state_is_the_real_state(optimizer, beta1):
    from tinylab.optim import build_optimizer
    args = SHAPES[1]
    cfg = {**TRAIN.defaults(), **args, "optimizer": optimizer, "adafactor_beta1": beta1, "adafactor_relative_step": False}
    model = Transformer(ModelArgs(**args))
    opt = build_optimizer(model, cfg)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0)
    est = memory_budget.optimizer_state(memory_budget.Shape.from_config({**cfg, "hidden_dim": 0}), cfg, 4).bytes
    assert est == state


PEAK = r"""
import json, resource, sys, torch
sys.path.insert(0, sys.argv[1])
from model import ModelArgs, Transformer
from tinylab import memory_budget
from tinylab.optim import build_optimizer
from tinylab.schema import TRAIN
torch.set_num_threads(1)
B = int(sys.argv[2])
shape = dict(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=32)
cfg = TRAIN.parse([f"--{k}={v}" for k, v in shape.items()] + [f"--batch_size={B}", "--max_seq_len=256"])
def steps(x, n):
    model = Transformer(ModelArgs(**shape, max_seq_len=256))
    opt = build_optimizer(model, cfg)
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
