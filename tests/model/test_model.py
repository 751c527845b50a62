"""model.py against independent references: a plain-math forward pass written here, no-cache
decoding, llama2.c's checkpoint keys."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from model import ModelArgs, Transformer
from tinylab.core import checkpoint as ckpt_lib
from tinylab.nn import fused_head, sampling
from tinylab.nn.sampling import KVCache, sample_tokens


def tiny(n_kv_heads=None, tie=True, **kw):
    args = dict(dim=48, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, vocab_size=67, multiple_of=16, max_seq_len=40,
                tie_embeddings=tie)
    args.update(kw)
    return tiny_model(dtype=torch.float64, **args)


def reference_logits(m, tokens, positions=None, mask=None):
    """Llama forward written from the formulas: RMSNorm, interleaved RoPE, softmax attention with
    explicit masking, SwiGLU. Independent of model.py's SDPA path, caches and helpers."""
    p = m.params
    B, T = tokens.shape
    hd = p.dim // p.n_heads
    kvh = p.n_kv_heads or p.n_heads
    if positions is None:
        positions = torch.arange(T).expand(B, T)
    if mask is None:
        mask = torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = positions[..., None].double() * inv  # (B, T, hd/2)

    def rope(x):  # x (B, T, H, hd), pairs (2i, 2i+1) rotated by ang[..., i]
        xr, xi = x[..., 0::2], x[..., 1::2]
        c, s = torch.cos(ang)[:, :, None], torch.sin(ang)[:, :, None]
        out = torch.empty_like(x)
        out[..., 0::2] = xr * c - xi * s
        out[..., 1::2] = xr * s + xi * c
        return out

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + p.norm_eps) * w

    h = m.tok_embeddings.weight[tokens]
    for layer in m.layers:
        a = layer.attention
        x = rms(h, layer.attention_norm.weight)
        q = rope((x @ a.wq.weight.T).view(B, T, p.n_heads, hd))
        k = rope((x @ a.wk.weight.T).view(B, T, kvh, hd))
        v = (x @ a.wv.weight.T).view(B, T, kvh, hd)
        out = torch.zeros(B, T, p.n_heads, hd, dtype=h.dtype)
        for head in range(p.n_heads):
            g = head // (p.n_heads // kvh)
            scores = torch.einsum("btd,bsd->bts", q[:, :, head], k[:, :, g]) / math.sqrt(hd)
            scores = scores.masked_fill(~mask, float("-inf"))
            out[:, :, head] = torch.softmax(scores, -1) @ v[:, :, g]
        h = h + out.reshape(B, T, -1) @ a.wo.weight.T
        ff = layer.feed_forward
        x = rms(h, layer.ffn_norm.weight)
        h = h + (F.silu(x @ ff.w1.weight.T) * (x @ ff.w3.weight.T)) @ ff.w2.weight.T
    return rms(h, m.norm.weight) @ m.output.weight.T


@pytest.mark.parametrize("kv", [None, 2, 1])
@pytest.mark.parametrize("tie", [True, False])
def test_forward_matches_plain_math(kv, tie):
    m = tiny(kv, tie)
    tokens = torch.randint(0, 67, (3, 17))
    logits = m(tokens, tokens)  # with targets: logits of every position
    assert logits.shape == (3, 17, 67)
    ref = reference_logits(m, tokens)
    assert torch.allclose(logits, ref, atol=1e-10), (logits - ref).abs().max()
    loss = F.cross_entropy(ref.view(-1, 67), tokens.view(-1))
    assert abs(m.last_loss.item() - loss.item()) < 1e-10
    last = m(tokens)
    assert last.shape == (3, 1, 67) and m.last_loss is None
    assert torch.allclose(last[:, 0], ref[:, -1], atol=1e-10)


