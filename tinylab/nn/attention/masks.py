"""Attention masks the backends share: the packed rows' rule (which query may attend to which
key), its dense form and the additive form of a bool mask; and the segment ids and positions of
rows holding several examples (T0's packed rows, pretraining windows with document_mask)."""
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


def segment_positions(segment_ids):
    """pos[t] = t - first index of t's segment (0 on padding, segment 0): each example of a row
    starts at position 0. Tensor ops only (no host sync)."""
    seg = segment_ids
    T = seg.shape[-1]
    t = torch.arange(T, device=seg.device).expand_as(seg)
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    start_idx = torch.where(starts, t, torch.zeros_like(t)).cummax(dim=1).values
    return (t - start_idx) * (seg != 0)


def bos_segments(tokens, bos_id):
    """Segment ids (B, T) of windows cut from concatenated documents, each starting with BOS:
    1 + the number of BOS tokens at or before each position, so a BOS opens a new segment and the
    tokens before a window's first BOS (the end of a story that began earlier) form segment 1.
    Never 0, which document_rule reserves for padding. A cumulative sum on the tokens' device:
    no Python loop over tokens, no host sync."""
    return (tokens == bos_id).long().cumsum(dim=1) + 1
