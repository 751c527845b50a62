"""What an attention backend is, the registry that names the backends, and how the `attention_impl`
setting (a backend's name, or auto) picks one.

A backend computes softmax(q k^T / sqrt(head_dim) + mask) v for one layer:

    @ATTENTION.register("mine")
    class Mine(AttentionBackend):
        help = "what it is, in a few words (--help)"

        def attend(self, q, k, v, mask, causal, dropout_p):
            ...

    q (B, H, T, hd); k, v (B, KV, S, hd), H a multiple of KV: query head h uses kv head
    h // (H // KV) (grouped-query attention; repeat_kv gives every query head its own).
    mask: None, a bool tensor broadcastable to (B, H, T, S) (True = may attend), an additive
    float one, or whatever the backend's own packed_mask returned. causal: no mask was given and
    T == S > 1: query i attends to keys 0..i. No mask and not causal: every key.
    dropout_p: attention dropout on the probabilities (0 outside training).

Packed rows (segment ids, finetune_t0.py) get their mask from the backend's packed_mask, once per
forward; the default is the dense (B, 1, T, T) mask, which every backend above takes.
"""
from typing import NamedTuple, Optional

import torch

from tinylab.core.errors import UserError
from tinylab.core.registry import Registry
from tinylab.nn.attention.masks import additive_mask, document_mask

ATTENTION = Registry("attention backend")


class AttentionBackend:
    help = ""
    dense_packed_mask = True  # packed_mask builds the dense (B, 1, T, T) mask (memory estimates count it)

    def attend(self, q, k, v, mask, causal, dropout_p):
        raise NotImplementedError(f"{type(self).__name__}.attend")

    def packed_mask(self, segment_ids, prefix_mask, dtype):
        """Packed rows' mask, built once per forward and shared by every layer: (B, 1, T, T),
        additive in `dtype` while gradients are recorded (SDPA keeps the mask it is given for
        backward, and of a bool mask a float copy per layer), bool otherwise (a quarter of the
        memory; nothing is kept)."""
        allowed = document_mask(segment_ids, prefix_mask)[:, None]
        return additive_mask(allowed, dtype) if torch.is_grad_enabled() else allowed

    def problem(self, dropout: float) -> Optional[str]:
        """Why this backend cannot attend packed rows at all (with attention dropout `dropout`
        in training); None: it can."""
        return None

    def training_problem(self, device_type: str, dropout: float) -> Optional[str]:
        """Why a run cannot train with this backend on `device_type` (finetune_t0.py refuses
        such a configuration before it starts); None: it can."""
        return None


class Attend(NamedTuple):
    """The attention of one forward pass, shared by every layer: the backend and its mask
    (None: causal over the new tokens, or every key for one new token over a KV cache)."""
    backend: AttentionBackend
    mask: object = None


def repeat_kv(k, v, heads):
    """k, v (B, KV, S, hd) with each kv head repeated for the heads // KV query heads that use it."""
    rep = heads // k.shape[1]
    if rep == 1:
        return k, v
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def resolve(impl: str, device_type: str, dropout: float = 0.0) -> str:
    """The backend `impl` names on `device_type`: auto = flex on CUDA (its compiled kernel skips
    the masked blocks of packed rows) where it can run (no attention dropout), sdpa elsewhere."""
    if impl == "auto":
        flex = ATTENTION.get("flex") if "flex" in ATTENTION else None
        return "flex" if device_type == "cuda" and flex is not None and flex().problem(dropout) is None else "sdpa"
    if impl not in ATTENTION:
        raise ValueError(f"attention_impl must be one of {', '.join(choices())}, not {impl!r}")
    return impl


def choices() -> tuple:
    """The values the `attention_impl` key takes."""
    return ("auto",) + ATTENTION.names()


def describe() -> str:
    """The `attention_impl` key's help: each backend's own words."""
    parts = [f"{name} ({backend.help})" if backend.help else name for name, backend in ATTENTION.items()]
    return ("packed rows' attention, built from their segment ids at each forward: " + " | ".join(parts)
            + " | auto = flex on CUDA, sdpa elsewhere")


def check_attention_impl(cfg):
    """finetune_t0.py's rule: the run can train with the chosen backend on its device (auto picks
    one that can)."""
    if cfg["attention_impl"] == "auto":
        return
    device = cfg["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    problem = ATTENTION.get(cfg["attention_impl"])().training_problem(device.split(":")[0], cfg["dropout"])
    if problem:
        raise UserError(problem)