def test_mask_and_position_ids_match_reference():
    # two examples packed in one row: block-diagonal causal mask, positions restart at 0
    m = tiny(2)
    a, b = torch.randint(0, 67, (1, 7)), torch.randint(0, 67, (1, 5))
    row = torch.cat([a, b], 1)
    seg = torch.tensor([[1] * 7 + [2] * 5])
    mask = (seg[:, :, None] == seg[:, None, :]) & torch.ones(12, 12, dtype=torch.bool).tril()
    pos = torch.tensor([list(range(7)) + list(range(5))])
    packed = m(row, attn_mask=mask, position_ids=pos, all_logits=True)
    assert torch.allclose(packed, reference_logits(m, row, pos, mask), atol=1e-10)
    alone_a, alone_b = m(a, all_logits=True), m(b, all_logits=True)
    assert torch.allclose(packed[:, :7], alone_a, atol=1e-10)
    assert torch.allclose(packed[:, 7:], alone_b, atol=1e-10)


def test_loss_weights_and_ignore_index():
    m = tiny()
    x = torch.randint(0, 67, (2, 9))
    y = x.clone()
    y[:, :4] = -1
    logits = m(x, y)
    ce = F.cross_entropy(logits.view(-1, 67), x.view(-1), reduction="none").view(2, 9)
    assert abs(m.last_loss.item() - ce[:, 4:].mean().item()) < 1e-10
    w = torch.rand(2, 9, dtype=torch.float64)
    m(x, x, loss_weights=w)
    assert abs(m.last_loss.item() - (ce * w).sum().item()) < 1e-10


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("tie", [True, False])
def test_fused_head_loss_matches_logits_and_cross_entropy(monkeypatch, weighted, tie):
    """return_logits=False fuses the head matmul and the loss, chunk by chunk (7 rows here, so
    several chunks): loss and every gradient equal F.linear + F.cross_entropy, also when the
    loss is scaled before backward (gradient accumulation, GradScaler)."""
    monkeypatch.setattr(fused_head, "_head_chunk_rows", lambda vocab: 7)
    m = tiny(tie=tie).train()
    x = torch.randint(0, 67, (3, 11))
    y = torch.randint(0, 67, (3, 11))
    y[0, :4] = -1
    w = torch.rand(3, 11, dtype=torch.float64) * (y >= 0) if weighted else None

    def loss_and_grads(**kw):
        m.zero_grad()
        out = m(x, y, loss_weights=w, **kw)
        loss = m.last_loss
        (loss * 0.25).backward()
        return out, loss.detach(), [p.grad.clone() for p in m.parameters()]

    logits, ref_loss, ref_grads = loss_and_grads()
    out, loss, grads = loss_and_grads(return_logits=False)
    assert out is None and logits.shape == (3, 11, 67)
    assert abs(loss.item() - ref_loss.item()) < 1e-12
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=0, atol=1e-13)
    # evaluation: the same loss, and no gradients computed
    asked, chunked = [], fused_head._chunked_cross_entropy
    monkeypatch.setattr(fused_head, "_chunked_cross_entropy", lambda *a: asked.append(a[4:6]) or chunked(*a))
    with torch.no_grad():
        m(x, y, loss_weights=w, return_logits=False)
    assert abs(m.last_loss.item() - ref_loss.item()) < 1e-12 and asked == [(False, False)]


def test_shapes_gqa_and_hidden_rule():
    m = Transformer(ModelArgs(dim=288, n_layers=6, n_heads=6, n_kv_heads=2, vocab_size=8192, multiple_of=32, max_seq_len=256))
    a = m.layers[0].attention
    assert a.wq.weight.shape == (288, 288) and a.wk.weight.shape == (96, 288) and a.wv.weight.shape == (96, 288)
    assert m.layers[0].feed_forward.w1.weight.shape == (768, 288)  # llama2.c: 2/3*4*288=768
    assert m.tok_embeddings.weight is m.output.weight
    n = m.num_params()
    assert n == sum(p.numel() for p in m.parameters())
    # 6N + 12 L H Q T with N including the (tied) head matrix once
    assert m.flops_per_token() == 6 * n + 12 * 6 * 6 * 48 * 256


def test_scaled_init_of_output_projections():
    m = Transformer(ModelArgs(dim=256, n_layers=8, n_heads=4, vocab_size=64, multiple_of=32, max_seq_len=16))
    std = 0.02 / math.sqrt(16)
    assert abs(m.layers[0].attention.wo.weight.std().item() - std) < 0.1 * std
    assert abs(m.layers[0].feed_forward.w2.weight.std().item() - std) < 0.1 * std
    assert abs(m.layers[0].attention.wq.weight.std().item() - 0.02) < 0.002


