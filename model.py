"""The one model of tinystories-lab: the Llama-2 architecture as in karpathy/llama2.c.

Token embedding (tied with the output head by default), pre-norm RMSNorm blocks, rotary position
embeddings in llama2.c's interleaved-pair layout, grouped-query attention through
F.scaled_dot_product_attention, and a SwiGLU feed-forward with llama2.c's hidden-size rule.
Parameter names are llama2.c's, so its `ckpt.pt` files load unchanged.

Additions over llama2.c, each needed by a driver:
  - `attn_mask` / `position_ids` in forward: left-padded generation prompts, any explicit mask;
  - `segment_ids` / `prefix_mask` in forward: packed sequences and prefix-LM (finetune_t0.py),
    the mask built inside (FlexAttention's block mask or an SDPA mask; `attention_impl`);
  - `loss_weights` in forward: per-token loss weights (target-only T0 losses);
  - `generate` with a KV cache (generation evaluations sample hundreds of tokens), its one-token
    steps through `_decode_step` on the CPU (the blocks without the modules, oneDNN's packed
    products in fp32 and bf16);
  - `hidden_states` (per-layer linear probes), `num_params`, `flops_per_token`, `estimate_mfu`;
  - an optional untied output head (`tie_embeddings=False`; HF import/export and growth).
"""
import math
from dataclasses import dataclass, fields
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

try:  # FlexAttention (torch >= 2.5): packed rows' block-sparse attention without a dense mask
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:
    BlockMask = create_block_mask = flex_attention = None


@dataclass
class ModelArgs:
    # defaults are llama2.c's (Llama 2 7B); configs always set the small shapes explicitly
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: Optional[int] = None
    vocab_size: int = 32000
    hidden_dim: Optional[int] = None
    multiple_of: int = 256  # SwiGLU hidden layer size is a multiple of this
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    dropout: float = 0.0
    tie_embeddings: bool = True
    rope_theta: float = 10000.0

    @classmethod
    def from_dict(cls, d):
        """Build from a checkpoint's `model_args`, ignoring keys this version does not know."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def ffn_hidden_dim(self):
        """llama2.c's rule: 2/3 of 4*dim, rounded up to a multiple of `multiple_of`."""
        if self.hidden_dim is not None:
            return self.hidden_dim
        hidden = int(2 * (4 * self.dim) / 3)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def kv_heads(self):
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


def _compute_dtype(x):
    # half precision is upcast for the numerically sensitive parts; fp32 / fp64 stay as they are
    # (the growth tests compare losses in fp64 to 1e-10)
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x, weight, eps):
    xf = x.to(_compute_dtype(x))
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return out.type_as(x) * weight


