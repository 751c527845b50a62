"""tinylab/nn/linear.py: the model's projections are nn.Linear with W @ x^T for a few rows
without autograd (CPU decoding steps), F.linear everywhere else."""
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from model import ModelArgs, Transformer
from tinylab.nn.linear import FEW_ROWS, Linear


class Calls(TorchFunctionMode):
    """The torch functions called inside the block, by name."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def run(layer, x, grad):
    with torch.set_grad_enabled(grad), Calls() as calls:
        out = layer(x)
    return out, calls.names


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12), (torch.bfloat16, 0.02)])
@pytest.mark.parametrize("shape", [(16, 1, 96), (3, 96), (2, 5, 96), (FEW_ROWS, 96), (1, 1, 96)])
def test_few_rows_take_the_weight_first_and_equal_linear(dtype, tol, shape):
    g = torch.Generator().manual_seed(0)
    layer = Linear(96, 200, bias=False).to(dtype)
    x = torch.randn(*shape, generator=g).to(dtype)
    out, names = run(layer, x, grad=False)
    assert "linear" not in names and "matmul" in names
    assert out.shape == shape[:-1] + (200,) and out.dtype == dtype
    assert out.stride(-1) == x.numel() // 96  # the product's transposed view: no copy
    assert torch.equal(out, (layer.weight @ x.reshape(-1, 96).t()).t().reshape(out.shape))
    ref = F.linear(x.double(), layer.weight.double())
    assert torch.allclose(out.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("shape,grad,bias", [((FEW_ROWS + 1, 96), False, False), ((4, 3, 96), True, False),
                                             ((4, 96), False, True), ((2, 0, 96), False, False)])
def test_everything_else_is_linear_itself(shape, grad, bias):
    """More rows, a product recorded for backward, a bias: F.linear, bit for bit."""
    layer = Linear(96, 200, bias=bias)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    out, names = run(layer, x, grad)
    if shape[1] != 0:
        assert "linear" in names and "matmul" not in names
    assert torch.equal(out, F.linear(x, layer.weight, layer.bias))
    if grad:
        out.sum().backward()
        assert layer.weight.grad.shape == layer.weight.shape


def test_under_cpu_autocast_it_multiplies_in_the_autocast_dtype():
    layer = Linear(96, 200, bias=False)
    x = torch.randn(16, 1, 96)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        out, ref = layer(x), F.linear(x, layer.weight)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert torch.allclose(out.float(), ref.float(), rtol=0.02, atol=0.02 * ref.abs().max().item())


def test_the_model_is_made_of_them_and_its_state_dict_is_llama2c_s():
    m = Transformer(ModelArgs(dim=48, n_layers=2, n_heads=4, vocab_size=64, max_seq_len=16))
    projections = [mod for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
    assert len(projections) == 2 * 7 + 1 and all(type(mod) is Linear for mod in projections)
    assert "layers.0.attention.wq.weight" in m.state_dict() and "output.weight" in m.state_dict()