LLAMA2C_KEYS = {"tok_embeddings.weight", "norm.weight", "output.weight"} | {
    f"layers.{i}.{k}" for i in range(2) for k in (
        "attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "attention.wo.weight",
        "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight",
        "attention_norm.weight", "ffn_norm.weight")}


def test_llama2c_checkpoint_loads(tmp_path):
    m = tiny()
    assert set(m.state_dict()) == LLAMA2C_KEYS
    # a checkpoint as llama2.c's train.py writes it: compiled-model prefixes, its model_args keys
    ckpt = {
        "model": {"_orig_mod." + k: v.float() for k, v in m.state_dict().items()},
        "optimizer": {},
        "model_args": dict(dim=48, n_layers=2, n_heads=4, n_kv_heads=None, vocab_size=67, multiple_of=16,
                           max_seq_len=40, dropout=0.0),
        "iter_num": 10, "best_val_loss": 2.5, "config": {"batch_size": 4},
    }
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    loaded = ckpt_lib.model_from_checkpoint(ckpt_lib.load_checkpoint(str(path))).double().eval()
    x = torch.randint(0, 67, (2, 8))
    assert torch.allclose(loaded(x, x), m(x, x), atol=1e-6)


def test_bad_checkpoints_are_user_errors(tmp_path):
    from tinylab.core.errors import UserError
    with pytest.raises(UserError, match="not found"):
        ckpt_lib.load_checkpoint(str(tmp_path / "nope.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="not a readable checkpoint"):
        ckpt_lib.load_checkpoint(str(tmp_path / "junk.pt"))
    m = tiny()
    ckpt = {"model": m.state_dict(), "model_args": {**ckpt_lib.model_args_dict(m), "dim": 64}}
    with pytest.raises(UserError, match="shape"):
        ckpt_lib.model_from_checkpoint(ckpt)


# ---------------------------------------------------------------------- generation

def reference_generate(m, prompts, new, temperature=0.0, top_k=None, generator=None, stop_token=None):
    """generate's documented behaviour, written plainly: every row alone, no KV cache. Before
    each token a row's window (its last tokens, positions from 0) is recomputed from scratch
    with reference_logits; a window that would pass max_seq_len tokens restarts from the last
    max_seq_len // 2; a prompt starts from its last max_seq_len. The rows' logits are sampled
    together (one sample_tokens over the batch, as generate) from the same generator. Returns each
    row's generated tokens, cut after its first stop token."""
    L = m.params.max_seq_len
    rows = [p.tolist() for p in prompts]
    starts = [max(0, len(r) - L) for r in rows]
    gen, done = [[] for _ in rows], [False] * len(rows)
    for _ in range(new):
        logits = []
        for i, r in enumerate(rows):
            if len(r) - starts[i] > L:
                starts[i] = len(r) - L // 2
            logits.append(reference_logits(m, torch.tensor([r[starts[i]:]]))[0, -1])
        logits = torch.stack(logits)
        if temperature == 0.0:
            tokens = logits.argmax(-1)
        else:
            logits = logits.float() / temperature
            if top_k is not None:
                logits[logits < torch.topk(logits, top_k).values[:, [-1]]] = -float("inf")
            tokens = sample_tokens(F.softmax(logits, -1), generator)[:, 0]
        for i, t in enumerate(tokens.tolist()):
            if not done[i]:
                gen[i].append(t)
                rows[i].append(t)
                done[i] = t == stop_token
        if all(done):
            break
    return gen


def test_sample_tokens_inverts_each_rows_cdf():
    """Against numpy: the same uniforms (drawn from a copy of the generator), each row's CDF in
    float64, the first index whose cumulative probability exceeds u * total. Probability-0
    entries (inside and at the end of a row) are never drawn, also when u * total rounds up to
    the total; the draws follow the probabilities (within 5 sigma over 200,000 rows)."""
    g = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(64, 300), -1)
    probs[:, 100:110] = 0
    probs[:, -20:] = 0
    u = torch.rand(64, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    cdf = np.cumsum(probs.double().numpy(), axis=1)
    want = [int(np.searchsorted(c, x * c[-1], side="right")) for c, x in zip(cdf, u[:, 0].numpy())]
    got = sample_tokens(probs, g)
    assert got.shape == (64, 1) and got.dtype == torch.long and got[:, 0].tolist() == want
    # u = 1 - 2**-53 makes u * total round to total: still the last nonzero entry, not a zero one
    high = torch.full((1, 1), 1 - 2.0 ** -53, dtype=torch.float64)
    row = torch.tensor([[0.25, 0.0, 0.75, 0.0, 0.0]])
    from unittest import mock
    with mock.patch.object(sampling, "_uniforms", lambda n, device, generator: high.expand(n, 1)):
        assert sample_tokens(row.expand(3, 5).contiguous())[:, 0].tolist() == [2, 2, 2]
    p = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0])
    n = 200_000
    draws = sample_tokens(p.expand(n, 5).contiguous(), torch.Generator().manual_seed(0))[:, 0]
    counts = torch.bincount(draws, minlength=5).double()
    assert counts[1] == counts[4] == 0
    sigma = (n * p * (1 - p)).sqrt().double()
    assert ((counts - n * p).abs() <= 5 * sigma + 1e-9).all(), counts


