"""Adafactor (adafactor.py): formulas, HF parity, validation, resume, presets, config glue."""
import io
import itertools
import math

import numpy as np
import pytest
import torch
from conftest import tiny_model as shared_tiny_model

from tinylab.core.errors import UserError
from tinylab.schema import TRAIN
from tinylab.training import optim
from tinylab.training.adafactor import Adafactor
from tinylab.training.options import OptimizerOptions, ScheduleOptions
from tinylab.training.presets import ADAFACTOR_PRESETS, OPTIMIZER_PRESETS, apply_optimizer_preset


def HFAdafactor(*args, **kw):
    """transformers' Adafactor, the reference (a test dependency: never skipped). Imported here,
    not at the top: transformers.optimization takes 4 s to import (peft, accelerate), which every
    test worker would pay while collecting."""
    from transformers.optimization import Adafactor as reference
    return reference(*args, **kw)


SHAPES = [(7,), (5, 6), (2, 3, 4), (4, 5)]  # the last one is stored as a bf16 parameter
DTYPES = [torch.float32, torch.float32, torch.float32, torch.bfloat16]


def toy_params():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(s, generator=g) * 0.5).to(dt).requires_grad_() for s, dt in zip(SHAPES, DTYPES)]


def toy_grads(step):
    g = torch.Generator().manual_seed(100 + step)
    out = [torch.randn(s, generator=g) * 0.1 for s in SHAPES]
    out[1][2] = 0.0  # an all-zero row: eps1 keeps it finite
    return [x.to(dt) for x, dt in zip(out, DTYPES)]


# --- an independent reference: the spec's formulas (§7) in float64 numpy -----------------------

class Reference:
    def __init__(self, xs, lr=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
                 beta1=None, weight_decay=0.0, scale_parameter=True, relative_step=True,
                 warmup_init=False):
        self.o = dict(lr=lr, eps1=eps[0], eps2=eps[1], clip=clip_threshold, decay=decay_rate,
                      beta1=beta1, wd=weight_decay, sp=scale_parameter, rel=relative_step,
                      warm=warmup_init)
        self.x = [np.array(x.detach().double().numpy()) for x in xs]
        self.t = [0] * len(xs)
        self.R, self.C, self.V = {}, {}, {}
        self.M = {i: np.zeros(x.shape) for i, x in enumerate(self.x)}
        self.alpha = {}

    def step(self, grads, round_to=None):
        o = self.o
        for i, (X, G) in enumerate(zip(self.x, grads)):
            G = G.double().numpy()
            self.t[i] += 1
            t = self.t[i]
            rms = math.sqrt(np.mean(X ** 2))
            if o["rel"]:
                rho = min(1e-6 * t if o["warm"] else 1e-2, 1 / math.sqrt(t))
            else:
                rho = o["lr"]
            alpha = rho * max(o["eps2"], rms) if o["sp"] else rho
            b2 = 1 - t ** o["decay"]
            Q = G ** 2 + o["eps1"]
            if X.ndim >= 2:
                self.R[i] = b2 * self.R.get(i, 0) + (1 - b2) * Q.mean(-1)
                self.C[i] = b2 * self.C.get(i, 0) + (1 - b2) * Q.mean(-2)
                R, C = self.R[i], self.C[i]
                Vhat = R[..., :, None] * C[..., None, :] / R.mean(-1)[..., None, None]
            else:
                self.V[i] = b2 * self.V.get(i, 0) + (1 - b2) * Q
                Vhat = self.V[i]
            U = G / np.sqrt(Vhat)
            U = U / max(1.0, math.sqrt(np.mean(U ** 2)) / o["clip"])
            U = alpha * U
            if o["beta1"] is not None:
                self.M[i] = o["beta1"] * self.M[i] + (1 - o["beta1"]) * U
                U = self.M[i]
            X = X - o["wd"] * alpha * X - U
            if round_to is not None and round_to[i] != torch.float32:  # the parameter's storage
                X = torch.from_numpy(X).to(round_to[i]).double().numpy()
            self.x[i] = X
            self.alpha[i] = alpha


