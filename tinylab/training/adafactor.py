"""Adafactor with Hugging Face `transformers` semantics.

    from tinylab.training.adafactor import Adafactor

`Adafactor(params, lr=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8, beta1=None,
weight_decay=0.0, scale_parameter=True, relative_step=True, warmup_init=False)` computes exactly
what `transformers.optimization.Adafactor` computes (docs/t0.md §7), per parameter X
with gradient G and its own step counter t:
    rho   = lr, or with relative_step min(1e-6 t if warmup_init else 1e-2, 1/sqrt(t))
    alpha = rho * max(eps2, RMS(X)) with scale_parameter (RMS before the update), else rho
    beta2 = 1 - t^decay_rate;  Q = G^2 + eps1
    V     = factored over the last two dims for tensors with >= 2 dims (row and column means of Q,
            V_ij = R_i C_j / mean(R)), else an elementwise average of Q
    U     = G / sqrt(V);  U /= max(1, RMS(U) / clip_threshold);  U *= alpha
    M     = beta1 M + (1 - beta1) U and U = M (only when beta1 is not None)
    X    <- X - weight_decay * alpha * X - U
State (moments) and the arithmetic are fp32 (fp64 for fp64 parameters) even for bf16/fp16
parameters, which are updated through an fp32 copy and written back, as HF does.

Project additions, all off by default (so the defaults are HF's numbers):
  - `min_dim_size_to_factor` (keyword): factor only when both of the last two dims are at least
    this large (Mesh-TF/T5 used 128); 0 factors every tensor with >= 2 dims, as HF.
  - `master_weights` (keyword): keep an fp32 master copy of bf16/fp16 parameters in the optimizer
    state. HF re-reads the rounded parameter every step, so relative updates below half a bf16
    ulp (~2e-3; the `t0` preset moves matrices by ~1e-3 of their RMS) round away; with master
    weights they accumulate. A parameter changed from outside is picked up element by element.
  - parameter groups may carry `lr_scale` (optim.py): with relative_step the relative step is
    multiplied by it (without relative_step the group's `lr` already includes it, via set_lr).
    Other extra keys (`param_names`, `role`) are kept untouched.
  - `step_sizes()`: the last effective step size alpha of every parameter, by name, for logging.
  - `load_state_dict` keeps the state in fp32 (torch's default casts it to the parameter dtype).

Why not `torch.optim.Adafactor` (checked against torch 2.13's torch/optim/_adafactor.py)? It is
a different algorithm in the places our presets depend on:
  - rho = min(lr, 1/sqrt(t)): `lr` only caps a time-dependent step; there is no relative_step
    switch, no warmup_init, and the lr it is given is never used as a plain external rate;
  - parameter scaling is always on: scale_parameter=False (the HF T5 recipe, `hf_t5`) cannot be
    expressed;
  - no first moment (beta1);
  - weight decay is X *= 1 - lr*lambda with `lr`, not alpha, applied before the update;
  - eps1 is placed differently: R and C average plain G^2, V is divided by max(mean(R), eps1) and
    clamped at eps1^2, with eps1 defaulting to the dtype's machine epsilon (1.2e-7 fp32, 7.8e-3
    bf16); eps1 = 1e-30 underflows eps1^2 to 0 in fp32 and an all-zero gradient row gives NaN;
  - clipping threshold d must be >= 1;
  - the parameter is updated in its own dtype with state in the gradient's dtype (bf16 state and
    updates for bf16 parameters) and `.item()` host syncs per parameter.
So presets written for HF/T5 (`t0`, `hf_t5`) would silently change meaning; torch's class is used
in the tests only as a cross-check where the two agree.

The config keys (adafactor_preset, adafactor_scale_parameter, ...) are options.py's
(AdafactorOptions), the presets presets.py's, and optim.build_optimizer builds this optimizer from
them; this module is the optimizer alone.
"""
import math

import torch

from tinylab.core.errors import UserError


class AdafactorArgumentError(UserError, ValueError):
    """A bad Adafactor argument: a one-line UserError that is also a ValueError (as HF raises)."""