def precompute_freqs_cis(head_dim: int, end: int, theta: float = 10000.0):
    """cos/sin tables (end, head_dim/2) for RoPE; computed in fp64, stored in fp32."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64)[: head_dim // 2] / head_dim))
    angles = torch.outer(torch.arange(end, dtype=torch.float64), freqs)
    return torch.cos(angles).float(), torch.sin(angles).float()


def apply_rotary_emb(xq, xk, cos, sin):
    """Rotate interleaved pairs (x[2i], x[2i+1]) by position-dependent angles (llama2.c layout).

    xq, xk: (B, T, heads, head_dim); cos, sin: broadcastable to (B, T, 1, head_dim/2).
    """
    rotation = rope_rotation(cos, sin, _compute_dtype(xq))
    return rotate_pairs(xq, rotation), rotate_pairs(xk, rotation)


def rope_rotation(cos, sin, dtype):
    return torch.complex(cos.to(dtype), sin.to(dtype))


def rotate_pairs(x, rotation):
    """x (..., head_dim) with each pair (x[2i], x[2i+1]) taken as the complex number
    x[2i] + i*x[2i+1] and multiplied by rotation (broadcastable to (..., head_dim/2)): one
    elementwise kernel forward and backward (3x faster than real arithmetic)."""
    pairs = torch.view_as_complex(x.to(_compute_dtype(x)).reshape(x.shape[:-1] + (-1, 2)))
    return torch.view_as_real(pairs * rotation).flatten(-2).type_as(x)


def _head_chunk_rows(vocab_size):
    # ~4M logits (16 MB in fp32) per chunk, and at least 1024 rows: the weight gradient's product
    # has the chunk's rows as its inner dimension and ran 2x slower with 131 rows (vocab 32000,
    # dim 288, CPU) than with 1024-2048; at vocab 8192, 512-2048 rows time the same
    return max(1024, (1 << 22) // vocab_size)


def _chunked_cross_entropy(h, weight, targets, token_weights, need_h, need_w, mm):
    """(sum_i w_i * cross_entropy(h_i @ W.T, t_i), d/dh, d/dW), chunk by chunk of rows; the
    gradients only when asked (None otherwise).

    mm: the dtype of the three matmuls (_matmul_dtype). The softmax, the loss and the gradients'
    sums are in the compute dtype (fp32 for half precision), as autocast runs cross_entropy."""
    dt = _compute_dtype(h)
    grad_h = torch.empty(h.shape, dtype=dt, device=h.device) if need_h else None
    grad_w = torch.zeros(weight.shape, dtype=dt, device=h.device) if need_w else None
    loss = torch.zeros((), dtype=dt, device=h.device)
    w_mat = weight.to(mm)
    rows = _head_chunk_rows(weight.shape[0])
    for s in range(0, h.shape[0], rows):
        h_mm, tc, wc = h[s:s + rows].to(mm), targets[s:s + rows], token_weights[s:s + rows]
        hc = h_mm.to(dt)  # the rows as the matmuls see them (rounded to mm)
        e = (h_mm @ w_mat.t()).to(dt)  # the logits, rounded to mm as F.linear's would be
        target_logit = e.gather(1, tc[:, None]).squeeze(1)
        m = e.amax(dim=1)
        e.sub_(m[:, None]).exp_()  # e = exp(logits - max): the unnormalised softmax
        z = e.sum(dim=1)
        loss += ((m + z.log() - target_logit) * wc).sum()
        if need_h or need_w:
            # d loss / d logits = w * (softmax - onehot); the row scale w / z is applied to
            # the (rows, dim) side of each product instead of the (rows, vocab) side
            r = (wc / z)[:, None]
            e_mm = e.to(mm)  # in [0, 1]: safe in half precision
            if need_h:
                gh = torch.mm(e_mm, w_mat).to(dt).mul_(r)
                grad_h[s:s + rows] = gh.sub_(w_mat[tc].to(dt) * wc[:, None])
            if need_w:
                if mm == dt:
                    grad_w.addmm_(e.t(), hc * r)
                else:
                    # the row scales (~ 1 / tokens) divided by their largest, so that the rows stay
                    # in fp16's range, and multiplied back in the fp32 sum
                    scale = r.amax().clamp_min(torch.finfo(dt).tiny)
                    grad_w.addcmul_(torch.mm(e_mm.t(), (hc * (r / scale)).to(mm)), scale)
                grad_w.index_add_(0, tc, hc * wc[:, None], alpha=-1)
    return loss, grad_h, grad_w


# The fused head as a custom operator: torch.compile keeps it as one opaque call (no graph break,
# and no unrolling of the chunk loop into the graph), and its autograd formula is the gradients
# computed in the forward pass, scaled by the incoming gradient. The casts are explicit
# (mm_dtype: _matmul_dtype), so autocast is switched off inside.
@torch.library.custom_op("tinylab::linear_cross_entropy", mutates_args=())
def _fused_head(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, token_weights: torch.Tensor,
                need_h: bool, need_w: bool, mm_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with torch.autocast(h.device.type, enabled=False):
        loss, grad_h, grad_w = _chunked_cross_entropy(h, weight, targets, token_weights, need_h, need_w, mm_dtype)
    # an operator returns tensors (distinct ones): empty = not computed
    return tuple(h.new_empty(0, dtype=loss.dtype) if g is None else g for g in (loss, grad_h, grad_w))


@_fused_head.register_fake
def _(h, weight, targets, token_weights, need_h, need_w, mm_dtype):
    dt = _compute_dtype(h)
    return (h.new_empty((), dtype=dt), h.new_empty(h.shape if need_h else (0,), dtype=dt),
            h.new_empty(weight.shape if need_w else (0,), dtype=dt))


def _fused_head_setup(ctx, inputs, output):
    h, weight, _, _, need_h, need_w, _ = inputs
    ctx.save_for_backward(output[1], output[2])
    ctx.need, ctx.dtypes = (need_h, need_w), (h.dtype, weight.dtype)


def _fused_head_backward(ctx, grad_loss, *_):
    grad_h, grad_w = ctx.saved_tensors
    gh = (grad_h * grad_loss).to(ctx.dtypes[0]) if ctx.need[0] else None
    gw = (grad_w * grad_loss).to(ctx.dtypes[1]) if ctx.need[1] else None
    return gh, gw, None, None, None, None, None


_fused_head.register_autograd(_fused_head_backward, setup_context=_fused_head_setup)


def _matmul_dtype(x):
    """The dtype F.linear multiplies `x` in: autocast's (which never casts fp64), else x's own."""
    device = x.device.type
    if x.dtype != torch.float64 and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def linear_cross_entropy(h, weight, targets, loss_weights=None):
    """sum_i w_i * cross_entropy(h_i @ W.T, t_i) without materialising the (N, vocab) logits.

    The training loss only needs the logits' softmax, so the head matmul, the loss and both
    gradients are computed together chunk by chunk of rows in the forward pass (the gradients
    are kept and scaled by the incoming gradient in backward). Compared with `F.linear` +
    `F.cross_entropy` this saves the (N, vocab) logits and log-softmax tensors (134 MB each at
    4096 tokens x 8192 vocab) and most of the passes over them. The matmuls run in the dtype
    F.linear would use (autocast's, or half-precision inputs' own) and the loss in fp32, as
    autocast's cross_entropy; under torch.compile it is one custom operator.

    h (N, dim), weight (vocab, dim), targets (N,) with -1 ignored. Returns the mean loss over
    non-ignored targets (as F.cross_entropy(ignore_index=-1)), or with `loss_weights` (N,) the
    weighted sum of per-token losses (the targets of zero-weight tokens may be -1).
    """
    if loss_weights is None:
        valid = targets != -1
        loss_weights = valid.to(_compute_dtype(h)) / valid.sum()
    targets, loss_weights = targets.clamp_min(0), loss_weights.to(_compute_dtype(h))
    grad = torch.is_grad_enabled()  # evaluation computes no gradients
    loss = _fused_head(h, weight, targets, loss_weights, grad and h.requires_grad, grad and weight.requires_grad,
                       _matmul_dtype(h))[0]
    return loss.to(h.dtype)


# Below this many rows an inference-time product on the CPU is computed as (W @ x^T)^T.
FEW_ROWS = 64


def linear(module: nn.Linear, x):
    """module(x) for a bias-free nn.Linear. A few rows on the CPU without autograd (a decoding
    step: one token for each of B rows) are multiplied as (W @ x^T)^T: MKL splits x @ W^T with
    M = B rows over the cores poorly and W @ x^T (M = out_features) well. At 16 rows and two
    threads the 8192-piece head is 2-3x faster, the trunk's products 10-25%; the result is the
    same to a few ulps (bit for bit at 1 and 16-256 rows in the measurements). Training, evaluation
    batches and other devices use module(x)."""
    if x.device.type != "cpu" or torch.is_grad_enabled() or x.numel() > FEW_ROWS * x.shape[-1]:
        return module(x)
    w = module.weight
    return torch.mm(w, x.reshape(-1, x.shape[-1]).t()).t().contiguous().view(x.shape[:-1] + (w.shape[0],))


def _onednn_products():
    """Whether oneDNN's packed-weight linear is there and on (torch built with mkldnn, not
    switched off by torch.backends.mkldnn.flags(enabled=False))."""
    return (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class FewRowProducts:
    """x @ W^T for the B rows of a one-token decoding step (CPU, no autograd), W given as a
    (out, in) weight, or a tuple of weights with the same `in` multiplied as one (their outputs
    side by side: q, k, v, or w1 and w3), and x as (B, in); returns (B, out), possibly a
    transposed view.

    A tuple is concatenated once per cache: one product for wq, wk, wv and one for w1, w3 take
    4 calls a layer instead of 7, the head and the trunk of a 16-row step of the 8M shape 8-21%
    less than separate products (in a loop over its weights); each output's sum runs over `in`
    in the same order either way (tests/model/test_model.py holds them equal bit for bit). In fp32
    and bf16 the weights are packed once per KV cache for oneDNN, whose few-row products beat
    MKL's on some hosts (at 16 rows and 2 threads the 8192-piece head took 0.77 ms against
    1.45 ms in fp32) and match them on others. In fp32 the sums run in another order than
    MKL's, so the logits differ from the modules' in the last bits (about 1e-6 relative);
    bf16's came out the same. fp64 (which oneDNN lacks), a torch without it, or mkldnn switched
    off multiply as `linear` does, W @ x^T, the modules' own products bit for bit, and so does a
    step under CPU autocast (torch.mm's cast). A weight changed in place between steps (its
    version counter moved) is concatenated and packed again; the copies live as long as the
    cache."""

    def __init__(self, rows: int, dtype):
        self.rows = rows
        self.onednn = dtype in (torch.float32, torch.bfloat16) and _onednn_products()
        self.prepared = {}  # ids of the weights -> their entry (_prepare)

    def _prepare(self, weights, onednn):
        """The weights' entry: their concatenation and, once oneDNN is asked for, its packed
        copy; made again when a weight's version counter has moved."""
        key, versions = tuple(id(w) for w in weights), tuple(w._version for w in weights)
        entry = self.prepared.get(key)
        if entry is None or entry["versions"] != versions:
            # the weights are kept so that their ids stay theirs while the entry lives
            entry = {"weights": weights, "versions": versions, "packed": None,
                     "whole": weights[0] if len(weights) == 1 else torch.cat(weights)}
            self.prepared[key] = entry
        if onednn and entry["packed"] is None:
            entry["packed"] = torch.ops.mkldnn._reorder_linear_weight(entry["whole"], self.rows)
        return entry

    def __call__(self, weights, x):
        weights = weights if isinstance(weights, tuple) else (weights,)
        # under CPU autocast torch.mm casts to the autocast dtype itself (oneDNN's op would not)
        onednn = self.onednn and x.dtype == weights[0].dtype and not torch.is_autocast_enabled("cpu")
        entry = self._prepare(weights, onednn)
        if onednn:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), entry["packed"], None, "none", [], "")
        return torch.mm(entry["whole"], x.t()).t()  # linear's few-row product, left as a transposed view