def option_grid():
    for sp, (rel, warm), b1, wd, clip in itertools.product(
            [True, False], [(False, False), (True, False), (True, True)], [None, 0.9],
            [0.0, 0.1], [1.0, 0.3, 100.0]):
        yield dict(lr=None if rel else 0.05, scale_parameter=sp, relative_step=rel,
                   warmup_init=warm, beta1=b1, weight_decay=wd, clip_threshold=clip)


def check_against_reference(opt, ps, ref, step):
    for i, p in enumerate(ps):
        if p.dtype == torch.float32:
            np.testing.assert_allclose(p.detach().double().numpy(), ref.x[i], rtol=2e-6, atol=1e-8,
                                       err_msg=f"tensor {i} step {step}")
        else:  # bf16: one bf16 ulp at most (rounding of an fp32 vs a float64 result)
            np.testing.assert_allclose(p.detach().double().numpy(), ref.x[i], rtol=2 ** -7, atol=1e-6,
                                       err_msg=f"bf16 tensor {i} step {step}")
        st = opt.state[p]
        # fp32 state even for the bf16 parameter, and it matches the reference's moments
        for k in ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq", "exp_avg"):
            if k in st:
                assert st[k].dtype == torch.float32, (i, k, st[k].dtype)
        if p.dim() >= 2:
            np.testing.assert_allclose(st["exp_avg_sq_row"].double().numpy(), ref.R[i], rtol=2e-6, atol=1e-30)
            np.testing.assert_allclose(st["exp_avg_sq_col"].double().numpy(), ref.C[i], rtol=2e-6, atol=1e-30)
        else:
            np.testing.assert_allclose(st["exp_avg_sq"].double().numpy(), ref.V[i], rtol=2e-6, atol=1e-30)
        if ref.o["beta1"] is not None:
            np.testing.assert_allclose(st["exp_avg"].double().numpy(), ref.M[i], rtol=1e-5, atol=1e-9)
        assert st["step"] == ref.t[i]
        assert float(st["alpha"]) == pytest.approx(ref.alpha[i], rel=1e-6)


@pytest.mark.parametrize("opts", list(option_grid()), ids=lambda o: "-".join(
    f"{k}={v}" for k, v in o.items() if k != "lr"))
def test_steps_match_hand_reference(opts):
    ps = toy_params()
    ref = Reference(ps, **opts)
    opt = Adafactor(ps, **opts)
    for step in range(3):
        grads = toy_grads(step)
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        opt.step()
        ref.step(grads, round_to=DTYPES)
        check_against_reference(opt, ps, ref, step)


@pytest.mark.parametrize("warm", [False, True])
def test_relative_step_past_1e4_steps(warm):
    """rho = min(1e-2 or 1e-6 t, 1/sqrt(t)): the 1/sqrt(t) branch only shows after 10^4 steps."""
    ps = [p.detach().float().requires_grad_() for p in toy_params()]
    opts = dict(relative_step=True, warmup_init=warm, scale_parameter=False, beta1=0.5)
    ref = Reference(ps, **opts)
    opt = Adafactor(ps, **opts)
    for step in range(2):
        grads = [g.float() for g in toy_grads(step)]
        for p, g in zip(ps, grads):
            p.grad = g
        opt.step()
        ref.step(grads)
        if step == 0:  # jump both step counters to t = 40000
            for i, p in enumerate(ps):
                opt.state[p]["step"] = ref.t[i] = 39999
    check_against_reference(opt, ps, ref, 1)
    assert ref.alpha[0] == pytest.approx(1 / 200)


def test_factored_state_is_sublinear_and_min_dim_size():
    p = torch.zeros(3, 64, 32, requires_grad=True)
    q = torch.zeros(8, 300, requires_grad=True)
    opt = Adafactor([p, q], min_dim_size_to_factor=10)
    p.grad, q.grad = torch.ones_like(p), torch.ones_like(q)
    opt.step()
    assert opt.state[p]["exp_avg_sq_row"].shape == (3, 64)
    assert opt.state[p]["exp_avg_sq_col"].shape == (3, 32)
    assert "exp_avg_sq" not in opt.state[p]
    assert opt.state[q]["exp_avg_sq"].shape == (8, 300)  # 8 < 10: not factored


