"""training/noise.py: the critical batch size estimate recovers B_noise = tr(Sigma) / |G|^2 from
the expected squared gradient norms E|g_b|^2 = |G|^2 + tr(Sigma) / b (McCandlish et al. 2018,
App. A), and grad_sq_norm is the plain sum of squared gradients."""
import pytest
import torch
from conftest import tiny_model

from tinylab.training.noise import critical_batch_size, grad_sq_norm


def expected_sq_norm(g2, trace, b):
    return g2 + trace / b


def test_recovers_the_noise_scale_and_averages_over_log_steps():
    g2, trace = 4.0, 12.0  # B_noise = 3
    sample = (expected_sq_norm(g2, trace, 2), expected_sq_norm(g2, trace, 8), 2, 8)
    ema, metrics = critical_batch_size(None, *sample)
    assert metrics["critical_batch_size_step"] == pytest.approx(3.0, rel=1e-12)
    assert metrics["critical_batch_size"] == pytest.approx(3.0, rel=1e-12)  # the first sample starts the means
    # a second step with B_noise = 1: the logged value is the ratio of the running means (decay 0.9)
    ema, metrics = critical_batch_size(ema, expected_sq_norm(2.0, 2.0, 4), expected_sq_norm(2.0, 2.0, 16), 4, 16)
    assert metrics["critical_batch_size_step"] == pytest.approx(1.0, rel=1e-12)
    assert metrics["critical_batch_size"] == pytest.approx((0.9 * 12 + 0.1 * 2) / (0.9 * 4 + 0.1 * 2), rel=1e-12)
    # no signal (|G|^2 estimated 0): nan, not an error
    _, metrics = critical_batch_size(None, 1.0, 0.25, 2, 8)
    assert metrics["critical_batch_size_step"] != metrics["critical_batch_size_step"]


def test_grad_sq_norm_is_the_sum_of_squares():
    model = tiny_model()
    x = torch.randint(0, 100, (2, 8))
    model(x, x)
    model.last_loss.backward()
    want = sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None)
    assert float(grad_sq_norm(model)) == pytest.approx(want, rel=1e-5)
