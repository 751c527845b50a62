"""finetune_t0.py: a run killed with SIGKILL and resumed with init_from=resume_train reproduces
the uninterrupted run's losses bit for bit (model, optimizer, RNG and the packed-row stream are
all restored; only the killed run is a subprocess), and 2-process CPU DDP gives the 1-process
losses (the global batch and its loss normaliser do not depend on the number of processes)."""
import os

import pytest
import torch
from conftest import kill_when_file_appears, run_main, run_ranks, t0_args, train_losses

import finetune_t0


@pytest.fixture(scope="module")
def setup(t0_setup):
    return t0_setup


@pytest.mark.slow
def test_exact_resume_after_sigkill(setup, tmp_path):
    mixture, base = setup
    ref, killed = str(tmp_path / "ref"), str(tmp_path / "killed")
    # dropout and example normalisation: RNG state and loss weights must both come back exactly
    common = dict(max_iters=12, checkpoint_interval=4, eval_interval=100, rank_eval_examples=0, dropout=0.1,
                  loss_normalization="example", optimizer="adafactor")
    # only the killed run is a process of its own (SIGKILL is what is tested); the reference and
    # the resumed run, compared bit for bit, both run in this process
    run_main("finetune_t0.py", t0_args(mixture, base, ref, **common), check=True)
    ckpt_path = os.path.join(killed, "ckpt.pt")
    kill_when_file_appears(["finetune_t0.py"] + t0_args(mixture, base, killed, **common), ckpt_path)
    start = torch.load(ckpt_path, weights_only=True)["iter_num"]
    assert 4 <= start < 12
    run_main("finetune_t0.py", t0_args(mixture, base, killed, init_from="resume_train", **common), check=True)
    a, b = train_losses(ref), train_losses(killed)
    assert sorted(b) == list(range(12))
    for it in range(start, 12):
        assert a[it] == b[it], (it, a[it], b[it])  # bit for bit


@pytest.mark.slow
def test_ddp_two_processes_equal_one(setup, tmp_path):
    mixture, base = setup
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    common = dict(max_iters=5, eval_interval=100, rank_eval_examples=0, gradient_accumulation_steps=2)
    finetune_t0.main(t0_args(mixture, base, one, **common))  # the 1-process reference, in this process
    proc = run_ranks(["finetune_t0.py"] + t0_args(mixture, base, two, **common))  # torchrun's 2 processes
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = train_losses(one), train_losses(two)
    assert sorted(a) == sorted(b) == list(range(5))
    for it in a:
        assert abs(a[it] - b[it]) < 1e-5, (it, a[it], b[it])
    assert a[4] < a[0]
