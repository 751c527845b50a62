"""parallelism=fsdp (FSDP2, tinylab/core/distributed.py) on the CPU with gloo: 2 processes give the
1-process losses (within 1e-5; gradient accumulation, clipping, fused AdamW on DTensors and the
critical-batch-size estimate's extra sync all on), a 2-process run stopped at a checkpoint and
resumed with 2 processes repeats the uninterrupted run bit for bit, and its ckpt.pt is an
ordinary one: the same entries and optimizer layout as a 1-process run's, resumed by a 1-process
run to the same losses, grown by grow.py (and the grown checkpoint trained on with fsdp) and
exported by export.py. Settings FSDP cannot do are one-line errors.

The 2-process runs are shared by a module fixture (three runs of 6 iterations)."""
import math
import os

import pytest
import torch
from conftest import assert_one_line_error, records, run_main, run_ranks, train_losses


def args(corpus, out_dir, **over):
    # lr_decay_iters fixed: a run stopped at max_iters=3 has the schedule of the 6-iteration run
    cfg = dict(data_cache_dir=corpus.cache_dir, vocab_size=corpus.vocab_size, dataset_name=corpus.dataset_name,
               out_dir=out_dir, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=16, max_seq_len=64,
               batch_size=4, gradient_accumulation_steps=4, learning_rate=3e-3, warmup_iters=2, lr_decay_iters=6,
               max_iters=6, eval_interval=100, checkpoint_interval=3, eval_iters=2, log_interval=1, max_new_tokens=0,
               device="cpu", dtype="float32", dropout=0.0, compile=False, export_bin=False)
    cfg.update(over)
    return ["train.py"] + [f"--{k}={v}" for k, v in cfg.items()]


def train(argv, **kw):
    return run_main(argv[0], argv[1:], **kw)


def two_ranks(*runs):
    """The 2-process runs `torchrun --nproc_per_node=2` starts, in a row (conftest.run_ranks)."""
    proc = run_ranks(*runs)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    paths = {name: str(root / name) for name in ("one", "full", "split")}
    train(args(tiny_corpus, paths["one"]), check=True)  # the 1-process reference (DDP code path, no wrapper)
    # the uninterrupted run between the stopped one and its resumption: nothing the stopped run
    # leaves in the two processes can stand in for what the checkpoint must restore
    two_ranks(args(tiny_corpus, paths["split"], parallelism="fsdp", max_iters=3),
              args(tiny_corpus, paths["full"], parallelism="fsdp"),
              args(tiny_corpus, paths["split"], parallelism="fsdp", init_from="resume_train"))
    return paths


@pytest.mark.slow
def test_two_processes_equal_one(runs):
    a, b = train_losses(runs["one"]), train_losses(runs["full"])
    assert sorted(a) == sorted(b) == list(range(6))
    for it in a:
        assert abs(a[it] - b[it]) < 1e-5, (it, a[it], b[it])
    assert a[5] < a[0] - 0.1  # it trains
    # the noise estimate ran on every step (its first micro-step synced: the losses above still match)
    assert all(math.isfinite(r["critical_batch_size_step"]) for r in records(runs["full"], "train"))


@pytest.mark.slow
def test_resume_with_two_processes_is_bit_identical(runs):
    a, b = train_losses(runs["full"]), train_losses(runs["split"])
    assert sorted(a) == sorted(b) == list(range(6))
    assert all(a[it] == b[it] for it in range(6)), [(it, a[it], b[it]) for it in range(6) if a[it] != b[it]]