def test_generate_refuses_nan_logits():
    m = tiny(2)
    with torch.no_grad():
        m.layers[0].feed_forward.w2.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="logits are NaN"):
        m.generate(torch.randint(0, 67, (2, 5)), 4, generator=torch.Generator().manual_seed(0))


def decode_steps(m, tokens, prompt):
    """Logits of forward's one-token steps over a KV cache after a `prompt`-token prefill, under
    no_grad, with the (B, N, N) mask and (B, N) positions that the whole sequence had: row 0 never
    sees its first three positions from the first step on, every third step is unmasked (every
    earlier key), every other one is at an explicit position (one below the default)."""
    B, N = tokens.shape
    cache = KVCache(m.params, B, N, "cpu", next(m.parameters()).dtype)
    cache.key_valid[0, :3] = False
    mask = torch.ones(N, N, dtype=torch.bool).tril().repeat(B, 1, 1)
    positions = torch.arange(N).repeat(B, 1)
    out = []
    with torch.no_grad():
        m(tokens[:, :prompt], kv_cache=cache)
        for s in range(N - prompt):
            n = prompt + s
            step_mask = cache.key_valid[:, None, :cache.filled(1)] if s % 3 else None
            if step_mask is not None:
                mask[:, n, :n + 1] = step_mask[:, 0]
            step_mask = step_mask[:, None] if s % 3 == 2 else step_mask  # (B, 1, S) and (B, 1, 1, S)
            pos = torch.full((B, 1), n - 1) if s % 2 else None
            if pos is not None:
                positions[:, n] = n - 1
            out.append(m(tokens[:, n:n + 1], attn_mask=step_mask, position_ids=pos, kv_cache=cache))
    return torch.cat(out, 1), mask, positions


@pytest.mark.parametrize("dtype,kv", [(torch.float64, None), (torch.float64, 2), (torch.float32, 2), (torch.bfloat16, None)])
def test_one_token_decoding_equals_the_whole_sequence(dtype, kv):
    """forward's one-token steps over a KV cache, with and without masks and explicit positions,
    with shared kv heads, give the logits of the whole sequence computed at once with the same
    mask and positions: in fp64 the plain-math reference's (to 1e-6: the model's RoPE tables are
    fp32, and sharp() magnifies their rounding; a wrong position or mask moves logits by ~0.1),
    in fp32 and bf16 the uncached forward's in the same dtype (to its rounding)."""
    m = sharp(tiny(kv)).to(dtype)
    tokens = torch.randint(0, 67, (5, 30), generator=torch.Generator().manual_seed(0))
    steps, mask, positions = decode_steps(m, tokens, 8)
    assert steps.shape == (5, 22, 67) and steps.dtype == dtype
    if dtype == torch.float64:
        ref = reference_logits(m, tokens, positions, mask)[:, 8:]
        assert torch.allclose(steps, ref, rtol=0, atol=1e-6), (steps - ref).abs().max()
    else:
        with torch.no_grad():
            whole = m(tokens, attn_mask=mask, position_ids=positions, all_logits=True)[:, 8:]
        tol = 1e-5 if dtype == torch.float32 else 0.05
        assert torch.allclose(steps.double(), whole.double(), rtol=tol, atol=tol * whole.abs().max().item())