def _sampling_dtype(device):
    # fp64 where the device has it (MPS has no float64)
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def _uniforms(n, device, generator):
    return torch.rand(n, 1, dtype=_sampling_dtype(device), device=device, generator=generator)


def sample_tokens(probs, generator=None):
    """One token per row of `probs` (B, V), (B, 1) long: the first index whose cumulative
    probability exceeds u * (the row's total), u one uniform draw per row from `generator`.

    Inverting the CDF takes B draws where torch.multinomial takes one exponential per entry
    (B * V: 3.3 ms of a 16-row decoding step at vocabulary 8192 on the CPU, against 0.2 ms
    here). The CDF is summed in fp64 (an fp32 running sum over 32000 entries drifts by ~1e-5,
    more than a rare token's probability); an entry of probability 0 is never drawn."""
    cdf = probs.to(_sampling_dtype(probs.device)).cumsum(-1)
    u = _uniforms(probs.shape[0], probs.device, generator)
    total = cdf[:, -1:].contiguous()
    # u * total may round up to total itself: then the last entry of nonzero probability
    last = torch.searchsorted(cdf, total)
    return torch.minimum(torch.searchsorted(cdf, u * total, right=True), last)


class KVCache:
    """Preallocated keys/values of every layer for incremental decoding, kept in a ring of
    `capacity` slots: the i-th position written goes to slot i % capacity, so a context window
    that slides past `capacity` overwrites its oldest positions instead of growing.

    `length` counts the positions written so far. `key_valid` (B, capacity) is the caller's mask
    of which slots each row may attend to (generate keeps it: padding, the window's start).
    """

    def __init__(self, args: ModelArgs, batch_size: int, capacity: int, device, dtype):
        head_dim = args.dim // args.n_heads
        shape = (args.n_layers, batch_size, args.kv_heads(), capacity, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.key_valid = torch.ones(batch_size, capacity, dtype=torch.bool, device=device)
        self.capacity = capacity
        self.length = 0
        self.decodes_fast = None  # Transformer._decodes_fast, decided at the first one-token step
        self.products = None  # its FewRowProducts (packed weights), made with that decision

    def filled(self, new=0):
        """Slots holding a position once `new` more are written (all of them after a wrap)."""
        return min(self.length + new, self.capacity)

    def update(self, layer_id: int, k, v):
        """Store k, v (B, kv_heads, T, hd) at the next slots; return every filled slot. Several
        positions at once (a prefill) must fit before the ring's end."""
        start = self.length % self.capacity
        end = start + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"{k.shape[2]} new positions at slot {start} overrun a KV cache of {self.capacity}")
        self.k[layer_id, :, :, start:end] = k
        self.v[layer_id, :, :, start:end] = v
        n = self.filled(k.shape[2])
        return self.k[layer_id, :, :, :n], self.v[layer_id, :, :, :n]

    def copy_rows(self, rows, slots, other: "KVCache"):
        """Put all of `other`'s positions (every layer) into rows `rows`, slots `slots` of this
        cache: (n,) and (other.length,) long tensors."""
        r, s = rows[:, None], slots[None, :]
        # advanced indices split by a slice: the result's dims are (rows, slots, layer, head, hd)
        self.k[:, r, :, s] = other.k[:, :, :, :other.length].permute(1, 3, 0, 2, 4)
        self.v[:, r, :, s] = other.v[:, :, :, :other.length].permute(1, 3, 0, 2, 4)


