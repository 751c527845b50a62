"""In-run growth: the Trainer step hook train.py installs when grow_schedule is set.

    grow_schedule="2000:weights,6000:layers"   grow after those iterations
    grow_schedule="auto:weights,layers"        grow when the paper's slope rule fires on the
                                               current model's evaluations (docs/growth.md §7),
                                               these operators in turn ("auto" = one width growth)

The auto rule is rule.should_grow's (method "smoothed": rule.growth_point on the points so far),
fed with each evaluation's `loss/test` against the current model's own compute, flops_per_iter x
schedule position, as the rule is calibrated. Its state (the points, the operators left) is in the
checkpoint, so a resumed run decides exactly as the uninterrupted one. The growth itself is
grow_in_run: the same operator as grow.py, applied to the running state.
"""
from contextlib import nullcontext

import torch

from model import ModelArgs, Transformer
from tinylab.core.checkpoint import load_weights
from tinylab.growth.options import GrowthOptions
from tinylab.growth.rule import should_grow
from tinylab.growth.schedule import parse_auto_growth, parse_grow_schedule
from tinylab.growth.state import grow_checkpoint


class GrowthHook:
    def __init__(self, cfg, state=None):
        self.schedule = parse_grow_schedule(cfg)  # {iteration: operator name}
        state = state or {}
        self.auto = state.get("auto", parse_auto_growth(cfg))  # operators still to apply
        self.points = [tuple(p) for p in state.get("points", [])]  # (compute, loss) of the current model
        self.seen_eval = state.get("seen_eval")

    @classmethod
    def from_config(cls, cfg, ckpt=None):
        """The hook for cfg's grow_schedule (None without one), continuing a checkpoint's state."""
        if not cfg["grow_schedule"].strip():
            return None
        return cls(cfg, ((ckpt or {}).get("hooks") or {}).get("growth"))

    def state_dict(self):
        return {"auto": self.auto, "points": [list(p) for p in self.points], "seen_eval": self.seen_eval}

    def __call__(self, trainer, next_batch):
        doubling = self.schedule.get(trainer.iter_num)
        if doubling is None and self.auto:
            doubling = self._rule(trainer)
        if doubling is not None:
            grow_in_run(trainer, doubling, next_batch)
            self.points = []  # the grown model has its own curve

    def _rule(self, trainer):
        last = trainer.last_eval  # (iteration, metrics) of the latest evaluation
        if last is None or last[0] == self.seen_eval or trainer.best_metric not in last[1]:
            return None
        self.seen_eval = it = last[0]
        position = it - (trainer.lr_rewarmup or {}).get("shift", 0)
        if position <= 0:
            return None
        cfg = trainer.cfg
        tokens = cfg["batch_size"] * cfg["gradient_accumulation_steps"] * cfg["max_seq_len"]
        compute = trainer.raw_model.flops_per_token(cfg["max_seq_len"]) * tokens * position
        self.points.append((compute, float(last[1][trainer.best_metric])))
        compute_so_far, losses = zip(*self.points)
        if should_grow(compute_so_far, losses, self.auto[0]).fire:
            return self.auto.pop(0)
        return None


@torch.no_grad()
def batch_loss(model, batch, autocast=None):
    """The model's loss on one batch (a dict of forward keyword arguments), dropout off."""
    was_training = model.training
    model.eval()
    with autocast or nullcontext():
        model(**{k: v for k, v in batch.items() if k != "loss_scale"}, return_logits=False)
    model.train(was_training)
    return model.last_loss.item()


def grow_in_run(trainer, doubling, batch):
    """Grow the trainer's model and optimizer in-process, at the end of an iteration: the same
    operator as the CLI, applied to the running state's checkpoint dict, then installed (optimizer
    rebuilt, compile/DDP re-wrapped). The data loader is left alone, so no batch repeats. Logs the
    loss on `batch` (the next training batch) just before and after."""
    cfg, run = trainer.cfg, trainer.run
    before = batch_loss(trainer.raw_model, batch, run.autocast)
    small_params = trainer.raw_model.num_params()
    opts = GrowthOptions.from_config(cfg, doubling, seed=cfg["seed"] + trainer.iter_num)
    state = trainer.checkpoint_dict(loader_state=None)
    grown = grow_checkpoint(state, opts, cfg)
    args = ModelArgs.from_dict({**grown["model_args"], "max_seq_len": cfg["max_seq_len"], "dropout": cfg["dropout"]})
    model = Transformer(args).to(device=run.device, dtype=run.param_dtype)  # built in the run's precision
    load_weights(model, grown["model"])
    trainer.install(model, grown)
    after = batch_loss(trainer.raw_model, batch, run.autocast)
    p = trainer.raw_model.params
    rec = {"iter": trainer.iter_num, "doubling": doubling, "mode": opts.mode, "symmetry_breaking": opts.split,
           "loss_before": before, "loss_after": after, "delta_loss": after - before,
           "params_before": small_params, "params_after": trainer.raw_model.num_params(),
           "dim": p.dim, "n_layers": p.n_layers, "n_heads": p.n_heads, "hidden_dim": p.ffn_hidden_dim(),
           "lr_rewarmup": grown.get("lr_rewarmup")}
    if run.master:
        print(f"grew {doubling} at iter {trainer.iter_num}: {small_params / 1e6:.2f}M -> {rec['params_after'] / 1e6:.2f}M "
              f"parameters, loss on the next batch {before:.6f} -> {after:.6f} (delta {after - before:+.2e})")
    trainer.logger.log(rec, kind="growth")
    return rec
