"""FlexAttention (torch >= 2.5) for packed rows: a block mask built from the segment ids skips the
128 x 128 blocks in which no query may attend, with no dense (B, T, T) mask. Training on CUDA
(torch has no FlexAttention backward on the CPU); no attention dropout. Causal rows, explicit
masks and decoding steps go to SDPA, whose kernels (flash on CUDA) flex would not beat."""
from typing import Optional

import torch

from tinylab.nn.attention.base import ATTENTION, AttentionBackend
from tinylab.nn.attention.masks import document_rule

try:
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:
    BlockMask = create_block_mask = flex_attention = None


def document_block_mask(segment_ids, prefix_mask=None):
    """masks.document_mask's rule as FlexAttention's BlockMask (blocks of 128 x 128 that no query
    of the block may attend to are skipped), shared by every layer and head."""
    seg, inp = segment_ids, prefix_mask
    if inp is None:
        def mask_mod(b, h, q, k):
            return document_rule(seg[b, q], seg[b, k], q, k)
    else:
        def mask_mod(b, h, q, k):
            return document_rule(seg[b, q], seg[b, k], q, k, inp[b, q], inp[b, k])
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


@ATTENTION.register("flex")
class Flex(AttentionBackend):
    help = "FlexAttention's block mask; CUDA: torch has no flex backward on the CPU"
    dense_packed_mask = False

    def attend(self, q, k, v, mask, causal, dropout_p):
        if not isinstance(mask, BlockMask):
            return ATTENTION.get("sdpa")().attend(q, k, v, mask, causal, dropout_p)
        return _flex_attention(q, k, v, mask, enable_gqa=q.shape[1] != k.shape[1])

    def packed_mask(self, segment_ids, prefix_mask, dtype):
        return document_block_mask(segment_ids, prefix_mask)

    def problem(self, dropout: float) -> Optional[str]:
        if flex_attention is None or dropout > 0:
            return (f"attention_impl=flex needs torch >= 2.5 and no attention dropout "
                    f"(torch {torch.__version__}, dropout {dropout})")
        return None

    def training_problem(self, device_type: str, dropout: float) -> Optional[str]:
        if flex_attention is None or device_type != "cuda":
            return (f"attention_impl=flex trains on CUDA only (torch {torch.__version__} has no FlexAttention "
                    f"backward on {device_type}); use attention_impl=auto or sdpa")
        if dropout > 0:
            return f"attention_impl=flex has no attention dropout (dropout={dropout}): use dropout=0 or attention_impl=sdpa"
        return None
