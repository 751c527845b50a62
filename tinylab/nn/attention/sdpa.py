"""torch's F.scaled_dot_product_attention: its fused kernels (flash / memory-efficient on CUDA,
flash on the CPU) for causal rows, its masked kernels for explicit and packed rows' masks."""
import torch.nn.functional as F

from tinylab.nn.attention.base import ATTENTION, AttentionBackend, repeat_kv


@ATTENTION.register("sdpa")
class SDPA(AttentionBackend):
    help = "a mask per forward"

    def attend(self, q, k, v, mask, causal, dropout_p):
        k, v = repeat_kv(k, v, q.shape[1])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
