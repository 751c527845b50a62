"""In-run growth: the Trainer step hook train.py installs when grow_schedule is set.

    grow_schedule="2000:weights,6000:layers"   grow after those iterations
    grow_schedule="auto:weights,layers"        grow when the paper's slope rule fires on the
                                               current model's evaluations (docs/growth.md §7),
                                               these operators in turn ("auto" = one width growth)

The auto rule is the planner's (growth_plan.should_grow, method "smoothed": growth.growth_point
on the points so far), fed with each evaluation's `loss/test` against the current model's own
compute, flops_per_iter x schedule position, as the rule is calibrated. Its state (the points, the
operators left) is in the checkpoint, so a resumed run decides exactly as the uninterrupted one.
"""
from tinylab.growth.operators import grow_in_run, parse_auto_growth, parse_grow_schedule
from tinylab.growth.plan import should_grow


class GrowthHook:
    def __init__(self, cfg, state=None):
        self.schedule = parse_grow_schedule(cfg)  # {iteration: "weights" | "layers"}
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