def _check(ok, msg):
    if not ok:
        raise AdafactorArgumentError(msg)


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Adafactor(torch.optim.Optimizer):
    """Adafactor with HF transformers semantics; see the module docstring."""

    def __init__(self, params, lr=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
                 beta1=None, weight_decay=0.0, scale_parameter=True, relative_step=True,
                 warmup_init=False, *, min_dim_size_to_factor=0, master_weights=False):
        defaults = {"lr": lr, "eps": eps, "clip_threshold": clip_threshold,
                    "decay_rate": decay_rate, "beta1": beta1, "weight_decay": weight_decay,
                    "scale_parameter": scale_parameter, "relative_step": relative_step,
                    "warmup_init": warmup_init, "min_dim_size_to_factor": min_dim_size_to_factor,
                    "master_weights": master_weights}
        self._validate(defaults, "Adafactor", need_lr=False)  # groups may carry their own lr
        super().__init__(params, defaults)

    @staticmethod
    def _validate(g, where, need_lr=True):
        """Raise AdafactorArgumentError (one line) for an invalid setting in group/defaults `g`."""
        lr, relative = g["lr"], g["relative_step"]
        _check(not (lr is not None and relative),
               f"{where}: lr={lr} cannot be combined with relative_step=True (the step size is "
               f"then computed from the step count); pass lr=None or relative_step=False")
        _check(not (g["warmup_init"] and not relative),
               f"{where}: warmup_init=True requires relative_step=True")
        _check(not (need_lr and lr is None and not relative),
               f"{where}: relative_step=False needs an external learning rate (lr=None given)")
        _check(lr is None or (_is_number(lr) and lr >= 0), f"{where}: lr must be >= 0, got {lr!r}")
        eps = g["eps"]
        pair = isinstance(eps, (tuple, list)) and len(eps) == 2
        _check(pair and all(_is_number(e) and e >= 0 for e in eps),
               f"{where}: eps must be a pair (eps1, eps2) of numbers >= 0, got {eps!r} "
               f"(a single AdamW-style eps override does not apply to Adafactor)")
        _check(_is_number(g["clip_threshold"]) and g["clip_threshold"] > 0,
               f"{where}: clip_threshold must be > 0, got {g['clip_threshold']!r}")
        _check(_is_number(g["decay_rate"]) and g["decay_rate"] <= 0,
               f"{where}: decay_rate must be <= 0 (beta2_t = 1 - t^decay_rate), got {g['decay_rate']!r}")
        b1 = g["beta1"]
        _check(b1 is None or (_is_number(b1) and 0 <= b1 < 1),
               f"{where}: beta1 must be None or in [0, 1), got {b1!r}")
        _check(_is_number(g["weight_decay"]) and g["weight_decay"] >= 0,
               f"{where}: weight_decay must be >= 0, got {g['weight_decay']!r}")
        m = g["min_dim_size_to_factor"]
        _check(isinstance(m, int) and not isinstance(m, bool) and m >= 0,
               f"{where}: min_dim_size_to_factor must be an int >= 0, got {m!r}")

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        names = group.get("param_names")
        where = "Adafactor"
        if names or len(self.param_groups) > 1:
            where += f" parameter group {len(self.param_groups) - 1}"
            where += f" ({names[0]}, ...)" if names else ""
        self._validate(group, where)

    @staticmethod
    def _factored(group, shape):
        return len(shape) >= 2 and min(shape[-2], shape[-1]) >= group["min_dim_size_to_factor"]

    @staticmethod
    def _rms(x):
        return x.norm(2) / (x.numel() ** 0.5)

    @staticmethod
    def _relative_step_size(group, t):
        if not group["relative_step"]:
            return group["lr"]
        min_step = 1e-6 * t if group["warmup_init"] else 1e-2
        return min(min_step, 1.0 / math.sqrt(t)) * group.get("lr_scale", 1.0)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or p.numel() == 0:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Adafactor does not support sparse gradients")
                self._step_parameter(group, p)
        return loss

    def _step_parameter(self, group, p):
        """One update of `p` (the formulas of the module docstring), in fp32 (fp64 for fp64)."""
        eps1, eps2 = group["eps"]
        beta1, wd = group["beta1"], group["weight_decay"]
        cdt = torch.promote_types(p.dtype, torch.float32)
        grad = p.grad.to(cdt)
        state = self.state[p]
        factored = self._factored(group, p.shape)
        self._init_state(state, p, cdt, factored, beta1 is not None)
        x = self._working_copy(group, state, p, cdt)
        state["step"] += 1
        t = state["step"]
        rho = self._relative_step_size(group, t)
        alpha = self._rms(x).clamp_(min=eps2).mul_(rho) if group["scale_parameter"] else rho
        beta2t = 1.0 - math.pow(t, group["decay_rate"])
        update = self._normalized_gradient(state, grad, eps1, beta2t, factored)
        update.div_((self._rms(update) / group["clip_threshold"]).clamp_(min=1.0))
        update.mul_(alpha)
        if beta1 is not None:
            m = state["exp_avg"]
            m.mul_(beta1).add_(update, alpha=1.0 - beta1)
            update = m
        if wd != 0:
            if torch.is_tensor(alpha):
                x.add_(x * (alpha * -wd))
            else:
                x.add_(x, alpha=-wd * alpha)
        x.add_(-update)
        if x is not p:
            p.copy_(x)
        state["alpha"] = alpha

    @staticmethod
    def _init_state(state, p, cdt, factored, first_moment):
        """The step count and the moments a parameter's first step needs (zeros, in `cdt`)."""
        shape = p.shape
        if "step" not in state:
            state["step"] = 0
        if first_moment and "exp_avg" not in state:
            state["exp_avg"] = torch.zeros(shape, dtype=cdt, device=p.device)
        if factored and "exp_avg_sq_row" not in state:
            state["exp_avg_sq_row"] = torch.zeros(shape[:-1], dtype=cdt, device=p.device)
            state["exp_avg_sq_col"] = torch.zeros(shape[:-2] + shape[-1:], dtype=cdt, device=p.device)
        if not factored and "exp_avg_sq" not in state:
            state["exp_avg_sq"] = torch.zeros(shape, dtype=cdt, device=p.device)

    @staticmethod
    def _working_copy(group, state, p, cdt):
        """What the update is applied to: `p` itself in fp32 / fp64; for a half-precision `p` an
        fp32 copy, kept in the state as the master weights with master_weights=True."""
        if p.dtype == cdt:
            return p
        if not group["master_weights"]:
            return p.to(cdt)
        master = state.get("master")
        if master is None or master.shape != p.shape:
            master = p.to(cdt)
        else:  # keep the master where it still rounds to the parameter
            master = torch.where(master.to(p.dtype) == p, master, p.to(cdt))
        state["master"] = master
        return master

    @staticmethod
    def _normalized_gradient(state, grad, eps1, beta2t, factored):
        """U = G / sqrt(V) after V's update with this step's Q = G^2 + eps1 (V factored into row
        and column means for a factored tensor)."""
        update = grad.square().add_(eps1)
        if factored:
            row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
            row.mul_(beta2t).add_(update.mean(dim=-1), alpha=1.0 - beta2t)
            col.mul_(beta2t).add_(update.mean(dim=-2), alpha=1.0 - beta2t)
            r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
            c_factor = col.unsqueeze(-2).rsqrt()
            return torch.mul(r_factor, c_factor).mul_(grad)
        v = state["exp_avg_sq"]
        v.mul_(beta2t).add_(update, alpha=1.0 - beta2t)
        return v.rsqrt().mul_(grad)

    def step_sizes(self):
        """{parameter name (or 'group.index'): alpha of its last step} for logging (one host sync)."""
        names, alphas = [], []
        for gi, group in enumerate(self.param_groups):
            group_names = group.get("param_names") or [f"{gi}.{i}" for i in range(len(group["params"]))]
            for name, p in zip(group_names, group["params"]):
                a = self.state.get(p, {}).get("alpha")
                if a is not None:
                    names.append(name)
                    alphas.append(a)
        if not alphas:
            return {}
        # alpha is a 0-dim tensor with scale_parameter, else a float: one stack, one transfer
        device = next((a.device for a in alphas if torch.is_tensor(a)), torch.device("cpu"))
        values = torch.stack([a.detach().float().reshape(()) if torch.is_tensor(a) else torch.tensor(float(a), device=device)
                              for a in alphas]).tolist()
        return dict(zip(names, values))

    def step_size_metrics(self):
        """T0-style logging of the effective step size: alpha of a few named tensors (embedding,
        first layer's wq, last layer's w2, final norm) and the mean over all tensors (not a global
        LR: with scale_parameter alpha is relative to each tensor's RMS)."""
        alphas = self.step_sizes()
        if not alphas:
            return {}
        last = max((int(n.split(".")[1]) for n in alphas if n.startswith("layers.")), default=0)
        named = ["tok_embeddings.weight", "layers.0.attention.wq.weight", f"layers.{last}.feed_forward.w2.weight",
                 "norm.weight"]
        out = {f"adafactor_alpha/{n}": alphas[n] for n in named if n in alphas}
        out["adafactor_alpha/mean"] = sum(alphas.values()) / len(alphas)
        return out

    def load_state_dict(self, state_dict):
        """torch's load casts floating state to the parameter's dtype; keep ours fp32 (copied)."""
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        for idx, saved in state_dict["state"].items():
            p = params[idx]
            cdt = torch.promote_types(p.dtype, torch.float32)
            for k, v in saved.items():
                if torch.is_tensor(v) and v.is_floating_point():
                    self.state[p][k] = v.to(device=p.device, dtype=cdt, copy=True)



