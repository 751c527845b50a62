"""Packed rows through the model: every packed example's logits (and the gradient of its loss)
equal the example run alone (causal and prefix-LM), through each way the model builds the mask from
the segment ids (attention_impl sdpa; flex, forward only on the CPU, with its backward on CUDA),
padding never gives NaN, the batches carry no (B, T, T) mask, and the training batches of
T0Batches give the token / example normalised loss of the global batch computed by hand from each
example alone, however the rows are split into micro-batches and ranks."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model as shared_tiny_model

from tinylab.nn.attention import ATTENTION, document_block_mask, document_mask, flex_attention
from tinylab.t0.batches import T0Batches, loss_weights, model_inputs
from tinylab.t0.encode import Examples
from tinylab.t0.packing import PackedStream, rows_to_arrays

V = 61
# every attention backend that runs here (the registry's); flex has no backward on the CPU
# (torch 2.13), so its gradients are checked on CUDA only
IMPLS = [name for name in ATTENTION.names() if ATTENTION.get(name)().problem(0.0) is None]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def tiny_model(seed=0, max_seq_len=64):
    return shared_tiny_model(seed=seed, vocab_size=V, max_seq_len=max_seq_len, dtype=torch.float64)


def can_backward(impl, device):
    return ATTENTION.get(impl)().training_problem(device, 0.0) is None


def packed_logits(model, batch, impl):
    """All logits of a model_inputs batch with the mask built under attention_impl=impl."""
    model.attention_impl = impl
    assert model.packed_attention(batch["tokens"].device) == impl
    inputs = {k: v for k, v in batch.items() if k not in ("targets", "loss_weights")}
    with torch.set_grad_enabled(torch.is_grad_enabled() and can_backward(impl, batch["tokens"].device.type)):
        return model(**inputs, all_logits=True)


def examples(n=12, seed=0):
    rng = np.random.default_rng(seed)
    ex = Examples("toy")
    for _ in range(n):
        length = int(rng.integers(4, 20))
        ex.ids.append(rng.integers(0, V, length).astype(np.int32))
        ex.n_input.append(int(rng.integers(1, length)))
    return ex


def alone_logits(model, ids, n_input, prefixlm, device="cpu"):
    """An example in a batch of its own, positions 0.. and no padding; causal without any mask
    (the model's plain path), prefix-LM with the mask written out from its definition."""
    x = torch.as_tensor(ids[:-1], dtype=torch.long, device=device)[None]
    if not prefixlm:
        return model(x, all_logits=True)[0]
    n = x.shape[1]
    q, k = torch.arange(n, device=device)[:, None], torch.arange(n, device=device)[None, :]
    mask = (k <= q) | ((q < n_input) & (k < n_input))
    return model(x, attn_mask=mask[None], all_logits=True)[0]


def packed_rows(ex, row_len, n_rows, seed=1):
    return PackedStream([ex.lengths()], [1.0], row_len, seed=seed).next_rows(n_rows)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("prefixlm", [False, True])
def test_packed_logits_equal_each_example_alone(prefixlm, impl, device):
    # rows of 300 tokens: FlexAttention's 128 x 128 blocks, most of them skipped
    model, ex = tiny_model(max_seq_len=300).to(device), examples(40)
    rows = packed_rows(ex, 300, 3)
    batch, _, _ = model_inputs(*rows_to_arrays(rows, [ex], 300), prefixlm, device)
    logits = packed_logits(model, batch, impl)
    assert torch.isfinite(logits).all()
    checked, alone = 0, {}
    for r, row in enumerate(rows):
        pos = 0
        for _, i in row:
            n = len(ex.ids[i])
            if i not in alone:
                alone[i] = alone_logits(model, ex.ids[i], ex.n_input[i], prefixlm, device)
            # the example's last token is the next example's (or padding's) context: compare n - 1
            got, want = logits[r, pos:pos + n - 1], alone[i]
            assert torch.allclose(got, want, atol=1e-10, rtol=0), (r, i, (got - want).abs().max())
            pos, checked = pos + n, checked + 1
    assert checked > 10 * len(rows)  # rows really held many examples
    if prefixlm:  # and the two modes really differ on inputs
        causal, _, _ = model_inputs(*rows_to_arrays(rows, [ex], 300), False, device)
        assert not torch.allclose(packed_logits(model, causal, impl), logits)


# torch 2.13 has no FlexAttention backward on the CPU: those pairs are left out, not skipped
@pytest.mark.parametrize("impl,device", [(i, d) for d in DEVICES for i in IMPLS if can_backward(i, d)])
@pytest.mark.parametrize("prefixlm", [False, True])
def test_packed_gradient_equals_the_sum_over_examples_alone(prefixlm, impl, device):
    model, ex = tiny_model(max_seq_len=160).to(device), examples(30, seed=6)
    rows = packed_rows(ex, 160, 2)
    batch, label_mask, _ = model_inputs(*rows_to_arrays(rows, [ex], 160), prefixlm, device)
    model.attention_impl = impl
    model(**batch, loss_weights=label_mask.to(device, torch.float64))  # the sum of target-label CEs
    packed_loss = model.last_loss
    packed = torch.autograd.grad(packed_loss, list(model.parameters()))
    per_example = hand_losses(model, ex, [i for row in rows for _, i in row], prefixlm, device)
    alone_loss = torch.cat(per_example).sum()
    alone = torch.autograd.grad(alone_loss, list(model.parameters()))
    assert packed_loss.item() == pytest.approx(alone_loss.item(), rel=1e-10)
    for g, g0 in zip(packed, alone):
        assert torch.allclose(g, g0, atol=1e-11, rtol=1e-8)


@pytest.mark.parametrize("impl", IMPLS)
def test_packed_fp32_within_1e5(impl):
    model, ex = tiny_model().float(), examples(8, seed=2)
    rows = packed_rows(ex, 40, 4, seed=0)
    batch, _, _ = model_inputs(*rows_to_arrays(rows, [ex], 40), False, "cpu")
    logits = packed_logits(model, batch, impl)
    s, i = rows[0][1]
    start = len(ex.ids[rows[0][0][1]])
    want = alone_logits(model, ex.ids[i], ex.n_input[i], False)
    assert torch.allclose(logits[0, start:start + len(ex.ids[i]) - 1], want, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("prefixlm", [False, True])
def test_padding_and_all_padding_rows_stay_finite(prefixlm, impl):
    model = tiny_model().float().train()
    ex = examples(3, seed=3)
    rows = [[(0, 0)], [(0, 1), (0, 2)]]
    token_ids, seg, is_input = rows_to_arrays(rows, [ex], 64)
    token_ids = np.concatenate([token_ids, np.zeros((1, 64), dtype=token_ids.dtype)])  # an all-padding row
    seg = np.concatenate([seg, np.zeros((1, 64), dtype=seg.dtype)])
    is_input = np.concatenate([is_input, np.zeros((1, 64), dtype=bool)])
    batch, label_mask, label_seg = model_inputs(token_ids, seg, is_input, prefixlm, "cpu")
    assert torch.isfinite(packed_logits(model, batch, impl)).all()
    if not can_backward(impl, "cpu"):
        return
    batch["loss_weights"] = loss_weights(label_mask, label_seg, "example").float()
    logits = model(**batch)
    model.last_loss.backward()
    assert torch.isfinite(logits).all() and torch.isfinite(model.last_loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.last_loss > 0


@pytest.mark.parametrize("prefixlm", [False, True])
def test_batches_carry_segment_ids_not_a_dense_mask(prefixlm):
    ex = examples(20, seed=7)
    batches = T0Batches(PackedStream([ex.lengths()], [1.0], 40, seed=0), [ex], 4, 2, 0, 1, "token", prefixlm, "cpu")
    batch = next(batches)
    assert set(batch) == {"tokens", "targets", "segment_ids", "position_ids", "loss_weights", "loss_scale"} | (
        {"prefix_mask"} if prefixlm else set())
    assert all(v.dim() == 2 for v in batch.values() if torch.is_tensor(v))  # (B, T): no (B, T, T) tensor
    assert batch["segment_ids"].shape == batch["tokens"].shape == (4, 39)


def test_sdpa_keeps_one_mask_for_all_layers():
    """SDPA saves its mask for backward (a float copy of a bool one): the model hands every layer the
    same additive mask, so a training forward keeps one (B, 1, T, T) tensor, not one per layer."""
    model, ex = tiny_model(max_seq_len=40).train(), examples(10, seed=8)
    batch, label_mask, _ = model_inputs(*rows_to_arrays(packed_rows(ex, 40, 3), [ex], 40), True, "cpu")
    masks = []

    def pack(t):
        if t.shape == (3, 1, 39, 39):
            masks.append(t.data_ptr())
        return t

    model.attention_impl = "sdpa"
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**batch, loss_weights=label_mask.double())
    assert len(masks) == model.n_layers and len(set(masks)) == 1


@pytest.mark.skipif(flex_attention is None, reason="torch without FlexAttention")
@pytest.mark.parametrize("prefixlm", [False, True])
def test_block_mask_is_the_dense_mask(prefixlm):
    """FlexAttention's mask_mod gives document_mask element by element, and its block mask skips
    exactly the 128 x 128 blocks in which nothing may attend."""
    from torch.nn.attention.flex_attention import create_mask
    ex = examples(60, seed=9)
    _, seg, inp = (torch.as_tensor(a) for a in rows_to_arrays(packed_rows(ex, 300, 3), [ex], 300))
    seg[-1, 250:], inp[-1, 250:] = 0, False  # trailing padding
    prefix = inp if prefixlm else None
    dense = document_mask(seg, prefix)
    bm = document_block_mask(seg, prefix)
    assert torch.equal(create_mask(bm.mask_mod, 3, 1, 300, 300, device="cpu")[:, 0], dense)
    blocks = bm.to_dense()[:, 0].bool()  # (B, 3, 3): blocks with any allowed pair
    padded = F.pad(dense, (0, 84, 0, 84))
    assert torch.equal(blocks, padded.view(3, 3, 128, 3, 128).any(4).any(2))
    assert not blocks.all()  # blocks really are skipped


def test_attention_impl_resolution():
    model = tiny_model()
    assert model.attention_impl == "auto" and model.packed_attention(torch.device("cpu")) == "sdpa"
    assert model.packed_attention(torch.device("cuda")) == ("flex" if flex_attention is not None else "sdpa")
    model.attention_impl = "sdpa"
    assert model.packed_attention(torch.device("cuda")) == "sdpa"
    model.attention_impl = "dens"
    with pytest.raises(ValueError, match="attention_impl must be one of auto, dense, flex, sdpa, not 'dens'"):
        model.packed_attention(torch.device("cpu"))
    dropping = tiny_model().train()
    dropping.params.dropout = 0.1
    assert dropping.packed_attention(torch.device("cuda")) == "sdpa"  # flex has no attention dropout
    dropping.attention_impl = "flex"
    with pytest.raises(ValueError, match="no attention dropout"):
        dropping.packed_attention(torch.device("cuda"))
    seg = torch.ones(1, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="pass no attn_mask"):
        tiny_model()(torch.zeros(1, 8, dtype=torch.long), segment_ids=seg, attn_mask=document_mask(seg))


def hand_losses(model, ex, indices, prefixlm=False, device="cpu"):
    """Per-example target-label cross-entropies, each example run alone (no packing)."""
    out = []
    for i in indices:
        ids = torch.as_tensor(ex.ids[i], dtype=torch.long, device=device)
        logits = alone_logits(model, ex.ids[i], ex.n_input[i], prefixlm, device)
        ce = F.cross_entropy(logits, ids[1:], reduction="none")
        out.append(ce[ex.n_input[i] - 1:])  # labels from the first target token to the EOS
    return out


def run_global_batch(model, ex, micro_steps, world, normalization, batch_size, seed=0):
    """What the Trainer does for one iteration: every rank's micro-batches, loss * loss_scale
    summed (backward accumulates), then DDP's mean over ranks. Returns (loss, gradients)."""
    model.zero_grad()
    total = 0.0
    for rank in range(world):
        stream = PackedStream([ex.lengths()], [1.0], 40, seed=seed)
        batches = T0Batches(stream, [ex], batch_size, micro_steps, rank, world, normalization, False, "cpu",
                              torch.float64)
        for _ in range(micro_steps):
            b = next(batches)
            scale = b.pop("loss_scale")
            model(**b)
            loss = model.last_loss * scale / world  # DDP averages the ranks' gradients
            loss.backward()
            total += loss.item()
    return total, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("normalization", ["token", "example"])
def test_normalised_loss_equals_hand_computation_for_any_split(normalization):
    model, ex = tiny_model(4), examples(30, seed=4)
    rows = PackedStream([ex.lengths()], [1.0], 40, seed=0).next_rows(8)
    per_example = hand_losses(model, ex, [i for row in rows for _, i in row])
    if normalization == "token":
        want = torch.cat(per_example).sum().item() / sum(len(c) for c in per_example)
    else:
        want = float(np.mean([c.mean().item() for c in per_example]))
    results = [run_global_batch(model, ex, m, w, normalization, 8 // (m * w)) for m, w in ((1, 1), (4, 1), (2, 2), (1, 4))]
    for loss, grads in results:
        assert loss == pytest.approx(want, rel=1e-10)
        for g, g0 in zip(grads, results[0][1]):
            assert torch.allclose(g, g0, atol=1e-12, rtol=1e-9)  # the same gradient however it is split


def test_token_microbatch_is_megatrons_mean_of_micro_batch_means():
    model, ex = tiny_model(5), examples(30, seed=5)
    rows = PackedStream([ex.lengths()], [1.0], 40, seed=0).next_rows(8)
    means = []
    for g in range(4):
        per = hand_losses(model, ex, [i for row in rows[2 * g:2 * g + 2] for _, i in row])
        means.append(torch.cat(per).mean().item())
    loss, _ = run_global_batch(model, ex, 2, 2, "token_microbatch", 2)
    assert loss == pytest.approx(float(np.mean(means)), rel=1e-10)
