"""The model's projections: nn.Linear with the product's operands ordered for few rows.

A decoding step multiplies a few rows (one new token per sequence) by every weight. linear
computes x @ W^T; on the CPU, BLAS then rearranges its right operand, the whole weight, for every
call, which at a few rows costs more than the product itself. W @ x^T is the same product with the
weight as the left operand and the rows as the small right one. Measured on a 2-core AMD EPYC
(MKL), a 350-token generation of the 8M shape took 0.52x the time at 4 rows, 0.87x at 16 and
0.88x at 32, and about the same at 64 (docs/performance.md). The module, its parameter and its
state_dict are nn.Linear's; only the order of the product changes, and only where the products
are not recorded for backward. The output is then a transposed view of the (out_features, rows)
product (last-dim stride = rows): ops take it as it is; reshape, not view, flattens it.
"""
import torch
import torch.nn.functional as F
from torch import nn

FEW_ROWS = 32  # at most this many rows (all leading dims together) take W @ x^T


class Linear(nn.Linear):
    def forward(self, x):
        rows = x.numel() // max(1, x.shape[-1])
        # (matmul is on autocast's list as linear is: the same casts under CPU autocast)
        if rows <= FEW_ROWS and x.device.type == "cpu" and self.bias is None and not torch.is_grad_enabled():
            flat = x.reshape(rows, x.shape[-1])
            # a transposed view, not copied back to rows: at 16 rows the copy costs a fifth of the product
            return (self.weight @ flat.t()).t().view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)