# ---------------------------------------------------------------------- packed rows' attention

# how packed rows (segment_ids) attend: auto = flex on CUDA, sdpa elsewhere (Transformer.attention_impl)
ATTENTION_IMPLS = ("auto", "sdpa", "flex")


def additive_mask(allowed, dtype):
    """A bool attention mask (True = may attend) as SDPA's additive float mask: 0 or -inf."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, zero - float("inf"))


def _document_rule(seg_q, seg_k, q, k, inp_q=None, inp_k=None):
    """May query q attend to key k? Same segment, and k <= q or (prefix-LM) both are input
    tokens; padding (segment 0) attends to itself only, so no softmax row is empty. The one
    definition, for the dense mask (broadcast tensors) and FlexAttention's mask_mod (scalars)."""
    allowed = k <= q
    if inp_q is not None:
        allowed = allowed | (inp_q & inp_k)
    return (seg_q == seg_k) & allowed & ((seg_q != 0) | (q == k))


def document_mask(segment_ids, prefix_mask=None):
    """Dense bool (B, T, T) mask of packed rows, True = may attend. segment_ids (B, T): 1, 2, ...
    per example of a row, 0 on padding; prefix_mask (B, T) bool: the input tokens (prefix-LM),
    None = causal."""
    seg, t = segment_ids, torch.arange(segment_ids.shape[-1], device=segment_ids.device)
    inp = () if prefix_mask is None else (prefix_mask[:, :, None], prefix_mask[:, None, :])
    return _document_rule(seg[:, :, None], seg[:, None, :], t[:, None], t[None, :], *inp)


def document_block_mask(segment_ids, prefix_mask=None):
    """The same rule as FlexAttention's BlockMask (blocks of 128 x 128 that no query of the block
    may attend to are skipped), shared by every layer and head."""
    seg, inp = segment_ids, prefix_mask
    if inp is None:
        def mask_mod(b, h, q, k):
            return _document_rule(seg[b, q], seg[b, k], q, k)
    else:
        def mask_mod(b, h, q, k):
            return _document_rule(seg[b, q], seg[b, k], q, k, inp[b, q], inp[b, k])
    B, T = seg.shape
    return create_block_mask(mask_mod, B, None, T, T, device=seg.device)


_compiled_flex = None


def _flex_attention(q, k, v, block_mask, enable_gqa):
    # the fused kernel is torch.compile's: compiled here unless the whole model already is. The
    # CPU runs the eager (unfused) version: torch 2.13 has no FlexAttention backward there, and
    # its compiled CPU kernel takes float32 only and failed to build for a second shape
    global _compiled_flex
    fn = flex_attention
    if q.device.type != "cpu" and not torch.compiler.is_compiling():
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention)
        fn = _compiled_flex
    return fn(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.n_heads = args.n_heads
        self.n_kv_heads = args.kv_heads()
        assert args.dim % args.n_heads == 0, "dim must be divisible by n_heads"
        assert args.n_heads % self.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads"
        self.head_dim = args.dim // args.n_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.resid_dropout = nn.Dropout(args.dropout)
        self.dropout = args.dropout

    def forward(self, x, cos, sin, attn_mask=None, kv_cache: Optional[KVCache] = None):
        bsz, seqlen, _ = x.shape
        xq = linear(self.wq, x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = linear(self.wk, x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = linear(self.wv, x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, cos, sin)
        # (B, heads, T, head_dim)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        if kv_cache is not None:
            xk, xv = kv_cache.update(self.layer_id, xk, xv)
        if BlockMask is not None and isinstance(attn_mask, BlockMask):
            # packed rows through FlexAttention (Transformer._packed_mask); it shares kv heads itself
            out = _flex_attention(xq, xk, xv, attn_mask, self.n_rep > 1)
        else:
            if self.n_rep > 1:
                # expand kv heads to match query heads (GQA); head h uses kv head h // n_rep
                xk = xk.repeat_interleave(self.n_rep, dim=1)
                xv = xv.repeat_interleave(self.n_rep, dim=1)
            if attn_mask is None and seqlen > 1 and xk.shape[2] != seqlen:
                raise ValueError("several new tokens over a non-empty KV cache need an explicit attn_mask")
            out = F.scaled_dot_product_attention(
                xq, xk, xv,
                attn_mask=attn_mask,
                dropout_p=self.dropout if self.training else 0.0,
                # no mask: causal; a single new query over the cache may see every cached key
                is_causal=attn_mask is None and seqlen > 1,
            )
        out = out.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.resid_dropout(linear(self.wo, out))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, dropout: float):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)  # gate
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)  # down (output) projection
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)  # up
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(linear(self.w2, F.silu(linear(self.w1, x)) * linear(self.w3, x)))


