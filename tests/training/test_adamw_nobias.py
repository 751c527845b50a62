"""adam_bias_correction=False: AdamW as transformers' AdamW(correct_bias=False), staged-training's
optimizer. The reference re-implements HF transformers 4.8's AdamW.step by hand, element by
element in Python floats: m, v updated, p -= lr m / (sqrt(v) + eps), then p -= lr wd p."""
import math

import pytest
import torch
from conftest import tiny_model

from tinylab.schema import TRAIN
from tinylab.training.adamw_nobias import AdamWNoBiasCorrection
from tinylab.training.optim import build_optimizer, optimizer_param_names, set_lr
from tinylab.training.options import OptimizerOptions


def hf_adamw_no_bias_step(p, g, m, v, lr, betas, eps, wd):
    """One step of transformers' AdamW(correct_bias=False) on flat lists of floats (in place)."""
    b1, b2 = betas
    for i in range(len(p)):
        m[i] = m[i] * b1 + (1.0 - b1) * g[i]
        v[i] = v[i] * b2 + (1.0 - b2) * g[i] * g[i]
        p[i] = p[i] - lr * m[i] / (math.sqrt(v[i]) + eps)
        if wd > 0.0:
            p[i] = p[i] - lr * wd * p[i]


def test_steps_equal_the_hand_computed_formula():
    cfg = dict(TRAIN.defaults(), adam_bias_correction=False, beta2=0.98, adam_eps=1e-6, weight_decay=0.1,
               learning_rate=3e-2)
    model = tiny_model(seed=3, dtype=torch.float64, vocab_size=29, max_seq_len=8).train()
    opt = build_optimizer(model, OptimizerOptions.from_config(cfg))
    assert isinstance(opt, AdamWNoBiasCorrection)
    names = optimizer_param_names(opt)
    params = dict(model.named_parameters())
    decay = {n: g["weight_decay"] for g in opt.param_groups for n in g["param_names"]}
    assert decay["layers.0.attention.wq.weight"] == 0.1 and decay["norm.weight"] == 0.0  # matrices only
    ref = {n: (params[n].detach().flatten().tolist(), [0.0] * params[n].numel(), [0.0] * params[n].numel())
           for n in names}
    gen = torch.Generator().manual_seed(0)
    for step, lr in enumerate((3e-2, 1e-2, 2e-2)):
        set_lr(opt, lr)
        x = torch.randint(0, 29, (2, 8), generator=gen)
        model(x, torch.roll(x, 1, dims=1))
        model.last_loss.backward()
        grads = {n: params[n].grad.flatten().tolist() for n in names}
        opt.step()
        opt.zero_grad(set_to_none=True)
        for n in names:
            p, m, v = ref[n]
            hf_adamw_no_bias_step(p, grads[n], m, v, lr, (0.9, 0.98), 1e-6, decay[n])
            assert torch.allclose(params[n].detach().flatten(), torch.tensor(p, dtype=torch.float64),
                                  rtol=0, atol=1e-14), (step, n)
            st = opt.state[params[n]]
            assert torch.allclose(st["exp_avg_sq"].flatten(), torch.tensor(v, dtype=torch.float64), rtol=1e-14, atol=0)
            assert st["step"].item() == step + 1


def test_first_step_differs_from_bias_corrected_adamw():
    """At step 1 AdamW's corrected update is lr g / (|g| + eps) ~ lr; without correction it is
    lr 0.1 g / (sqrt(0.02) |g| + eps) ~ 0.707 lr (beta1 0.9, beta2 0.98)."""
    w = torch.tensor([2.0, -3.0], dtype=torch.float64)
    g = torch.tensor([0.5, -0.25], dtype=torch.float64)
    out = []
    for cls in (torch.optim.AdamW, AdamWNoBiasCorrection):
        p = torch.nn.Parameter(w.clone())
        opt = cls([p], lr=0.1, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0)
        p.grad = g.clone()
        opt.step()
        out.append((w - p.detach()) / 0.1)
    assert torch.allclose(out[0], torch.sign(g), atol=1e-5)
    assert torch.allclose(out[1], 0.1 * g / (math.sqrt(0.02) * g.abs() + 1e-6), rtol=1e-12, atol=0)
    assert torch.allclose(out[1], torch.sign(g) / math.sqrt(2), atol=1e-4)


def test_state_dict_round_trip_and_resume():
    model = tiny_model(seed=1, dtype=torch.float64, vocab_size=29, max_seq_len=8).train()
    opts = OptimizerOptions.from_config(dict(TRAIN.defaults(), adam_bias_correction=False))
    opt = build_optimizer(model, opts)
    x = torch.randint(0, 29, (2, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        model(x, x)
        model.last_loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    again = build_optimizer(model, opts)
    again.load_state_dict(opt.state_dict())
    p = next(model.parameters())
    assert torch.equal(again.state[p]["exp_avg"], opt.state[p]["exp_avg"]) and again.state[p]["step"].item() == 2


def test_needs_adamw():
    from tinylab.core.errors import UserError
    with pytest.raises(UserError, match="adam_bias_correction=False is AdamW's"):
        TRAIN.validate(dict(TRAIN.defaults(), adam_bias_correction=False, optimizer="adafactor"))
