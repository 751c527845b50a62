"""The fused head + cross-entropy (tinylab.nn.fused_head.linear_cross_entropy) in every mode: fp32, CPU bf16 /
fp16 autocast and torch.compile, against the plain head (F.linear + F.cross_entropy, what
`model(x, y)` computes); and that it never allocates a (tokens, vocab) tensor.
(fp64 exactness, weights and ignored targets: tests/model/test_model.py.)"""
import pytest
import torch
from conftest import tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from tinylab.nn import fused_head

# tiny shapes, where an (N, V) tensor would be the biggest one in sight: N = 48 tokens > dim = 32,
# V = 257 > the SwiGLU width (96)
V = 257
X = torch.randint(0, V, (3, 16), generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, V, (3, 16), generator=torch.Generator().manual_seed(2))
Y[0, :4] = -1  # ignored targets
N = X.numel()


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    # 7 rows per chunk: several chunks and a ragged last one
    monkeypatch.setattr(fused_head, "_head_chunk_rows", lambda vocab: 7)


def tiny(**kw):
    return tiny_model(dim=32, n_layers=2, n_heads=4, vocab_size=V, multiple_of=16, max_seq_len=16, **kw).train()


def loss_and_grads(m, fused, autocast=None, loss_weights=None, call=None, scale=1.0):
    """(loss, [grad of every parameter]) of one forward + backward, plain or fused head; `scale`
    multiplies the loss before backward and divides the gradients after (as GradScaler)."""
    m.zero_grad()
    ctx = torch.autocast("cpu", dtype=autocast) if autocast else torch.autocast("cpu", enabled=False)
    with ctx:
        (m if call is None else call)(X, Y, loss_weights=loss_weights, return_logits=not fused)
    loss = m.last_loss
    (loss * scale).backward()
    return loss.detach(), [p.grad / scale for p in m.parameters()]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def max_rel(grads, ref):
    return max(rel(g, r) for g, r in zip(grads, ref))


@pytest.mark.parametrize("tie", [True, False])
def test_fp32_matches_plain_head(tie):
    m = tiny(tie_embeddings=tie)
    ref_loss, ref = loss_and_grads(m, fused=False)
    loss, grads = loss_and_grads(m, fused=True)
    assert loss.dtype == torch.float32 and abs(loss.item() - ref_loss.item()) < 1e-6
    assert max_rel(grads, ref) < 1e-5


@pytest.mark.parametrize("tie", [True, False])
def test_bf16_autocast_matches_plain_head(tie):
    """Under CPU bf16 autocast the fused head casts as autocast casts F.linear (h and W to bf16,
    logits rounded to bf16) and computes the loss in fp32, as autocast's cross_entropy. The
    gradients are rounded at other points (the softmax instead of softmax - onehot; the weight
    gradient summed over chunks in fp32), so they agree with the plain head to bf16 precision:
    within 2% (relative norm), and no farther from the fp32 gradients than the plain head's are
    (x1.5)."""
    m = tiny(tie_embeddings=tie)
    _, fp32 = loss_and_grads(m, fused=False)
    plain_loss, plain = loss_and_grads(m, fused=False, autocast=torch.bfloat16)
    loss, grads = loss_and_grads(m, fused=True, autocast=torch.bfloat16)
    assert loss.dtype == plain_loss.dtype == torch.float32
    assert abs(loss.item() - plain_loss.item()) < 1e-3 * plain_loss.item()
    assert max_rel(grads, plain) < 2e-2
    assert max_rel(grads, fp32) < 1.5 * max_rel(plain, fp32)
    # it is the bf16 computation, not the fp32 one (which would be ~1e-6 away)
    assert max_rel(grads, fp32) > 1e-4


def test_bf16_weights_match_plain_head():
    """A bf16 model without autocast (FSDP2's bf16 parameters): the matmuls in bf16 as F.linear's,
    the loss in fp32 and returned in bf16; within bf16 precision of the plain head."""
    m = tiny(tie_embeddings=False)
    _, fp32 = loss_and_grads(m, fused=False)
    m.to(torch.bfloat16)
    plain_loss, plain = loss_and_grads(m, fused=False)
    loss, grads = loss_and_grads(m, fused=True)
    assert loss.dtype == torch.bfloat16 and abs(loss.item() - plain_loss.item()) <= 0.01 * plain_loss.item()
    assert max_rel(grads, plain) < 2e-2 and max_rel(grads, fp32) < 1.5 * max_rel(plain, fp32)


