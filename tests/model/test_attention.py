"""The attention backends (tinylab/nn/attention/): dense, the reference, against the formula
written out here; every registered backend against dense in fp64 on packed rows (segment ids,
causal and prefix-LM, padding), causal rows, explicit masks and one query over a cache, outputs
and gradients; the model under each attention_impl; the registry behind the attention_impl key."""
import math

import pytest
import torch
from conftest import tiny_model

from tinylab.core.errors import UserError
from tinylab.nn.attention import ATTENTION, check_attention_impl, choices, document_mask, resolve
from tinylab.schema import FINETUNE_T0

# the backends that run here (flex needs torch >= 2.5); flex's backward only on CUDA
RUNNABLE = [name for name in ATTENTION.names() if ATTENTION.get(name)().problem(0.0) is None]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H, KV, HD = 4, 2, 8


def trains_here(name):
    return ATTENTION.get(name)().training_problem(DEVICE, 0.0) is None


def packed_rows():
    """Segment ids (3, 24): three examples and padding; one example; a short one and padding.
    prefix_mask: each example's first third are its input tokens."""
    seg = torch.tensor([[1] * 7 + [2] * 10 + [3] * 5 + [0] * 2, [1] * 24, [1] * 3 + [0] * 21], device=DEVICE)
    prefix = torch.zeros_like(seg, dtype=torch.bool)
    for r in range(3):
        for s in seg[r].unique().tolist():
            if s:
                where = (seg[r] == s).nonzero()[:, 0]
                prefix[r, where[:max(1, len(where) // 3)]] = True
    return seg, prefix


def qkv(T, S=None, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    S = T if S is None else S
    shapes = [(3, H, T, HD), (3, KV, S, HD), (3, KV, S, HD)]
    return [(3 * torch.randn(s, generator=g, dtype=torch.float64)).to(DEVICE).requires_grad_(grad) for s in shapes]


def formula(q, k, v, allowed):
    """softmax over the allowed keys of q.k / sqrt(hd), times v, one (row, head, query) at a time;
    query head h reads kv head h // (H / KV). allowed: bool broadcastable to (B, H, T, S)."""
    B, _, T, hd = q.shape
    allowed = allowed.expand(B, H, T, k.shape[2])
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            g = h // (H // KV)
            for i in range(T):
                keys = allowed[b, h, i].nonzero()[:, 0]
                w = torch.softmax(torch.stack([q[b, h, i] @ k[b, g, j] for j in keys]) / math.sqrt(hd), 0)
                out[b, h, i] = (w[:, None] * v[b, g, keys]).sum(0)
    return out


@pytest.mark.parametrize("prefixlm", [False, True])
def test_dense_is_the_formula(prefixlm):
    seg, prefix = packed_rows()
    prefix = prefix if prefixlm else None
    q, k, v = qkv(24)
    dense = ATTENTION.get("dense")()
    want = formula(q, k, v, document_mask(seg, prefix)[:, None])
    with torch.no_grad():
        bool_mask = dense.packed_mask(seg, prefix, torch.float64)
    assert bool_mask.dtype == torch.bool
    assert torch.allclose(dense.attend(q, k, v, bool_mask, False, 0.0), want, rtol=0, atol=1e-12)
    additive = dense.packed_mask(seg, prefix, torch.float64)  # gradients recorded: additive
    assert additive.dtype == torch.float64
    assert torch.allclose(dense.attend(q, k, v, additive, False, 0.0), want, rtol=0, atol=1e-12)
    causal = torch.ones(24, 24, dtype=torch.bool, device=DEVICE).tril()
    assert torch.allclose(dense.attend(q, k, v, None, True, 0.0), formula(q, k, v, causal), rtol=0, atol=1e-12)


def outputs_and_grads(name, q, k, v, mask, causal):
    backend = ATTENTION.get(name)()
    out = backend.attend(q, k, v, mask, causal, 0.0)
    if not q.requires_grad:
        return out, None
    grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=DEVICE)
                                 .view(out.shape)).sum(), (q, k, v))
    return out, grads


def assert_same(name, got, want):
    assert torch.allclose(got[0], want[0], rtol=0, atol=1e-12), (name, (got[0] - want[0]).abs().max())
    for g, w in zip(got[1] or (), want[1] or ()):
        assert torch.allclose(g, w, rtol=0, atol=1e-11), name


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNABLE)
@pytest.mark.parametrize("prefixlm", [False, True])
def test_each_backend_equals_dense_on_packed_rows(name, prefixlm):
    """Each backend's own packed mask (built with and without gradients recorded) and attention
    give dense's outputs, and, where it trains here, its gradients with respect to q, k, v."""
    seg, prefix = packed_rows()
    prefix = prefix if prefixlm else None
    grad = trains_here(name)
    q, k, v = qkv(24, grad=grad)
    dense = ATTENTION.get("dense")()
    want = outputs_and_grads("dense", q, k, v, dense.packed_mask(seg, prefix, torch.float64), False)
    with torch.set_grad_enabled(grad):
        mask = ATTENTION.get(name)().packed_mask(seg, prefix, torch.float64)
    assert_same(name, outputs_and_grads(name, q, k, v, mask, False), want)
    with torch.no_grad():
        mask = ATTENTION.get(name)().packed_mask(seg, prefix, torch.float64)
        assert torch.allclose(ATTENTION.get(name)().attend(q, k, v, mask, False, 0.0), want[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", RUNNABLE)
def test_each_backend_equals_dense_on_plain_rows(name):
    """Causal rows (no mask), an explicit bool mask (B, 1, T, S), its additive form, and one
    query over a cache of 20 keys with a mask of the keys it may see."""
    grad = trains_here(name)
    q, k, v = qkv(16, grad=grad)
    assert_same(name, outputs_and_grads(name, q, k, v, None, True), outputs_and_grads("dense", q, k, v, None, True))
    g = torch.Generator().manual_seed(1)
    allowed = (torch.rand(3, 1, 16, 16, generator=g) < 0.6).to(DEVICE) | torch.eye(16, dtype=torch.bool, device=DEVICE)
    additive = torch.zeros(allowed.shape, dtype=torch.float64, device=DEVICE).masked_fill(~allowed, float("-inf"))
    for mask in (allowed, additive):
        assert_same(name, outputs_and_grads(name, q, k, v, mask, False), outputs_and_grads("dense", q, k, v, mask, False))
    q, k, v = qkv(1, 20, seed=2, grad=grad)
    seen = (torch.rand(3, 1, 1, 20, generator=g) < 0.7).to(DEVICE)
    seen[..., -1] = True
    assert_same(name, outputs_and_grads(name, q, k, v, seen, False), outputs_and_grads("dense", q, k, v, seen, False))


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNABLE)
@pytest.mark.parametrize("prefixlm", [False, True])
def test_the_model_under_each_backend_equals_dense(name, prefixlm):
    seg, prefix = packed_rows()
    model = tiny_model(dtype=torch.float64, vocab_size=61, max_seq_len=24).to(DEVICE)
    tokens = torch.randint(0, 61, seg.shape, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    pos = torch.zeros_like(seg)
    for r in range(3):
        for s in seg[r].unique().tolist():
            where = (seg[r] == s).nonzero()[:, 0]
            pos[r, where] = torch.arange(len(where), device=DEVICE)
    logits = {}
    for impl in ("dense", name):
        model.attention_impl = impl
        assert model.packed_attention(tokens.device) == impl
        with torch.no_grad():
            logits[impl] = model(tokens, segment_ids=seg, prefix_mask=prefix if prefixlm else None, position_ids=pos,
                                 all_logits=True)
    assert torch.allclose(logits[name], logits["dense"], rtol=0, atol=1e-10)


def test_the_key_takes_its_choices_from_the_registry():
    assert choices() == ("auto",) + ATTENTION.names() and {"sdpa", "flex", "dense"} <= set(ATTENTION.names())
    key = FINETUNE_T0.keys["attention_impl"]
    assert key.choices == choices() and key.default == "auto"
    for name in ATTENTION.names():
        assert f"{name} (" in key.help  # each backend's own words in --help
    assert resolve("auto", "cpu") == "sdpa" and resolve("dense", "cuda") == "dense"
    flex_runs = ATTENTION.get("flex")().problem(0.0) is None
    assert resolve("auto", "cuda") == ("flex" if flex_runs else "sdpa") and resolve("auto", "cuda", 0.1) == "sdpa"
    with pytest.raises(ValueError, match="attention_impl must be one of auto, "):
        resolve("nope", "cpu")
    with pytest.raises(UserError, match="unknown attention backend 'dens'.*did you mean 'dense'"):
        ATTENTION.get("dens")


def test_the_training_rule_asks_the_backend():
    """finetune_t0.py's rule: flex trains on CUDA only and without dropout (its one-line
    errors); sdpa and dense train anywhere; auto always."""
    for name in ("auto", "sdpa", "dense"):
        check_attention_impl({"attention_impl": name, "device": "cpu", "dropout": 0.1})
    with pytest.raises(UserError, match=r"attention_impl=flex trains on CUDA only \(torch .* no FlexAttention backward on cpu\)"):
        check_attention_impl({"attention_impl": "flex", "device": "cpu", "dropout": 0.0})
    if ATTENTION.get("flex")().problem(0.0) is None:
        with pytest.raises(UserError, match=r"attention_impl=flex has no attention dropout \(dropout=0.1\)"):
            check_attention_impl({"attention_impl": "flex", "device": "cuda:0", "dropout": 0.1})
