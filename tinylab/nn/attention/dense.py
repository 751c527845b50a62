"""The reference: the scores as a plain matmul, the mask added, a softmax, the weighted values.
Runs everywhere, every mask, with dropout; the (B, H, T, S) scores are materialised, so it is the
slowest and the largest in memory. Half precision computes in fp32."""
import torch
import torch.nn.functional as F

from tinylab.nn.attention.base import ATTENTION, AttentionBackend, repeat_kv
from tinylab.nn.precision import compute_dtype


@ATTENTION.register("dense")
class Dense(AttentionBackend):
    help = "plain matmul + softmax over a dense mask: the reference, slowest"

    def attend(self, q, k, v, mask, causal, dropout_p):
        k, v = repeat_kv(k, v, q.shape[1])
        dt = compute_dtype(q)
        scores = (q.to(dt) @ k.to(dt).transpose(-2, -1)) / q.shape[-1] ** 0.5
        if causal:
            T, S = scores.shape[-2:]
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.to(dt)
        probs = F.dropout(scores.softmax(-1), dropout_p) if dropout_p > 0 else scores.softmax(-1)
        return (probs @ v.to(dt)).to(q.dtype)