def test_fp16_autocast_keeps_tiny_loss_weights():
    """fp16 autocast with a loss scale (GradScaler's mode) and per-token weights of 1e-6: the
    fused head computes its gradients in the forward pass, before the loss scale, and the weight
    gradient's rows (h_i * w_i / z_i, ~1e-9) lie below fp16's range, so it scales them by their
    largest before the fp16 matmul and back in the fp32 sum: the gradients stay within fp16
    precision of the fp32 ones, as the plain head's do."""
    m = tiny(tie_embeddings=False)
    w = torch.full(X.shape, 1e-6) * (Y >= 0)
    _, fp32 = loss_and_grads(m, fused=False, loss_weights=w)
    _, plain = loss_and_grads(m, fused=False, autocast=torch.float16, loss_weights=w, scale=2.0**24)
    _, grads = loss_and_grads(m, fused=True, autocast=torch.float16, loss_weights=w, scale=2.0**24)
    assert max_rel(plain, fp32) < 5e-3 and max_rel(grads, fp32) < 5e-3


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op returns (also inside the custom operator)."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_no_tokens_by_vocab_tensor(autocast):
    """Forward and backward of the fused head allocate nothing of N x V elements (the plain head
    does: that the check sees it is checked too); the largest tensor is a weight or its gradient."""
    m = tiny()
    sizes = {}
    for fused in (False, True):
        with LargestTensor() as seen:
            loss_and_grads(m, fused, autocast)
        sizes[fused] = seen.numel
    assert sizes[False] >= N * V
    assert sizes[True] == m.output.weight.numel() < N * V  # the weight's gradient


def graph_inspector(found):
    """An aot_autograd backend that runs the graphs eagerly and records, for the forward and the
    backward graph, whether the fused operator is in it and the largest tensor it makes."""
    from torch._dynamo.backends.common import aot_autograd

    def inspect(gm, example_inputs):
        nodes = list(gm.graph.nodes)
        vals = [n.meta.get("val") for n in nodes]
        found.append({"fused": any("tinylab.linear_cross_entropy" in str(n.target) for n in nodes),
                      "numel": max((v.numel() for v in vals if isinstance(v, torch.Tensor)), default=0)})
        return gm

    return aot_autograd(fw_compiler=inspect, bw_compiler=inspect)


@pytest.mark.slow
@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_compile_fullgraph(autocast):
    """torch.compile(fullgraph=True) traces the model with the fused head as one custom operator:
    no graph break, the operator in the forward graph, no N x V tensor in either graph, and the
    eager fused head's loss and gradients."""
    torch._dynamo.reset()
    m = tiny()
    ref_loss, ref = loss_and_grads(m, fused=True, autocast=autocast)
    found = []
    compiled = torch.compile(m, backend=graph_inspector(found), fullgraph=True)
    loss, grads = loss_and_grads(m, fused=True, autocast=autocast, call=compiled)
    assert len(found) == 2 and found[0]["fused"]
    assert all(0 < g["numel"] < N * V for g in found)
    assert abs(loss.item() - ref_loss.item()) < 1e-6 and max_rel(grads, ref) < 1e-5
    explained = torch._dynamo.explain(m)(X, Y, return_logits=False)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()


@pytest.mark.slow
def test_compile_inductor_matches_plain_head():
    """The default backend (inductor: generated C++ kernels around the operator), fp32: the plain
    head's loss and gradients. ~30 s of compilation on a 2-core machine."""
    torch._dynamo.reset()
    m = tiny()
    ref_loss, ref = loss_and_grads(m, fused=False)
    loss, grads = loss_and_grads(m, fused=True, call=torch.compile(m, fullgraph=True))
    assert abs(loss.item() - ref_loss.item()) < 1e-6 and max_rel(grads, ref) < 1e-5
    torch._dynamo.reset()
