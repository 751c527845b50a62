"""Attention masks the backends share: the packed rows' rule (which query may attend to which
key), its dense form and the additive form of a bool mask."""
import torch


def additive_mask(allowed, dtype):
    """A bool attention mask (True = may attend) as an additive float mask: 0 or -inf."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, zero - float("inf"))


def document_rule(seg_q, seg_k, q, k, inp_q=None, inp_k=None):
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
    return document_rule(seg[:, :, None], seg[:, None, :], t[:, None], t[None, :], *inp)