def test_decoding_runs_through_the_modules():
    """Generation has one path: the prefill and every one-token step are the model's own forward
    through its modules, so hooks on the model and on any submodule fire at every step, and a
    step under autograd records a graph."""
    m = tiny(2)
    tokens = torch.randint(0, 67, (2, 12), generator=torch.Generator().manual_seed(1))
    calls = []
    root = m.register_forward_hook(lambda *a: calls.append("root"))
    ffn = m.layers[1].feed_forward.register_forward_hook(lambda *a: calls.append("ffn"))
    m.generate(tokens, 5, temperature=0.0)
    assert calls.count("root") == calls.count("ffn") == 5  # prefill + 4 one-token steps
    root.remove()
    ffn.remove()
    cache = KVCache(m.params, 2, 13, "cpu", torch.float64)
    with torch.no_grad():
        m(tokens, kv_cache=cache)
    out = m(tokens[:, :1], kv_cache=cache)  # autograd on: a graph
    assert out.requires_grad


def sharp(m):
    """The tiny model with 20x larger query and key weights: a random model's attention is
    nearly uniform, so greedy tokens would hardly depend on positions; peaked attention makes a
    wrong position or a wrong window change them."""
    with torch.no_grad():
        for layer in m.layers:
            layer.attention.wq.weight.mul_(20)
            layer.attention.wk.weight.mul_(20)
    return m


def left_padded(prompts, pad=0):
    longest = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.bool)
    for i, p in enumerate(prompts):
        idx[i, longest - len(p):], mask[i, longest - len(p):] = p, True
    return idx, mask


def llama2c_generate(m, prompt, new):
    """llama2.c's generate (greedy): idx_cond = idx[:, -max_seq_len:], full forward, last logits."""
    idx = prompt[None]
    for _ in range(new):
        idx_cond = idx[:, -m.params.max_seq_len:]
        idx = torch.cat((idx, m(idx_cond, all_logits=True)[:, -1].argmax(-1, keepdim=True)), dim=1)
    return idx[0, len(prompt):]


@pytest.mark.slow
@pytest.mark.parametrize("kv,lengths", [(None, (12, 7, 30)), (2, (45, 12, 7)), (2, (10, 10))])
@pytest.mark.parametrize("sampled", [False, True])
def test_generation_matches_a_full_recompute_reference(kv, lengths, sampled):
    """Left-padded prompts of different lengths (45 > max_seq_len 40: the prompt is cropped;
    equal lengths: no padding, every row refills at once), 70 new tokens, so every row's window
    restarts from its last 20 tokens two or three times, each row at its own step. The cached
    batch equals the reference token for token, sampled from the same generator too."""
    m = sharp(tiny(kv))
    prompts = [torch.randint(0, 67, (n,)) for n in lengths]
    idx, mask = left_padded(prompts)
    kw = dict(temperature=0.8, top_k=10) if sampled else dict(temperature=0.0)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    out = m.generate(idx, 70, prompt_mask=mask, generator=g1, **kw)
    assert out.shape == (len(lengths), idx.shape[1] + 70) and torch.equal(out[:, :idx.shape[1]], idx)
    ref = reference_generate(m, prompts, 70, generator=g2, **kw)
    for i in range(len(prompts)):
        assert out[i, idx.shape[1]:].tolist() == ref[i], i
    if not sampled:  # while a row's window holds all its tokens, llama2.c's generate agrees
        for i, p in enumerate(prompts):
            fits = max(1, 41 - len(p))  # a cropped prompt: only its first token
            assert torch.equal(out[i, idx.shape[1]:][:fits], llama2c_generate(m, p, fits))
        # greedy decoding is the argmax of the full forward pass at every in-window step
        logits = m(out[:1, :40], all_logits=True)
        assert torch.equal(logits[0, idx.shape[1] - 1:-1].argmax(-1), out[0, idx.shape[1]:40])


