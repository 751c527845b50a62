"""Packed rows through the model: every packed example's logits equal the example run alone
(causal and prefix-LM), padding never gives NaN, and the training batches of T0Batches give the
token / example normalised loss of the global batch computed by hand from each example alone,
however the rows are split into micro-batches and ranks."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model as shared_tiny_model

from tinylab import t0_data as T

V = 61


def tiny_model(seed=0, max_seq_len=64):
    return shared_tiny_model(seed=seed, vocab_size=V, max_seq_len=max_seq_len, dtype=torch.float64)


def examples(n=12, seed=0):
    rng = np.random.default_rng(seed)
    ex = T.Examples("toy")
    for _ in range(n):
        length = int(rng.integers(4, 20))
        ex.ids.append(rng.integers(0, V, length).astype(np.int32))
        ex.n_input.append(int(rng.integers(1, length)))
    return ex


def alone_logits(model, ids, n_input, prefixlm):
    """An example in a batch of its own, positions 0.. and no padding; causal without any mask
    (the model's plain path), prefix-LM with the mask written out from its definition."""
    x = torch.as_tensor(ids[:-1], dtype=torch.long)[None]
    if not prefixlm:
        return model(x, all_logits=True)[0]
    n = x.shape[1]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = (k <= q) | ((q < n_input) & (k < n_input))
    return model(x, attn_mask=mask[None], all_logits=True)[0]


@pytest.mark.parametrize("prefixlm", [False, True])
def test_packed_logits_equal_each_example_alone(prefixlm):
    model, ex = tiny_model(), examples(12)
    row_len = 48
    rows = T.PackedStream([ex.lengths()], [1.0], row_len, seed=1).next_rows(6)
    batch, _, _ = T.model_inputs(*T.rows_to_arrays(rows, [ex], row_len), prefixlm, "cpu")
    logits = model(batch["tokens"], attn_mask=batch["attn_mask"], position_ids=batch["position_ids"], all_logits=True)
    assert torch.isfinite(logits).all()
    checked = 0
    for r, row in enumerate(rows):
        pos = 0
        for _, i in row:
            n = len(ex.ids[i])
            want = alone_logits(model, ex.ids[i], ex.n_input[i], prefixlm)
            # the example's last token is the next example's (or padding's) context: compare n - 1
            got = logits[r, pos:pos + n - 1]
            assert torch.allclose(got, want, atol=1e-10, rtol=0), (r, i, (got - want).abs().max())
            pos, checked = pos + n, checked + 1
    assert checked > len(rows)  # rows really held several examples
    if prefixlm:  # and the two modes really differ on inputs
        causal, _, _ = T.model_inputs(*T.rows_to_arrays(rows, [ex], row_len), False, "cpu")
        assert not torch.allclose(model(causal["tokens"], attn_mask=causal["attn_mask"],
                                        position_ids=causal["position_ids"], all_logits=True), logits)


def test_packed_fp32_within_1e5():
    model, ex = tiny_model().float(), examples(8, seed=2)
    rows = T.PackedStream([ex.lengths()], [1.0], 40, seed=0).next_rows(4)
    batch, _, _ = T.model_inputs(*T.rows_to_arrays(rows, [ex], 40), False, "cpu")
    logits = model(batch["tokens"], attn_mask=batch["attn_mask"], position_ids=batch["position_ids"], all_logits=True)
    s, i = rows[0][1]
    start = len(ex.ids[rows[0][0][1]])
    want = alone_logits(model, ex.ids[i], ex.n_input[i], False)
    assert torch.allclose(logits[0, start:start + len(ex.ids[i]) - 1], want, atol=1e-5)


@pytest.mark.parametrize("prefixlm", [False, True])
def test_padding_and_all_padding_rows_stay_finite(prefixlm):
    model = tiny_model().float().train()
    ex = examples(3, seed=3)
    rows = [[(0, 0)], [(0, 1), (0, 2)]]
    token_ids, seg, is_input = T.rows_to_arrays(rows, [ex], 64)
    token_ids = np.concatenate([token_ids, np.zeros((1, 64), dtype=token_ids.dtype)])  # an all-padding row
    seg = np.concatenate([seg, np.zeros((1, 64), dtype=seg.dtype)])
    is_input = np.concatenate([is_input, np.zeros((1, 64), dtype=bool)])
    batch, label_mask, label_seg = T.model_inputs(token_ids, seg, is_input, prefixlm, "cpu")
    batch["loss_weights"] = T.loss_weights(label_mask, label_seg, "example").float()
    logits = model(**batch)
    model.last_loss.backward()
    assert torch.isfinite(logits).all() and torch.isfinite(model.last_loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.last_loss > 0


def hand_losses(model, ex, indices):
    """Per-example target-label cross-entropies, each example run alone (no packing)."""
    out = []
    for i in indices:
        ids = torch.as_tensor(ex.ids[i], dtype=torch.long)
        logits = model(ids[None, :-1], all_logits=True)[0]
        ce = F.cross_entropy(logits, ids[1:], reduction="none")
        out.append(ce[ex.n_input[i] - 1:])  # labels from the first target token to the EOS
    return out


def run_global_batch(model, ex, micro_steps, world, normalization, batch_size, seed=0):
    """What the Trainer does for one iteration: every rank's micro-batches, loss * loss_scale
    summed (backward accumulates), then DDP's mean over ranks. Returns (loss, gradients)."""
    model.zero_grad()
    total = 0.0
    for rank in range(world):
        stream = T.PackedStream([ex.lengths()], [1.0], 40, seed=seed)
        batches = T.T0Batches(stream, [ex], batch_size, micro_steps, rank, world, normalization, False, "cpu",
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
    rows = T.PackedStream([ex.lengths()], [1.0], 40, seed=0).next_rows(8)
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
    rows = T.PackedStream([ex.lengths()], [1.0], 40, seed=0).next_rows(8)
    means = []
    for g in range(4):
        per = hand_losses(model, ex, [i for row in rows[2 * g:2 * g + 2] for _, i in row])
        means.append(torch.cat(per).mean().item())
    loss, _ = run_global_batch(model, ex, 2, 2, "token_microbatch", 2)
    assert loss == pytest.approx(float(np.mean(means)), rel=1e-10)
