"""staged-training's restart of a resumed run (gpt_pretrain.py --restart_steps, --restart_warmup_steps,
--reset_lr_scheduler, --reset_optimizer): the keys, their rules and what they do to the checkpoint
a run continues.

    python train.py ... --resume out/small/ckpt.pt --restart_steps 3319 --restart_warmup_steps 150 \\
        --reset_lr_scheduler [--reset_optimizer]

The original sets the resumed run's step counter to restart_steps + 1 (MyCheckpointConnector,
gpt_pretrain.py:692-693): the LR schedule continues from that position, re-warming linearly from 0
at restart_steps to the schedule's value at restart_steps + restart_warmup_steps
(get_restart_linear_schedule_with_warmup, gpt_pretrain.py:48-88, used when both are non-zero), and
the run stops when the counter reaches train_steps. Here the schedule position is set the same way
(`lr_rewarmup`, optim.lr_at) while iter_num keeps counting, so logs, checkpoints and the data cursor
stay monotone (docs/growth.md §6.3); the run ends after the same number of steps. grow.py's
--restart_steps writes the same record into a grown checkpoint (tinylab/growth/state.py).
"""
from dataclasses import dataclass
from typing import Optional

from tinylab.core.config import NONNEG, Key
from tinylab.core.errors import UserError

RESTART_KEYS = [
    Key("restart_steps", None, "resumed run: its first step is schedule position restart_steps + 1 (staged-training's "
        "--restart_steps; iterations keep counting, the run ends when the position reaches max_iters)", type=int,
        range=NONNEG, nargs=1),
    Key("restart_warmup_steps", 0, "with restart_steps (> 0): the LR re-warms linearly from 0 at restart_steps to the "
        "schedule's value restart_warmup_steps later", range=NONNEG, nargs=1),
    Key("reset_lr_scheduler", False, "with restart_steps: the peak LR is this config's learning_rate; without it the "
        "checkpoint's is kept, as a restored LambdaLR keeps its base_lrs", nargs=0),
    Key("reset_optimizer", False, "resumed run: drop the checkpoint's optimizer state (fresh AdamW moments); iteration, "
        "data position and RNG continue", nargs=0),
]


def restart_rewarmup(iter_num: int, restart_steps: int, restart_warmup_steps: int, base_lr=None) -> dict:
    """The `lr_rewarmup` record (optim.lr_at) that puts the step taken at `iter_num` at schedule
    position restart_steps + 1, re-warming from position restart_steps over restart_warmup_steps
    steps. The original re-warms only when both numbers are non-zero (gpt_pretrain.py:1192);
    `base_lr` (None: the config's) is the peak LR a restored scheduler keeps."""
    iters = restart_warmup_steps if restart_steps else 0
    record = {"start": iter_num, "iters": iters, "shift": iter_num - (restart_steps + 1), "ramp_from": restart_steps,
              "restart_steps": restart_steps}
    if base_lr is not None:
        record["base_lr"] = base_lr
    return record


def check_restart_fits(restart_steps, restart_warmup_steps, max_iters, lr_decay_iters, whose="the run's"):
    """restart_steps must lie before the schedule's end and the re-warmup end by max_iters."""
    s, r = restart_steps, restart_warmup_steps
    if s is None:
        return
    end = lr_decay_iters or max_iters
    if s >= max_iters or s >= end:
        raise UserError(f"--restart_steps={s} is beyond {whose} schedule (max_iters={max_iters}, "
                        f"lr_decay_iters={lr_decay_iters}): the run would have nothing left to train")
    if r > max_iters - s:
        raise UserError(f"--restart_warmup_steps={r} is longer than what is left of {whose} schedule after "
                        f"--restart_steps={s}: max_iters={max_iters} - {s} = {max_iters - s} steps; the run would "
                        f"end inside its re-warmup")


@dataclass(frozen=True)
class RestartOptions:
    restart_steps: Optional[int]  # None: the resumed run continues at its own position
    restart_warmup_steps: int
    reset_lr_scheduler: bool
    reset_optimizer: bool

    @classmethod
    def from_config(cls, cfg) -> "RestartOptions":
        return cls(**{k.name: cfg.get(k.name, k.default) for k in RESTART_KEYS})

    @property
    def given(self) -> bool:
        return self.restart_steps is not None or self.reset_optimizer or self.restart_warmup_steps != 0 \
            or self.reset_lr_scheduler

    def apply(self, ckpt: dict, cfg: dict, log=print) -> dict:
        """The resumed checkpoint with the restart applied (a new dict; `ckpt` is not changed).
        A checkpoint already restarted at restart_steps (a crash-resume of the restarted run, or
        grow.py --restart_steps' output) keeps its position."""
        out = dict(ckpt)
        if self.reset_optimizer:
            out["optimizer"], out["param_names"], out["param_overrides"] = None, None, None
            log("notice: --reset_optimizer: the optimizer state of the checkpoint is dropped (fresh moments)")
        if self.restart_steps is None:
            return out
        old = ckpt.get("lr_rewarmup") or {}
        if old.get("restart_steps") == self.restart_steps and old.get("iters") == self.restart_rewarmup_iters:
            log(f"notice: the checkpoint was already restarted at --restart_steps {self.restart_steps}: it continues "
                f"at its schedule position")
            return out
        saved_lr = (ckpt.get("config") or {}).get("learning_rate")
        base_lr = None if self.reset_lr_scheduler or saved_lr is None else saved_lr
        out["lr_rewarmup"] = restart_rewarmup(ckpt["iter_num"], self.restart_steps, self.restart_warmup_steps, base_lr)
        peak = cfg["learning_rate"] if base_lr is None else base_lr
        log(f"notice: restart: the step after iteration {ckpt['iter_num']} is schedule position "
            f"{self.restart_steps + 1}, re-warming over {self.restart_rewarmup_iters} steps, peak LR {peak:g} "
            f"({'this config' if base_lr is None else 'the checkpoint'}'s); the run ends at position max_iters="
            f"{cfg['max_iters']}")
        return out

    @property
    def restart_rewarmup_iters(self) -> int:
        return self.restart_warmup_steps if self.restart_steps else 0


def check_restart(cfg):
    """The restart flags' rules (train.py): they continue a resumed run, and must fit its schedule."""
    opts = RestartOptions.from_config(cfg)
    if not opts.given:
        return
    if opts.restart_warmup_steps and opts.restart_steps is None:
        raise UserError("--restart_warmup_steps needs --restart_steps (the position the re-warmup starts from)")
    if opts.reset_lr_scheduler and opts.restart_steps is None:
        raise UserError("--reset_lr_scheduler needs --restart_steps: without a restart the resumed run keeps its "
                        "schedule, and there is no restarted scheduler to reset")
    if cfg["init_from"] not in ("resume_train", "resume"):
        raise UserError(f"--restart_steps / --restart_warmup_steps / --reset_lr_scheduler / --reset_optimizer restart a "
                        f"resumed run: give --resume CHECKPOINT (init_from=resume_train), not init_from={cfg['init_from']}")
    check_restart_fits(opts.restart_steps, opts.restart_warmup_steps, cfg["max_iters"], cfg["lr_decay_iters"])
