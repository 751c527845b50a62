"""The model's building blocks, the lowest layer of the library: model.py is assembled from them.

  precision.py   the dtypes the numerically sensitive parts compute in (half precision upcast)
  linear.py      the projections: nn.Linear, with W @ x^T for a few rows on the CPU (decoding)
  fused_head.py  the output head and cross-entropy fused, chunk by chunk of rows (the training
                 loss without the (tokens, vocab) logits), a torch custom operator
  attention/     the attention backends (sdpa, flex, dense), one module each, registered in
                 ATTENTION and chosen by the `attention_impl` key; the packed rows' masks
  sampling.py    generation's pieces: drawing tokens from probabilities, the KV cache

Nothing here imports another tinylab module except core/registry.py and core/errors.py (which
import nothing else of the project).
"""
