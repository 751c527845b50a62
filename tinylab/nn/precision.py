"""The dtypes the numerically sensitive parts of the model compute in."""
import torch


def compute_dtype(x):
    """Half precision is upcast to fp32 for norms, rotations, softmaxes and losses; fp32 and fp64
    stay as they are (the growth tests compare losses in fp64 to 1e-10)."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def matmul_dtype(x):
    """The dtype F.linear multiplies `x` in: autocast's (which never casts fp64), else x's own."""
    device = x.device.type
    if x.dtype != torch.float64 and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype
