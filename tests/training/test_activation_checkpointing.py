"""Activation checkpointing (activation_checkpointing=True; Transformer.activation_checkpointing):
the same loss and gradients as without, in fp64, also with dropout (the recomputation draws the
same masks); fewer tensors kept for backward; the same state_dict; a train.py run with the same
losses; no graph break under torch.compile."""
import functools
import json
import os

import pytest
import torch
from conftest import tiny_model, train_losses
from test_train import tiny_args, train


def tiny(dropout=0.0):
    return tiny_model(dtype=torch.float64, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=61,
                      multiple_of=16, max_seq_len=16, dropout=dropout).train()


def packed_batch():
    """Two examples packed in each row (a block-diagonal mask, positions restarting): every
    argument of the blocks goes through the checkpoint."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.randint(0, 61, (2, 12), generator=g), torch.randint(0, 61, (2, 12), generator=g)
    seg = torch.arange(12) >= 5
    mask = (seg[:, None] == seg[None, :]) & torch.ones(12, 12, dtype=torch.bool).tril()
    pos = torch.where(seg, torch.arange(12) - 5, torch.arange(12))
    return dict(tokens=x, targets=y, attn_mask=mask.expand(2, 12, 12), position_ids=pos.expand(2, 12))


def step(m, on, batch, seed=0, fused=True):
    """Loss, gradients and the RNG state after one forward + backward from torch seed `seed`."""
    m.activation_checkpointing = on
    m.zero_grad()
    torch.manual_seed(seed)
    m(**batch, return_logits=not fused)
    m.last_loss.backward()
    return m.last_loss.detach(), [p.grad.clone() for p in m.parameters()], torch.get_rng_state()


def assert_same(a, b, tol):
    assert abs(a[0].item() - b[0].item()) <= tol
    assert all(torch.allclose(g, r, rtol=0, atol=tol) for g, r in zip(a[1], b[1]))
    assert torch.equal(a[2], b[2])  # the RNG stream goes on as without checkpointing


@pytest.mark.parametrize("fused", [True, False])
def test_same_loss_and_gradients_fp64(fused):
    m = tiny()
    assert not m.activation_checkpointing  # off unless set
    ref = step(m, False, packed_batch(), fused=fused)
    assert_same(step(m, True, packed_batch(), fused=fused), ref, 1e-12)
    assert m.activation_checkpointing and all(layer.checkpointed for layer in m.layers)


def test_dropout_masks_are_recomputed_identically():
    """dropout=0.3: checkpoint restores the RNG state for the recomputation, so the masks (and the
    gradients) are those of the forward pass. Without that (preserve_rng_state=False) the
    recomputed masks differ and so do the gradients, which is what this test would see."""
    m = tiny(dropout=0.3)
    ref = step(m, False, packed_batch(), seed=5)
    assert_same(step(m, True, packed_batch(), seed=5), ref, 1e-12)
    assert not torch.allclose(step(m, False, packed_batch(), seed=6)[1][0], ref[1][0])  # dropout is on

    real = torch.utils.checkpoint.checkpoint
    torch.utils.checkpoint.checkpoint = functools.partial(real, preserve_rng_state=False)
    try:
        broken = step(m, True, packed_batch(), seed=5)
    finally:
        torch.utils.checkpoint.checkpoint = real
    assert abs(broken[0].item() - ref[0].item()) < 1e-12  # the forward pass is the same ...
    assert not all(torch.allclose(g, r, atol=1e-6) for g, r in zip(broken[1], ref[1]))  # ... backward is not


def saved_bytes(m, on):
    """Bytes of the tensors autograd keeps for backward during one training forward pass."""
    m.activation_checkpointing = on
    total = []

    def pack(t):
        total.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(**packed_batch(), return_logits=False)
    return sum(total)


def test_keeps_fewer_activations_and_the_same_state_dict():
    m = tiny()
    keys = list(m.state_dict())
    plain, checkpointed = saved_bytes(m, False), saved_bytes(m, True)
    assert checkpointed < plain / 2  # block inputs only (and the head's own gradients)
    assert list(m.state_dict()) == keys  # no wrapper modules: checkpoints are unchanged
    # evaluation and generation (no gradients) run the blocks as they are
    with torch.no_grad():
        assert saved_bytes(m, True) == 0
        m.eval()
        out = m.generate(torch.tensor([[1, 2, 3]]), 4, temperature=0.0)
    m.activation_checkpointing = False
    with torch.no_grad():
        assert torch.equal(m.generate(torch.tensor([[1, 2, 3]]), 4, temperature=0.0), out)


@pytest.mark.slow
def test_compile_fullgraph_with_checkpointing():
    """torch.compile traces the checkpointed blocks (and the fused head) without a graph break
    and gives the eager gradients."""
    torch._dynamo.reset()
    m = tiny()
    ref = step(m, True, packed_batch())
    m.activation_checkpointing = True
    explained = torch._dynamo.explain(m)(**packed_batch(), return_logits=False)
    assert explained.graph_break_count == 0
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    m.zero_grad()
    torch.manual_seed(0)
    compiled(**packed_batch(), return_logits=False)
    m.last_loss.backward()
    assert abs(m.last_loss.item() - ref[0].item()) < 1e-12
    assert all(torch.allclose(p.grad, r, rtol=0, atol=1e-12) for p, r in zip(m.parameters(), ref[1]))
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def corpus(lab_corpus):
    return lab_corpus.cache_dir


@pytest.mark.slow
def test_train_run_has_the_same_losses(corpus, tmp_path, monkeypatch):
    """train.py --activation_checkpointing=True (fp32, dropout 0.1): the per-iteration losses of
    the run without it, bit for bit, with every block checkpointed at every micro-step."""
    runs, calls, real = {}, [], torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    for on in (False, True):
        out = str(tmp_path / f"run_{on}")
        calls.clear()
        train(tiny_args(corpus, out, max_iters=6, eval_interval=6, max_new_tokens=0, activation_checkpointing=on),
              check=True)
        runs[on] = train_losses(out)
        assert len(calls) == (6 * 2 * 2 if on else 0)  # iterations x micro-steps x layers
        with open(os.path.join(out, "config.json")) as f:
            assert json.load(f)["activation_checkpointing"] is on
    assert len(runs[True]) == 6 and runs[True] == runs[False]


@pytest.mark.slow
def test_memory_bench_runs():
    """bench/memory.py (a tiny shape here): one row per setting, each from its own process."""
    from conftest import run_cli
    proc = run_cli(["bench/memory.py", "configs/base8M.py", "--dim=32", "--n_layers=2", "--n_heads=4", "--n_kv_heads=4",
                    "--vocab_size=64", "--max_seq_len=32", "--batch_size=2", "--iters=1", "--warmup=0"], check=True)
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["False"], ["True"])]
    assert [r[0] for r in rows] == ["False", "True"] and "T=32" in proc.stdout
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