class TransformerBlock(nn.Module):
    # activation checkpointing (Transformer.activation_checkpointing): in training the block keeps
    # only its input and recomputes its activations in backward. It is applied inside forward, so
    # the module tree and the state_dict keys stay as they are and hooks on the block (FSDP2's
    # fully_shard) run outside the recomputed region.
    checkpointed = False

    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args, layer_id)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim(), args.dropout)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x, *args, **kwargs):
        if self.checkpointed and torch.is_grad_enabled():
            # the recomputation draws the same dropout masks: checkpoint restores the RNG state
            # for it (and puts the state after the forward pass back afterwards)
            return torch.utils.checkpoint.checkpoint(self._forward, x, *args, use_reentrant=False, **kwargs)
        return self._forward(x, *args, **kwargs)

    def _forward(self, x, cos, sin, attn_mask=None, kv_cache=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, attn_mask, kv_cache)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    last_loss: Optional[torch.Tensor]

    def __init__(self, params: ModelArgs):
        super().__init__()
        self.params = params
        self.vocab_size = params.vocab_size
        self.n_layers = params.n_layers
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.dropout = nn.Dropout(params.dropout)
        self.layers = nn.ModuleList(TransformerBlock(i, params) for i in range(params.n_layers))
        self.norm = RMSNorm(params.dim, eps=params.norm_eps)
        self.output = nn.Linear(params.dim, params.vocab_size, bias=False)
        if params.tie_embeddings:
            # weight tying (https://paperswithcode.com/method/weight-tying), as llama2.c
            self.tok_embeddings.weight = self.output.weight
        cos, sin = precompute_freqs_cis(params.dim // params.n_heads, params.max_seq_len, params.rope_theta)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

        self.apply(self._init_weights)
        # GPT-2 style scaled init of the residual output projections. llama2.c scales `w3` (an
        # input projection of SwiGLU) instead of `w2`; we scale the real output projections.
        for pn, p in self.named_parameters():
            if pn.endswith("attention.wo.weight") or pn.endswith("feed_forward.w2.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * params.n_layers))
        self.last_loss = None
        # how packed rows (segment_ids) attend, one of ATTENTION_IMPLS: a setting of the run that
        # finetune_t0.py sets (its `attention_impl` key), not of the model's shape
        self.attention_impl = "auto"

    @property
    def activation_checkpointing(self):
        """Per-block activation checkpointing (torch.utils.checkpoint, non-reentrant) in training:
        less memory for one more forward pass of the blocks. A setting of the run, not of the
        model's shape: the trainer sets it (the `activation_checkpointing` key); checkpoints and
        model_args do not record it."""
        return any(layer.checkpointed for layer in self.layers)

    @activation_checkpointing.setter
    def activation_checkpointing(self, on):
        for layer in self.layers:
            layer.checkpointed = bool(on)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                torch.nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ forward

    def _rope_tables(self, seqlen, position_ids, start):
        if position_ids is None:
            if start + seqlen > self.params.max_seq_len:
                raise ValueError(f"sequence of {start + seqlen} tokens exceeds max_seq_len={self.params.max_seq_len}")
            cos = self.freqs_cos[start:start + seqlen]
            sin = self.freqs_sin[start:start + seqlen]
            return cos[None, :, None, :], sin[None, :, None, :]
        # per-token positions (B, T): packed examples restart at 0, left-padded prompts shift
        return self.freqs_cos[position_ids][:, :, None, :], self.freqs_sin[position_ids][:, :, None, :]

    def packed_attention(self, device):
        """'flex' or 'sdpa': what packed rows on `device` run under self.attention_impl. auto =
        FlexAttention on CUDA (its compiled kernel skips the masked blocks); SDPA elsewhere (torch
        2.13 has no FlexAttention backward on the CPU) and with attention dropout (flex has none)."""
        impl, dropout = self.attention_impl, self.training and self.params.dropout > 0
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl must be one of {', '.join(ATTENTION_IMPLS)}, not {impl!r}")
        if impl == "auto":
            return "flex" if flex_attention is not None and device.type == "cuda" and not dropout else "sdpa"
        if impl == "flex" and (flex_attention is None or dropout):
            raise ValueError("attention_impl=flex needs torch >= 2.5 and no attention dropout "
                             f"(torch {torch.__version__}, dropout {self.params.dropout})")
        return impl

    def _packed_mask(self, segment_ids, prefix_mask, attn_mask, kv_cache):
        """Packed rows' mask, built once per forward and shared by every layer: a BlockMask (flex),
        or for sdpa a (B, 1, T, T) mask: additive, in the attention's dtype, when gradients are
        recorded (SDPA keeps the mask it is given for backward, and of a bool mask a float copy
        per layer), bool otherwise (a quarter of the memory; nothing is kept)."""
        if attn_mask is not None or kv_cache is not None:
            raise ValueError("segment_ids make the attention mask: pass no attn_mask or kv_cache with them")
        device = segment_ids.device
        if self.packed_attention(device) == "flex":
            return document_block_mask(segment_ids, prefix_mask)
        allowed = document_mask(segment_ids, prefix_mask)[:, None]
        if not torch.is_grad_enabled():
            return allowed
        dtype = self.tok_embeddings.weight.dtype
        if torch.is_autocast_enabled(device.type) and dtype == torch.float32:
            dtype = torch.get_autocast_dtype(device.type)
        return additive_mask(allowed, dtype)

    def _trunk(self, tokens, attn_mask=None, position_ids=None, kv_cache=None, collect=None,
               segment_ids=None, prefix_mask=None):
        """Embedding and all blocks; returns the final hidden states before the last norm."""
        start = kv_cache.length if kv_cache is not None else 0
        cos, sin = self._rope_tables(tokens.shape[1], position_ids, start)
        if segment_ids is not None:
            attn_mask = self._packed_mask(segment_ids, prefix_mask, attn_mask, kv_cache)
        elif attn_mask is not None and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(1)  # (B, T, S) -> (B, 1, T, S), shared by all heads
        h = self.dropout(self.tok_embeddings(tokens))
        for layer in self.layers:
            h = layer(h, cos, sin, attn_mask, kv_cache)
            if collect is not None:
                collect.append(h)
        if kv_cache is not None:
            kv_cache.length += tokens.shape[1]
        return h

    def forward(self, tokens, targets=None, attn_mask=None, position_ids=None,
                loss_weights=None, kv_cache=None, all_logits=False, return_logits=True,
                segment_ids=None, prefix_mask=None):
        """llama2.c convention: with `targets` return logits for every position and set
        `self.last_loss` (mean cross-entropy, targets of -1 ignored; with `loss_weights` the
        weighted *sum* of per-token losses instead); without targets return only the
        last position's logits unless `all_logits=True`.

        return_logits=False (the training loop, loss evaluations): only `last_loss` is wanted, so
        the head and the loss are fused (linear_cross_entropy) and None is returned.

        attn_mask: bool (B, T, S) or (B, 1, T, S), True = may attend; None means causal.
        position_ids: long (B, T) RoPE positions; None means 0..T-1 (offset by the KV cache).
        segment_ids: long (B, T), packed rows (instead of attn_mask): 1, 2, ... per example, 0 on
        padding; each example attends within itself, causally or, where prefix_mask (B, T) bool
        marks its input tokens, both ways among those (document_mask). The mask is built here
        per forward (attention_impl); pass the examples' own position_ids too.
        """
        if kv_cache is not None and tokens.shape[1] == 1 and targets is None and self._decodes_fast(kv_cache):
            return self._decode_step(tokens, attn_mask, position_ids, kv_cache)
        h = self.norm(self._trunk(tokens, attn_mask, position_ids, kv_cache, segment_ids=segment_ids, prefix_mask=prefix_mask))
        if targets is not None and not return_logits:
            self.last_loss = linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.output.weight,
                                                  targets.reshape(-1), None if loss_weights is None else loss_weights.reshape(-1))
            return None
        if targets is not None:
            logits = self.output(h)
            if loss_weights is None:
                self.last_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            else:
                ce = F.cross_entropy(logits.view(-1, logits.size(-1)).to(_compute_dtype(logits)), targets.reshape(-1).clamp_min(0), reduction="none")
                self.last_loss = (ce * loss_weights.reshape(-1).to(ce.dtype)).sum()
            return logits
        self.last_loss = None
        if all_logits:
            return self.output(h)
        return linear(self.output, h[:, [-1], :])  # inference: only the last position is needed

    # ------------------------------------------------------------------ one-token decoding

    def _decodes_fast(self, kv_cache):
        """Whether forward's one-token steps over `kv_cache` may run _decode_step: on the CPU
        for at most FEW_ROWS rows (where linear takes the same products), without autograd or
        dropout, with ordinary parameters (not FSDP2's sharded DTensors, which the blocks' hooks
        gather) and no hooks on the submodules (_decode_step calls none of them). Decided once
        per cache, except the per-call conditions."""
        if torch.is_grad_enabled() or (self.training and self.params.dropout > 0):
            return False
        if kv_cache.decodes_fast is None:
            hooked = any(m._forward_hooks or m._forward_pre_hooks for m in self.modules() if m is not self)
            rows = kv_cache.k.shape[1]
            kv_cache.decodes_fast = (kv_cache.k.device.type == "cpu" and rows <= FEW_ROWS and not hooked
                                     and not nn.modules.module._global_forward_hooks
                                     and not nn.modules.module._global_forward_pre_hooks
                                     and all(type(p.data) is torch.Tensor for p in self.parameters()))
        if kv_cache.decodes_fast and kv_cache.products is None:
            kv_cache.products = FewRowProducts(kv_cache.k.shape[1], self.output.weight.dtype)
        return kv_cache.decodes_fast

    def _decode_step(self, tokens, attn_mask, position_ids, cache):
        """forward for one new token per row over a KV cache (CPU, no autograd: _decodes_fast):
        the blocks' arithmetic, op for op, without the modules, every product through the
        cache's FewRowProducts (q, k, v as one, w1 and w3 as one). Where those are W @ x^T
        (fp64), the rows stay transposed, (features, B), from one product to the next unless the
        rotation needs them back (linear copies back after each product), and the logits are
        forward's bit for bit; in fp32 and bf16 oneDNN's packed products take their place
        (tests/model/test_model.py). At 16 rows of the 8M shape the step without the modules saves
        5-11% (the modules' calls and copies), the packed products another 15-18% on a host
        where oneDNN beats MKL, and the joint products of q, k, v and of w1, w3 2-10% of a
        whole generate."""
        p, B = self.params, tokens.shape[0]
        H, KV, hd = p.n_heads, p.kv_heads(), p.dim // p.n_heads
        product = cache.products
        cos, sin = self._rope_tables(1, position_ids, cache.length)  # (1 or B, 1, 1, hd/2)
        x = self.tok_embeddings(tokens[:, 0])  # (B, dim); no dropout (eval or dropout 0)
        rotation = rope_rotation(cos, sin, _compute_dtype(x)).view(-1, 1, hd // 2)  # q and k heads alike
        if attn_mask is not None:
            if attn_mask.dim() == 3:
                attn_mask = attn_mask.unsqueeze(1)  # (B, 1, S) -> (B, 1, 1, S), as _trunk
            # made additive once here, where SDPA would convert a bool mask in every layer (and
            # its kernel takes a float mask faster)
            if attn_mask.dtype == torch.bool:
                attn_mask = additive_mask(attn_mask, x.dtype)
        for layer in self.layers:
            a, f = layer.attention, layer.feed_forward
            h = rms_norm(x, layer.attention_norm.weight, layer.attention_norm.eps)
            qkv = product((a.wq.weight, a.wk.weight, a.wv.weight), h)
            qk = qkv[:, :(H + KV) * hd]
            qk = qk if qk.stride(1) == 1 else qk.contiguous()  # rows of the W @ x^T view
            qk = rotate_pairs(qk.view(B, H + KV, hd), rotation)
            keys, values = cache.update(layer.layer_id, qk[:, H:, None], qkv[:, (H + KV) * hd:].view(B, KV, 1, hd))
            if a.n_rep > 1:
                keys, values = keys.repeat_interleave(a.n_rep, dim=1), values.repeat_interleave(a.n_rep, dim=1)
            out = F.scaled_dot_product_attention(qk[:, :H, None], keys, values, attn_mask=attn_mask)
            x = x + product(a.wo.weight, out.transpose(1, 2).reshape(B, H * hd))
            h = rms_norm(x, layer.ffn_norm.weight, layer.ffn_norm.eps)
            w13, hidden = product((f.w1.weight, f.w3.weight), h), f.w1.weight.shape[0]
            gated = F.silu(w13[:, :hidden]) * w13[:, hidden:]
            # w2 takes the rows contiguous: MKL's fp64 product of the transposed view, a
            # contiguous (hidden, B), differs in the last bit from linear's
            x = x + product(f.w2.weight, gated.contiguous())
        cache.length += 1
        h = rms_norm(x, self.norm.weight, self.norm.eps)
        return product(self.output.weight, h).contiguous().view(B, 1, -1)

    @torch.no_grad()
    def hidden_states(self, tokens, attn_mask=None, position_ids=None, segment_ids=None,
                      prefix_mask=None) -> List[torch.Tensor]:
        """Output of every transformer block (before the final norm), one (B, T, dim) per layer."""
        collect = []
        self._trunk(tokens, attn_mask, position_ids, collect=collect, segment_ids=segment_ids, prefix_mask=prefix_mask)
        return collect

    # ------------------------------------------------------------------ sizes

    def num_params(self, non_embedding=False):
        """Parameters counted once (a tied embedding/head matrix is one matrix)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_embeddings.weight.numel()
        return n

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward), PaLM appendix B: 6N + 12·L·H·Q·T, where
        N counts the parameters used in matmuls (the head yes, the embedding lookup no)."""
        p = self.params
        T = p.max_seq_len if seq_len is None else seq_len
        N = self.num_params(non_embedding=True)
        if p.tie_embeddings:
            N += self.output.weight.numel()  # the shared matrix still does the head matmul
        else:
            N = self.num_params() - self.tok_embeddings.weight.numel()
        head_dim = p.dim // p.n_heads
        return 6 * N + 12 * p.n_layers * p.n_heads * head_dim * T

    def estimate_mfu(self, tokens_per_iter, dt, peak_flops, seq_len=None):
        """Model FLOPs utilisation: achieved FLOP/s over the device's peak FLOP/s."""
        if not peak_flops or dt <= 0:
            return None
        return self.flops_per_token(seq_len) * tokens_per_iter / dt / peak_flops

    # ------------------------------------------------------------------ generation

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, prompt_mask=None,
                 generator=None, stop_token=None):
        """Sample up to `max_new_tokens` after the prompts `idx` (B, T); temperature 0 is greedy.

        Prompts of different lengths are left-padded and marked by `prompt_mask` (B, T, True on
        real tokens): padding is never attended to and positions start at each prompt's first
        real token, so every row is generated exactly as if it were alone.

        Context window (L = max_seq_len). A row's next token is predicted from a window of its
        last tokens at positions 0, 1, ... from the window's first token, decoded one token per
        step over a KV cache. While a row holds at most L tokens the window is all of them (what
        llama2.c's generate computes too). When one more token would make the window longer
        than L, it restarts from the row's last L // 2 tokens: those are re-encoded in one
        forward pass (a refill: fresh keys and values, positions from 0 again) and decoding
        continues cached, so past L a row refills every L - L // 2 + 1 tokens and always sees
        between L // 2 and L of its last tokens. (llama2.c re-encodes the last L tokens at every
        step past L: L times the work per token.) A prompt longer than L starts from its last L.

        Stopping. With `stop_token` (the generation evaluation passes BOS, which starts the next
        story), a row ends when it samples that token: the token is kept and every later
        position of the row holds stop_token too. Every 16 steps (the only host sync) generation
        stops when all rows have ended, and the output is cut after the last row's stop token;
        the generator is then advanced as if every step had been sampled, so what is drawn from
        it afterwards does not depend on when the batch stopped.

        Returns (B, T + n) with the prompts included: n = max_new_tokens unless all rows ended.
        """
        # decoding runs under inference_mode (no autograd bookkeeping: 8% of a 16-row decoding
        # step on the CPU); the returned tokens are an ordinary tensor, so callers may feed
        # them back into training
        with torch.inference_mode():
            out = self._generate(idx, max_new_tokens, temperature, top_k, prompt_mask, generator, stop_token)
        return out.clone() if torch.is_inference(out) else out

    def _generate(self, idx, max_new_tokens, temperature, top_k, prompt_mask, generator, stop_token):
        B, T = idx.shape
        if max_new_tokens <= 0:
            return idx
        L, dev = self.params.max_seq_len, idx.device
        keep, new = max(1, L // 2), max_new_tokens
        pads = [0] * B
        if prompt_mask is not None:
            real = prompt_mask.to(device=dev, dtype=torch.bool)
            count = real.sum(1)
            if not torch.equal(real, torch.arange(T, device=dev)[None] >= (T - count)[:, None]) or not bool(count.all()):
                raise ValueError("prompt_mask must mark at least one real token per row, after its left padding")
            pads = (T - count).tolist()  # the one host read of the set-up

        # the schedule, known in advance: columns are the padded token indices; a row's window
        # holds columns [start, n] when column n is fed (step n - T + 1). It starts with the
        # prompt's last L tokens at most, and restarts at n - keep + 1 when n - start reaches L.
        start0 = torch.tensor([max(p, T - L) for p in pads])
        c0 = int(start0.min())  # the first column the cache holds
        cache = KVCache(self.params, B, min(L, T - c0 + new - 1), dev, next(self.parameters()).dtype)
        cols = torch.arange(T, T + new - 1)[:, None]  # the column fed at steps 1 .. new - 1
        past = cols - start0[None] - L  # >= 0: the row has outgrown its first window
        period = L - keep + 1
        refill = (past >= 0) & (past % period == 0)
        start = torch.where(past >= 0, cols - keep + 1 - past.clamp_min(0) % period, start0[None])
        positions = (cols - start).to(dev)  # (new - 1, B), all below L
        refills = {}
        for s, row in refill.nonzero().tolist():
            refills.setdefault(s + 1, []).append(row)

        out = torch.empty(B, T + new, dtype=idx.dtype, device=dev)
        out[:, :T] = idx
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        # step 0 encodes the prompts' windows; masks and positions only where rows differ
        # (`plain`: every row's window is the whole cache in order, as for unpadded prompts)
        plain = bool((start0 == c0).all())
        mask = pos = None
        if not plain:
            c = torch.arange(c0, T, device=dev)[None] - start0.to(dev)[:, None]
            window = c >= 0  # real and inside the window
            cache.key_valid[:, :T - c0] = window
            # causal & key-in-window; a padding query attends to itself so no row is empty
            causal = torch.ones(T - c0, T - c0, dtype=torch.bool, device=dev).tril()
            mask = (causal[None] & window[:, None, :]) | torch.eye(T - c0, dtype=torch.bool, device=dev)[None]
            pos = c.clamp_min(0)
        logits = self(idx[:, c0:], attn_mask=mask, position_ids=pos, kv_cache=cache)[:, -1, :]
        if bool(logits.isnan().any()):  # sample_tokens would draw from NaNs without complaint
            raise ValueError("the model's logits are NaN: its weights are not finite")
        step = 0
        while True:
            if temperature == 0.0:
                next_tok = torch.argmax(logits, dim=-1, keepdim=True)
            else:
                logits = logits.float() / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")
                next_tok = sample_tokens(F.softmax(logits, dim=-1), generator)
            if stop_token is not None:
                next_tok = next_tok.masked_fill(done[:, None], stop_token)
                done |= next_tok[:, 0] == stop_token
            out[:, T + step] = next_tok[:, 0]
            step += 1
            if step == new:
                break
            if stop_token is not None and step % 16 == 0 and bool(done.all()):
                if temperature != 0.0:  # the draws the remaining steps would have made
                    for _ in range(new - step):
                        _uniforms(B, dev, generator)
                break

            n = T + step - 1  # the column fed now: the token just sampled
            rows = refills.get(step, [])
            if rows:
                plain = False  # windows differ from here on: masks and positions from the schedule
                if stop_token is not None:  # ended rows are not worth a refill
                    live = (~done).tolist()
                    rows = [i for i in rows if live[i]]
            if len(rows) < B:
                cache.key_valid[:, (n - c0) % cache.capacity] = True
                if not plain:
                    mask, pos = cache.key_valid[:, None, :cache.filled(1)], positions[step - 1, :, None]
                logits = self(out[:, n:n + 1], attn_mask=mask, position_ids=pos, kv_cache=cache)[:, -1, :]
            else:  # every row refills: nothing to decode
                cache.length += 1
            if rows:
                # the refilled rows' decoding above is discarded: the keep-token re-encoding
                # replaces their logits, their cached keys/values and their window's mask
                r = torch.tensor(rows, device=dev)
                sub = KVCache(self.params, len(rows), keep, dev, cache.k.dtype)
                sub_logits = self(out[r, n - keep + 1:n + 1], kv_cache=sub)[:, -1, :]
                if len(rows) == B:
                    logits = sub_logits
                else:
                    logits[r] = sub_logits
                slots = (torch.arange(n - keep + 1, n + 1, device=dev) - c0) % cache.capacity
                cache.copy_rows(r, slots, sub)
                cache.key_valid[r] = False
                cache.key_valid[r[:, None], slots[None, :]] = True
        if stop_token is not None and bool(done.all()):
            # cut after the last row's stop token (the same whenever the check ran)
            ended = (out[:, T:T + step] == stop_token).int().argmax(1)
            step = int(ended.max()) + 1
        return out[:, :T + step]
