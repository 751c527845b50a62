"""The model's projections: nn.Linear with the product's operands ordered for few rows.

A decoding step multiplies a few rows (one new token per sequence) by every weight. linear
computes x @ W^T, a product of few rows by a large matrix; W @ x^T is the same product as a large
matrix by few columns, and on the CPU BLAS runs that shape faster. On a 2-core AMD EPYC (MKL,
2 threads) a 350-token generation of the 8M shape takes 0.68x the time at 4 rows, 0.88x at 16,
0.86x at 32 and 0.98x at 64 (bench/decoding.py; at one thread, 16 rows: 1.03x, within noise).

The module, its parameter and its state_dict are nn.Linear's; only the order of the product
changes, and only where the products are not recorded for backward (training keeps F.linear).
The output is then a transposed view of the (out_features, rows) product (last-dim stride =
rows): ops take it as it is; reshape, not view, flattens it.
"""
import torch
import torch.nn.functional as F
from torch import nn

FEW_ROWS = 32  # at most this many rows (all leading dims together) take W @ x^T


class Linear(nn.Linear):
    def forward(self, x):
        # CPU only: measured there (no GPU result). No bias: the model's projections have none.
        # matmul is on autocast's list as linear is: the same casts under CPU autocast.
        if (x.numel() <= FEW_ROWS * self.in_features and x.device.type == "cpu" and self.bias is None
                and not torch.is_grad_enabled()):
            flat = x.reshape(-1, self.in_features)
            # a transposed view, not copied back to rows: at 16 rows the copy costs a fifth of the product
            return (self.weight @ flat.t()).t().view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)