def test_left_padded_prompts_generate_as_if_alone():
    m = sharp(tiny(2).float())
    p1, p2 = torch.randint(0, 67, (1, 4)), torch.randint(0, 67, (1, 9))
    batch = torch.zeros(2, 9, dtype=torch.long)
    batch[0, 5:], batch[1] = p1[0], p2[0]
    mask = batch != 0
    mask[0, :5], mask[0, 5:], mask[1] = False, True, True
    out = m.generate(batch, 60, temperature=0.0, prompt_mask=mask)  # past max_seq_len (40) too
    assert torch.equal(out[0, 5:], m.generate(p1, 60, temperature=0.0)[0])
    assert torch.equal(out[1], m.generate(p2, 60, temperature=0.0)[0])
    with pytest.raises(ValueError, match="left padding"):
        m.generate(batch, 3, prompt_mask=mask.flip(1))


@pytest.mark.slow
@pytest.mark.parametrize("lengths", [(9, 5, 14), (10, 10, 10)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_end_at_the_stop_token_and_the_rest_is_unchanged(temperature, lengths):
    """A row ends where it samples stop_token and holds stop_token from there on (an ended row
    is not refilled past max_seq_len). The rows that have not ended get exactly the tokens of a
    run without stopping (the same draws from the same generator), and the reference says so."""
    m = sharp(tiny(2))
    prompts = [torch.randint(0, 67, (n,)) for n in lengths]
    idx, mask = left_padded(prompts)
    T = idx.shape[1]
    free = m.generate(idx, 60, prompt_mask=mask, temperature=temperature, generator=torch.Generator().manual_seed(1))
    stop = int(free[0, T + 4])  # row 0 samples it at step 4 at the latest
    ends = [int((free[i, T:] == stop).int().argmax()) + 1 if (free[i, T:] == stop).any() else 60 for i in range(3)]
    assert max(ends) > ends[0], "some row must go on after row 0 has ended"
    out = m.generate(idx, 60, prompt_mask=mask, temperature=temperature, generator=torch.Generator().manual_seed(1),
                     stop_token=stop)
    ref = reference_generate(m, prompts, 60, temperature, generator=torch.Generator().manual_seed(1), stop_token=stop)
    assert out.shape[1] == T + max(ends)
    for i, end in enumerate(ends):
        assert torch.equal(out[i, :T + end], free[i, :T + end])
        assert (out[i, T + end:] == stop).all()
        assert out[i, T:T + end].tolist() == ref[i]


@pytest.mark.slow
def test_the_batch_stops_when_every_row_has_ended():
    """All rows end (a near-uniform model over 67 tokens finds the stop token soon): the loop
    stops at the next 16-step check, the output is cut after the last row's stop token, and the
    generator is left where a full-length run leaves it."""
    m = tiny(2)
    prompts = [torch.randint(0, 67, (n,)) for n in (9, 5, 14)]
    idx, mask = left_padded(prompts)
    T, stop = idx.shape[1], 7
    calls = []
    m.register_forward_hook(lambda mod, args, output: calls.append(args[0].shape[1]))
    g = torch.Generator().manual_seed(0)
    out = m.generate(idx, 300, prompt_mask=mask, generator=g, stop_token=stop)
    ends = [(out[i, T:] == stop).nonzero()[0, 0].item() for i in range(3)]
    assert out.shape[1] == T + max(ends) + 1 < T + 100
    ref = reference_generate(m, prompts, 300, temperature=1.0, generator=torch.Generator().manual_seed(0), stop_token=stop)
    for i in range(3):
        assert out[i, T:T + ends[i] + 1].tolist() == ref[i] and (out[i, T + ends[i]:] == stop).all()
    # one prefill, then one-token steps up to the first multiple of 16 after the last end
    decoded = sum(1 for c in calls if c == 1)
    assert decoded == -(-(max(ends) + 1) // 16) * 16 - 1
    full = torch.Generator().manual_seed(0)
    m.generate(idx, 300, prompt_mask=mask, generator=full)
    assert torch.equal(g.get_state(), full.get_state())


def test_kv_cache_ring_refuses_a_write_past_its_end():
    m = tiny()
    cache = KVCache(m.params, 1, 8, "cpu", torch.float64)
    cache.length = 5
    k = torch.zeros(1, 4, 4, 12, dtype=torch.float64)
    with pytest.raises(ValueError, match="overrun"):
        cache.update(0, k, k)