# --- 20 steps against transformers.Adafactor ---------------------------------------------------

def tiny_model(seed=0):
    return shared_tiny_model(seed=seed, dim=32, n_layers=1, n_heads=2, n_kv_heads=None, vocab_size=50, multiple_of=8,
                             max_seq_len=16).train()


HF_CONFIGS = [
    dict(),  # HF defaults: relative step, parameter scaling
    dict(lr=1e-3, scale_parameter=True, relative_step=False, warmup_init=False),  # t0
    dict(lr=1e-3, scale_parameter=False, relative_step=False, warmup_init=False),  # hf_t5
    dict(scale_parameter=True, relative_step=True, warmup_init=True, beta1=0.9, weight_decay=0.01,
         clip_threshold=0.5),
]


@pytest.mark.parametrize("kw", HF_CONFIGS, ids=str)
def test_twenty_steps_match_transformers(kw):
    ours, theirs = tiny_model(), tiny_model()
    extra = torch.nn.Parameter(torch.randn(3, 4, 5))  # a >2-D tensor: factored over the last two dims
    extra_hf = torch.nn.Parameter(extra.detach().clone())
    opt = Adafactor(list(ours.parameters()) + [extra], **kw)
    ref = HFAdafactor(list(theirs.parameters()) + [extra_hf], **kw)
    start = [a.detach().clone() for a in ours.parameters()] + [extra.detach().clone()]
    g = torch.Generator().manual_seed(1)
    for step in range(20):
        x = torch.randint(0, 50, (2, 16), generator=g)
        y = torch.randint(0, 50, (2, 16), generator=g)
        for model, e, o in ((ours, extra, opt), (theirs, extra_hf, ref)):
            o.zero_grad(set_to_none=True)
            model(x, y)
            (model.last_loss + (e ** 2).sum() * 1e-2).backward()
            o.step()
        # compare the accumulated updates (not the weights), so the tolerance is relative to them
        names = [n for n, _ in ours.named_parameters()] + ["extra"]
        for name, a, b, a0 in zip(names, list(ours.parameters()) + [extra],
                                  list(theirs.parameters()) + [extra_hf], start):
            torch.testing.assert_close(a - a0, b - a0, rtol=1e-5, atol=1e-10,
                                       msg=lambda m: f"{name} step {step}: {m}")
    moved = [(a - a0).abs().max().item() for a, a0 in zip(ours.parameters(), start)]
    assert min(moved) > 1e-7  # every tensor really moved


def test_bf16_parameters_match_transformers():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 8, generator=g).bfloat16()
    a, b = w.clone().requires_grad_(), w.clone().requires_grad_()
    opt, ref = Adafactor([a], lr=0.05, relative_step=False), HFAdafactor([b], lr=0.05, relative_step=False)
    for _ in range(20):
        grad = torch.randn(16, 8, generator=g).bfloat16()
        a.grad, b.grad = grad.clone(), grad.clone()
        opt.step()
        ref.step()
    assert a.dtype == torch.bfloat16
    assert torch.equal(a, b)
    assert opt.state[a]["exp_avg_sq_row"].dtype == torch.float32


def test_master_weights_accumulate_below_bf16_resolution():
    """t0-sized relative steps (1e-3 of the RMS) round away in bf16 unless a master copy is kept."""
    w = torch.ones(8, 8, dtype=torch.bfloat16)
    plain, master = w.clone().requires_grad_(), w.clone().requires_grad_()
    o1 = Adafactor([plain], lr=1e-3, relative_step=False)
    o2 = Adafactor([master], lr=1e-3, relative_step=False, master_weights=True)
    for _ in range(10):
        plain.grad = torch.ones(8, 8, dtype=torch.bfloat16)
        master.grad = torch.ones(8, 8, dtype=torch.bfloat16)
        o1.step()
        o2.step()
    assert torch.equal(plain, w)  # HF semantics: 1 - 1e-3 rounds back to 1 every step
    assert o2.state[master]["master"].dtype == torch.float32
    assert float(o2.state[master]["master"].mean()) == pytest.approx(1 - 10e-3, rel=1e-3)
    assert torch.equal(master, o2.state[master]["master"].bfloat16())
    with torch.no_grad():  # a change from outside is picked up
        master.fill_(2.0)
    master.grad = torch.ones(8, 8, dtype=torch.bfloat16)
    o2.step()
    assert float(o2.state[master]["master"].mean()) == pytest.approx(2 - 2e-3, rel=1e-4)


