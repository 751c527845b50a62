"""The output head and the cross-entropy loss fused: `linear_cross_entropy` computes the head
matmul, the loss and both gradients together, chunk by chunk of rows, in the forward pass, and
never materialises the (tokens, vocab) logits. Under torch.compile it is one custom operator,
`tinylab::linear_cross_entropy` (no graph break, the chunk loop not unrolled into the graph)."""
from typing import Tuple

import torch

from tinylab.nn.precision import compute_dtype, matmul_dtype


def _head_chunk_rows(vocab_size):
    # ~4M logits (16 MB in fp32) per chunk, and at least 1024 rows: the weight gradient's product
    # has the chunk's rows as its inner dimension and ran 2x slower with 131 rows (vocab 32000,
    # dim 288, CPU) than with 1024-2048; at vocab 8192, 512-2048 rows time the same
    return max(1024, (1 << 22) // vocab_size)


def _chunked_cross_entropy(h, weight, targets, token_weights, need_h, need_w, mm):
    """(sum_i w_i * cross_entropy(h_i @ W.T, t_i), d/dh, d/dW), chunk by chunk of rows; the
    gradients only when asked (None otherwise).

    mm: the dtype of the three matmuls (matmul_dtype). The softmax, the loss and the gradients'
    sums are in the compute dtype (fp32 for half precision), as autocast runs cross_entropy."""
    dt = compute_dtype(h)
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
# (mm_dtype: matmul_dtype), so autocast is switched off inside.
@torch.library.custom_op("tinylab::linear_cross_entropy", mutates_args=())
def _fused_head(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, token_weights: torch.Tensor,
                need_h: bool, need_w: bool, mm_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with torch.autocast(h.device.type, enabled=False):
        loss, grad_h, grad_w = _chunked_cross_entropy(h, weight, targets, token_weights, need_h, need_w, mm_dtype)
    # an operator returns tensors (distinct ones): empty = not computed
    return tuple(h.new_empty(0, dtype=loss.dtype) if g is None else g for g in (loss, grad_h, grad_w))


@_fused_head.register_fake
def _(h, weight, targets, token_weights, need_h, need_w, mm_dtype):
    dt = compute_dtype(h)
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
        loss_weights = valid.to(compute_dtype(h)) / valid.sum()
    targets, loss_weights = targets.clamp_min(0), loss_weights.to(compute_dtype(h))
    grad = torch.is_grad_enabled()  # evaluation computes no gradients
    loss = _fused_head(h, weight, targets, loss_weights, grad and h.requires_grad, grad and weight.requires_grad,
                       matmul_dtype(h))[0]
    return loss.to(h.dtype)
