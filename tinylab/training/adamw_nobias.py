"""AdamW without bias correction: transformers' AdamW(correct_bias=False), the optimizer
staged-training's gpt_pretrain.py trains with (adam_bias_correction=False; docs/originals.md).

Per parameter, with g its gradient and t counted from 1 (HF transformers 4.8 AdamW.step):

    m <- beta1 m + (1 - beta1) g
    v <- beta2 v + (1 - beta2) g^2
    p <- p - lr m / (sqrt(v) + eps)            no 1 / (1 - beta^t) corrections
    p <- p - lr weight_decay p                 decoupled decay, applied after the update

torch.optim.AdamW has no switch for the corrections, and folding them into lr and eps would
change the rounding, so this is its own optimizer. Its state has AdamW's keys (step as a
one-element tensor, exp_avg, exp_avg_sq), so checkpoints, resume and growth map it as AdamW's.
"""
import torch


class AdamWNoBiasCorrection(torch.optim.Optimizer):
    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      correct_bias=False))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamWNoBiasCorrection does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
                m.mul_(beta1).add_(g, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                p.addcdiv_(m, v.sqrt().add_(eps), value=-lr)
                if decay > 0.0:
                    p.add_(p, alpha=-lr * decay)
        return loss