def test_direction_agrees_with_torch_adafactor_in_common_configuration():
    """scale_parameter on, constant lr <= 1e-3, no beta1, no weight decay: torch's class gives
    the same update up to eps1 placement (torch: clamp V at eps1^2; ours: add eps1 to G^2)."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(6, 10, generator=g)
    a, b = w.clone().requires_grad_(), w.clone().requires_grad_()
    ours = Adafactor([a], lr=1e-3, relative_step=False)
    theirs = torch.optim.Adafactor([b], lr=1e-3, eps=(1e-15, 1e-3))
    for _ in range(5):
        grad = torch.randn(6, 10, generator=g)
        a.grad, b.grad = grad.clone(), grad.clone()
        ours.step()
        theirs.step()
    torch.testing.assert_close(a - w, b - w, rtol=1e-4, atol=1e-9)


# --- validation ------------------------------------------------------------------------------

BAD = [
    (dict(lr=1e-3), "relative_step=True"),
    (dict(lr=None, relative_step=False), "needs an external learning rate"),
    (dict(warmup_init=True, relative_step=False, lr=1e-3), "warmup_init=True requires relative_step=True"),
    (dict(lr=-1.0, relative_step=False), "lr must be >= 0"),
    (dict(eps=(1e-30,)), "eps must be a pair"),
    (dict(eps=(-1.0, 1e-3)), "eps must be a pair"),
    (dict(clip_threshold=0.0), "clip_threshold must be > 0"),
    (dict(decay_rate=0.5), "decay_rate must be <= 0"),
    (dict(beta1=1.0), "beta1 must be None or in [0, 1)"),
    (dict(weight_decay=-0.1), "weight_decay must be >= 0"),
    (dict(min_dim_size_to_factor=-1), "min_dim_size_to_factor"),
]


@pytest.mark.parametrize("kw,fragment", BAD, ids=[b[1] for b in BAD])
def test_invalid_arguments(kw, fragment):
    with pytest.raises(ValueError) as e:
        Adafactor([torch.zeros(2, requires_grad=True)], **kw)
    assert isinstance(e.value, UserError)
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg and msg.startswith("Adafactor")


def test_invalid_group_settings():
    p, q = torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)
    with pytest.raises(UserError, match=r"group 1 \(b, \.\.\.\).*eps must be a pair"):
        Adafactor([{"params": [p], "param_names": ["a"]},
                   {"params": [q], "param_names": ["b"], "eps": 1e-8}])
    # a per-group lr satisfies relative_step=False even when the default lr is None
    opt = Adafactor([{"params": [p], "lr": 0.1}], relative_step=False)
    p.grad = torch.ones(2)
    opt.step()
    assert torch.all(p < 0)
    with pytest.raises(UserError, match="per-parameter eps overrides"):
        optim.build_adafactor(tiny_model(), opts({**TRAIN.defaults(), "optimizer": "adafactor", "learning_rate": 1e-3}),
                              overrides={"tok_embeddings.weight": {"eps": 1e-9}})


# --- exact resume ----------------------------------------------------------------------------

def test_state_dict_round_trip_continues_identically():
    ps = toy_params()
    opt = Adafactor(ps, beta1=0.9, weight_decay=0.01, warmup_init=True)
    for step in range(3):
        for p, g in zip(ps, toy_grads(step)):
            p.grad = g
        opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    ps2 = [p.detach().clone().requires_grad_() for p in ps]
    opt2 = Adafactor(ps2, beta1=0.9, weight_decay=0.01, warmup_init=True)
    opt2.load_state_dict(saved)
    st = opt2.state[ps2[3]]
    assert st["exp_avg"].dtype == torch.float32 and st["exp_avg_sq_row"].dtype == torch.float32  # bf16 param
    for step in range(3, 6):
        for a, b, g in zip(ps, ps2, toy_grads(step)):
            a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        opt2.step()
        for a, b in zip(ps, ps2):
            assert torch.equal(a, b), step
    assert opt2.state[ps2[0]]["step"] == 6


# --- presets and the config glue ----------------------------------------------------------------

def test_presets_have_the_documented_settings():
    t0 = ADAFACTOR_PRESETS["t0"]
    assert t0 == {"optimizer": "adafactor", "learning_rate": 1e-3, "lr_scheduling": False,
                  "warmup_iters": 0, "weight_decay": 0.0, "grad_clip": 0.0,
                  "adafactor_scale_parameter": True, "adafactor_relative_step": False,
                  "adafactor_warmup_init": False, "adafactor_clip_threshold": 1.0,
                  "adafactor_decay_rate": -0.8, "adafactor_beta1": 0.0,
                  "adafactor_eps1": 1e-30, "adafactor_eps2": 1e-3}  # Mesh-TF's / HF's eps pair
    t5 = ADAFACTOR_PRESETS["hf_t5"]
    assert t5["adafactor_scale_parameter"] is False and t5["adafactor_relative_step"] is False
    assert t5["adafactor_warmup_init"] is False and t5["learning_rate"] == 1e-3 and t5["grad_clip"] == 0.0
    assert t5["lr_scheduling"] is True and "warmup_iters" not in t5
    bz = OPTIMIZER_PRESETS["bloomz_adam"]
    assert bz == {"optimizer": "adamw", "learning_rate": 2e-5, "lr_scheduling": False, "warmup_iters": 0,
                  "weight_decay": 1e-4, "grad_clip": 1.0, "beta1": 0.9, "beta2": 0.95, "adam_eps": 1e-8}


DEFAULTS = {**TRAIN.defaults(), "max_iters": 100}


def opts(cfg):
    """The optimizer options a config gives (what the Trainer builds its optimizer from)."""
    return OptimizerOptions.from_config(cfg)


def lr_at(it, cfg):
    return optim.lr_at(it, ScheduleOptions.from_config(cfg))


def test_apply_optimizer_preset(capsys):
    assert apply_optimizer_preset(DEFAULTS) == DEFAULTS
    cfg = apply_optimizer_preset({**DEFAULTS, "adafactor_preset": "t0"})
    assert {k: cfg[k] for k in ADAFACTOR_PRESETS["t0"]} == ADAFACTOR_PRESETS["t0"]
    assert all(lr_at(it, cfg) == 1e-3 for it in (0, 50, 500))  # constant, no warmup
    opt = optim.build_optimizer(tiny_model(), opts(cfg))
    assert isinstance(opt, Adafactor)
    g = opt.param_groups[0]
    assert g["lr"] == 1e-3 and g["scale_parameter"] and not g["relative_step"] and g["beta1"] is None
    assert all(gr["weight_decay"] == 0.0 for gr in opt.param_groups)

    t5 = apply_optimizer_preset({**DEFAULTS, "adafactor_preset": "hf_t5", "warmup_iters": 10})
    err = capsys.readouterr().err
    assert "absolute steps" in err and len(err.strip().splitlines()) == 1  # one notice line
    lrs = [lr_at(it, t5) for it in (0, 5, 10, 50, 100, 200)]
    assert lrs[0] < lrs[1] < lrs[2] and lrs[2:] == [1e-3] * 4  # warmup to a constant 1e-3
    assert not optim.build_optimizer(tiny_model(), opts(t5)).param_groups[0]["scale_parameter"]

    bz = apply_optimizer_preset({**DEFAULTS, "adafactor_preset": "bloomz_adam"})
    opt = optim.build_optimizer(tiny_model(), opts(bz))
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["betas"] == (0.9, 0.95)
    assert bz["grad_clip"] == 1.0 and lr_at(0, bz) == lr_at(90, bz) == 2e-5

    # with the defaults, values the user changed are kept; a conflicting optimizer is refused
    user = {**DEFAULTS, "adafactor_preset": "t0", "learning_rate": 3e-4}
    assert apply_optimizer_preset(user, DEFAULTS)["learning_rate"] == 3e-4
    assert apply_optimizer_preset(user)["learning_rate"] == 1e-3
    assert apply_optimizer_preset({**DEFAULTS, "adafactor_preset": "hf_t5", "learning_rate": 3e-4},
                                  DEFAULTS)["min_lr"] == 3e-4
    with pytest.raises(UserError, match="uses optimizer=adamw"):
        apply_optimizer_preset({**DEFAULTS, "adafactor_preset": "bloomz_adam", "optimizer": "adafactor"},
                               DEFAULTS)
    with pytest.raises(UserError, match="unknown adafactor_preset 'T0' .*t0, hf_t5, bloomz_adam"):
        apply_optimizer_preset({**DEFAULTS, "adafactor_preset": "T0"})


def test_eps_keys_feed_adafactor_one_step_by_hand():
    """adafactor_eps1 / adafactor_eps2 (HF's eps pair) reach every group; one step with
    non-default values computed by hand (t = 1: beta2 = 0, so V = G^2 + eps1), for a vector
    (V elementwise) and a factored 2 x 2 matrix (V_ij = R_i C_j / mean(R))."""
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.v = torch.nn.Parameter(torch.tensor([1e-4, -2e-4, 3e-4], dtype=torch.float64))
            self.m = torch.nn.Parameter(torch.tensor([[0.5, -0.5], [0.25, 0.0]], dtype=torch.float64))

    cfg = {**TRAIN.defaults(), "optimizer": "adafactor", "learning_rate": 0.1, "weight_decay": 0.0,
           "adafactor_eps1": 1e-3, "adafactor_eps2": 1e-2}

    def one_step(cfg):
        model = Two()
        opt = optim.build_adafactor(model, opts(cfg))
        model.v.grad = torch.tensor([0.1, -0.05, 0.0], dtype=torch.float64)
        model.m.grad = torch.tensor([[0.2, 0.0], [0.0, -0.1]], dtype=torch.float64)
        opt.step()
        return opt, model

    opt, model = one_step(cfg)
    assert all(g["eps"] == (1e-3, 1e-2) for g in opt.param_groups)
    # the vector: V = G^2 + eps1 = [0.011, 0.0035, 0.001], U = G / sqrt(V), RMS(U) < 1 (no clip);
    # RMS(x) = 2.16e-4 < eps2, so alpha = lr * eps2 = 1e-3
    u = [0.1 / math.sqrt(0.011), -0.05 / math.sqrt(0.0035), 0.0]
    assert math.sqrt(sum(x * x for x in u) / 3) < 1
    want_v = [1e-4 - 1e-3 * u[0], -2e-4 - 1e-3 * u[1], 3e-4]
    # the matrix: Q = G^2 + eps1 = [[0.041, 0.001], [0.001, 0.011]], row means R = [0.021, 0.006],
    # column means C = [0.021, 0.006], mean(R) = 0.0135; alpha = lr * RMS(x) = 0.1 * 0.375
    V = [[0.021 * 0.021 / 0.0135, 0.021 * 0.006 / 0.0135], [0.006 * 0.021 / 0.0135, 0.006 * 0.006 / 0.0135]]
    U = [[0.2 / math.sqrt(V[0][0]), 0.0], [0.0, -0.1 / math.sqrt(V[1][1])]]
    rms = math.sqrt((U[0][0] ** 2 + U[1][1] ** 2) / 4)  # 1.115 > clip_threshold 1: clipped
    want_m = [[0.5 - 0.0375 * U[0][0] / rms, -0.5], [0.25, 0.0 - 0.0375 * U[1][1] / rms]]
    np.testing.assert_allclose(model.v.detach().numpy(), want_v, rtol=1e-12, atol=1e-18)
    np.testing.assert_allclose(model.m.detach().numpy(), want_m, rtol=1e-12, atol=1e-18)
    # the defaults (T0's 1e-30, 1e-3) give another step: the keys are what changed it
    _, default = one_step({**cfg, "adafactor_eps1": 1e-30, "adafactor_eps2": 1e-3})
    assert not torch.allclose(default.v, model.v) and not torch.allclose(default.m, model.m)
    for bad in ("0", "-1e-3", "x"):
        with pytest.raises(UserError, match="adafactor_eps1"):
            TRAIN.parse([f"--adafactor_eps1={bad}"])
        with pytest.raises(UserError, match="adafactor_eps2"):
            TRAIN.parse([f"--adafactor_eps2={bad}"])
    # a preset keeps the values the user gave
    assert apply_optimizer_preset({**DEFAULTS, "adafactor_preset": "t0", "adafactor_eps1": 1e-20},
                                  DEFAULTS)["adafactor_eps1"] == 1e-20


def test_build_optimizer_on_tiny_transformer():
    model = tiny_model()
    overrides = {"layers.0.attention.wq.weight": {"lr_scale": 0.5}}
    cfg = {**TRAIN.defaults(), "optimizer": "adafactor", "learning_rate": 2e-3, "weight_decay": 0.1}
    opt = optim.build_optimizer(model, opts(cfg), overrides)
    assert isinstance(opt, Adafactor)
    names = optim.optimizer_param_names(opt)
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    by_name = {n: g for g in opt.param_groups for n in g["param_names"]}
    assert by_name["layers.0.attention.wq.weight"]["lr"] == pytest.approx(1e-3)
    assert by_name["layers.0.attention.wq.weight"]["lr_scale"] == 0.5
    assert by_name["layers.0.attention.wk.weight"]["lr"] == 2e-3
    assert by_name["norm.weight"]["weight_decay"] == 0.0
    assert by_name["layers.0.attention.wk.weight"]["weight_decay"] == 0.1
    optim.set_lr(opt, 2e-3)  # the trainer's per-iteration call keeps lr_scale
    assert by_name["layers.0.attention.wq.weight"]["lr"] == pytest.approx(1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50, (4, 16), generator=g)
    losses = []
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        model(x, x)
        losses.append(model.last_loss.item())
        model.last_loss.backward()
        opt.step()
    assert losses[-1] < losses[0]
    alphas = opt.step_sizes()
    assert set(alphas) == set(names) and all(a > 0 for a in alphas.values())
    # one more step: alpha = rho * max(eps2, RMS(x before the step)) with scale_parameter
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.zero_grad(set_to_none=True)
    model(x, x)
    model.last_loss.backward()
    opt.step()
    alphas = opt.step_sizes()
    group = by_name["norm.weight"]
    assert group["scale_parameter"]
    for n in ("tok_embeddings.weight", "layers.0.attention.wq.weight", "norm.weight"):
        rho = by_name[n]["lr"]
        rms = before[n].double().pow(2).mean().sqrt().item()
        assert alphas[n] == pytest.approx(rho * max(by_name[n]["eps"][1], rms), rel=1e-5)
    # the logged summary: a few named tensors and the mean
    summary = opt.step_size_metrics()
    assert summary["adafactor_alpha/mean"] == pytest.approx(sum(alphas.values()) / len(alphas))
    assert summary["adafactor_alpha/tok_embeddings.weight"] == alphas["tok_embeddings.weight"]
    assert {"adafactor_alpha/layers.0.attention.wq.weight", "adafactor_alpha/norm.weight"} <= set(summary)

    rel = optim.build_optimizer(tiny_model(), opts({**cfg, "adafactor_relative_step": True,
                                                    "adafactor_warmup_init": True, "adafactor_beta1": 0.9}))
    assert all(gr["lr"] is None and gr["relative_step"] and gr["warmup_init"] and gr["beta1"] == 0.9
               for gr in rel.param_groups)
