"""Attention backends, one module each, registered in ATTENTION under the name the
`attention_impl` key takes (base.py says what a backend provides):

  sdpa.py    torch's F.scaled_dot_product_attention (the default off CUDA)
  flex.py    FlexAttention's block masks for packed rows (auto's choice on CUDA)
  dense.py   plain matmul + softmax: the reference every backend is tested against

masks.py holds the masks they share. Importing this package registers every backend.
"""
from tinylab.nn.attention import dense, flex, sdpa  # noqa: F401  (registers the backends)
from tinylab.nn.attention.base import (  # noqa: F401
    ATTENTION,
    Attend,
    AttentionBackend,
    check_attention_impl,
    choices,
    describe,
    repeat_kv,
    resolve,
)
from tinylab.nn.attention.flex import document_block_mask, flex_attention  # noqa: F401
from tinylab.nn.attention.masks import (  # noqa: F401
    additive_mask,
    bos_segments,
    document_mask,
    segment_positions,
)