@pytest.mark.slow
def test_checkpoint_is_an_ordinary_one(runs, tiny_corpus, tmp_path):
    one = torch.load(os.path.join(runs["one"], "ckpt.pt"), weights_only=True)
    fsdp = torch.load(os.path.join(runs["full"], "ckpt.pt"), weights_only=True)
    assert sorted(fsdp) == sorted(one) and fsdp["iter_num"] == 6
    assert sorted(fsdp["model"]) == sorted(one["model"])
    for k, v in one["model"].items():
        w = fsdp["model"][k]
        assert not hasattr(w, "to_local") and w.shape == v.shape and torch.allclose(w, v, atol=1e-5), k
    so, sf = one["optimizer"], fsdp["optimizer"]
    assert sf["param_groups"] == so["param_groups"] and sorted(sf["state"]) == sorted(so["state"])
    for i, state in so["state"].items():
        for k, v in state.items():
            assert sf["state"][i][k].shape == v.shape and torch.allclose(sf["state"][i][k], v, atol=1e-5), (i, k)

    # a 1-process run continues it as it continues the 1-process run's own checkpoint
    more = dict(max_iters=8, lr_decay_iters=8, init_from="resume_train")
    ref, cont = str(tmp_path / "ref"), str(tmp_path / "cont")
    for src, out in ((runs["one"], ref), (runs["full"], cont)):
        train(args(tiny_corpus, out, resume_ckpt=os.path.join(src, "ckpt.pt"), **more), check=True)
    a, b = train_losses(ref), train_losses(cont)
    assert sorted(a) == sorted(b) == [6, 7]
    assert all(abs(a[it] - b[it]) < 1e-5 for it in a), (a, b)

    # export.py and grow.py read it; the grown (exact-mode: per-parameter LR scales and clip
    # weights) checkpoint trains with fsdp as without
    bin_path = str(tmp_path / "model.bin")
    run_main("export.py", [bin_path, "--version=0", f"--checkpoint={runs['full']}"], check=True)
    assert os.path.getsize(bin_path) > 4 * sum(v.numel() for k, v in fsdp["model"].items() if k != "output.weight")
    grown = str(tmp_path / "grown")
    run_main("grow.py", ["--doubling=weights", "--mode=exact", f"--resume={runs['full']}/ckpt.pt", f"--out_dir={grown}"],
             check=True)
    assert torch.load(os.path.join(grown, "ckpt.pt"), weights_only=True)["model_args"]["dim"] == 64
    after = {}
    for parallelism in ("ddp", "fsdp"):
        out = str(tmp_path / f"grown_{parallelism}")
        train(args(tiny_corpus, out, resume_ckpt=os.path.join(grown, "ckpt.pt"), parallelism=parallelism, **more),
              check=True)
        after[parallelism] = train_losses(out)
    assert sorted(after["ddp"]) == sorted(after["fsdp"]) == [6, 7]
    assert all(abs(after["ddp"][it] - after["fsdp"][it]) < 1e-5 for it in (6, 7)), after


@pytest.mark.slow
def test_one_process_fsdp_resumes_exactly_with_dropout(tiny_corpus, tmp_path):
    """Without torchrun fsdp is a 1-process group: its RNG, loader and sharded optimizer state
    come back exactly, and it gives the plain run's losses."""
    plain, full, split = (str(tmp_path / n) for n in ("plain", "full", "split"))
    common = dict(dropout=0.2, max_iters=6, lr_decay_iters=6, checkpoint_interval=3)
    train(args(tiny_corpus, plain, **common), check=True)
    train(args(tiny_corpus, full, parallelism="fsdp", **common), check=True)
    train(args(tiny_corpus, split, parallelism="fsdp", **{**common, "max_iters": 3}), check=True)
    train(args(tiny_corpus, split, parallelism="fsdp", init_from="resume_train", **common), check=True)
    a, b, c = train_losses(plain), train_losses(full), train_losses(split)
    assert sorted(a) == sorted(b) == sorted(c) == list(range(6))
    assert all(b[it] == c[it] for it in b), (b, c)
    assert all(abs(a[it] - b[it]) < 1e-5 for it in a), (a, b)


@pytest.mark.slow
def test_nan_guard_keeps_the_last_good_checkpoint(tiny_corpus, tmp_path):
    out = str(tmp_path / "nan")
    train(args(tiny_corpus, out, parallelism="fsdp", max_iters=2, checkpoint_interval=2), check=True)
    proc = train(args(tiny_corpus, out, parallelism="fsdp", init_from="resume_train", max_iters=40, learning_rate=1e30,
                      lr_scheduling=False, grad_clip=0.0, checkpoint_interval=4))  # none before the nan
    assert_one_line_error(proc, "nan/inf at iteration", "last good checkpoint kept")
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["iter_num"] == 2 and all(torch.isfinite(v).all() for v in ckpt["model"].values())


@pytest.mark.parametrize("over, fragment", [
    (dict(device="mps"), "no process-group backend for mps"),  # named in the config (schema.py)
    (dict(device=""), "no process-group backend for mps"),  # the best available device (trainer.Run)
    (dict(dtype="float16"), "does not train in float16"),
    (dict(optimizer="adafactor"), "needs optimizer=adamw"),
    (dict(grow_schedule="4:weights"), "cannot grow inside the run"),
    (dict(lenses=True), "probes / lenses"),
])
def test_settings_fsdp_cannot_do_are_one_line_errors(tiny_corpus, tmp_path, monkeypatch, over, fragment):
    if "device" in over:  # a Mac's view: MPS there, no CUDA
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = str(tmp_path / "run")
    assert_one_line_error(train(args(tiny_corpus, out, parallelism="fsdp", **over)), "parallelism=fsdp", fragment)
    assert not os.path.exists(out)


def test_unknown_parallelism_is_refused(tiny_corpus, tmp_path):
    assert_one_line_error(train(args(tiny_corpus, str(tmp_path / "run"), parallelism="zero3")), "parallelism", "fsdp")
