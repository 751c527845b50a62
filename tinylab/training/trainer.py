"""The one training loop, shared by train.py (language modelling) and finetune_t0.py (packed
multitask finetuning); the run's setup (device, model, run folder) is setup.py's.

A driver hands the Trainer:
  - its options (TrainerOptions.from_config(cfg): intervals, checkpoint rules, optimizer, ...)
    and the resolved config itself as `config`, a record: saved in every checkpoint, shown to
    wandb, read by step hooks (in-run growth), never by the loop;
  - a batch source: an iterator whose items are (x, y) or dicts of model.forward keyword arguments
    (tokens, targets, segment_ids, position_ids, loss_weights, ...) plus an optional "loss_scale" (the
    factor applied to model.last_loss before backward; default 1/micro-steps), and which has
    state_dict() / load_state_dict() so a checkpoint can store its position;
  - an evaluate(model, iter_num, generations) callable returning a dict of metrics (and logging
    any tables itself through trainer.logger);
  - optionally `heads` (probes.LayerHeads: train.py's probes / lenses), trained instead of the
    model, which they freeze: the optimizer, clipping and DDP see the heads only, the checkpoint
    keeps them under their own entry beside "model".
Two kinds of hooks extend it: `step_hooks[name](trainer, next_batch)` after every optimizer step
(in-run growth; a hook with state_dict() is saved in the checkpoint), and
`save_hooks[name](ckpt_path, model)` after every checkpoint rank 0 writes (export_bin's model.bin).

The loop, per iteration (`_fit`): set the LR -> evaluate (on schedule) -> checkpoint (on schedule)
-> stop? -> micro-steps (a fresh batch each, or the first one k times with same_batch_accumulation;
gradient sync only on the last) -> optimizer step
(clip, step) -> log (on log steps) -> step hooks. Host syncs happen only on log steps and before
checkpoints (NaN check).
"""
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from tinylab.core import checkpoint as ckpt_lib
from tinylab.core.distributed import (
    all_gather_object,
    all_reduce_max,
    all_reduce_mean,
    gather_model_state,
    gather_optimizer_state,
    local_shard,
    shard_model,
    shard_optimizer_state,
)
from tinylab.core.errors import UserError
from tinylab.core.metrics import MetricsLogger
from tinylab.core.perf import retain_freed_memory
from tinylab.training.noise import critical_batch_size, grad_sq_norm, step_sample
from tinylab.training.optim import (
    build_optimizer,
    changed_settings,
    clip_grad_norm,
    lr_at,
    optimizer_param_names,
    set_lr,
    state_for,
)
from tinylab.training.options import TrainerOptions
from tinylab.training.warmup import BatchWarmup, truncate


class TrainingDiverged(UserError):
    pass


@dataclass
class _Carry:
    """What the loop carries from one iteration to the next."""
    batch: dict  # the next batch, fetched while the device worked on the previous one
    loader_state: object  # the loader's position before the current iteration's first batch
    loss_sum: torch.Tensor  # sum of the micro-step losses since the last log step (on the device)
    t0: float  # when the last log step ended
    peak_flops: Optional[float]
    iters: int = 0  # iterations since the last log step
    tokens: int = 0  # tokens since the last log step, over all processes
    noise: Optional[tuple] = None  # the log step's gradient-noise sample (noise.step_sample)


@dataclass(frozen=True)
class _Step:
    """The shape of one optimizer step."""
    micro_steps: int  # per process
    rows: Optional[int]  # rows per micro-batch under a batch-size warmup (None: the whole batch)
    seq: Optional[int]  # tokens per row under a warmup (None: the whole window)
    log: bool  # a log step
    noise: bool  # measure the gradient noise (log steps with more than one micro-step)


class Trainer:
    def __init__(self, options: TrainerOptions, run, model, batches, evaluate, ckpt=None, *, config,
                 best_metric="loss/test", generation_every=1, batch_warmup: BatchWarmup = None,
                 critical_batch_size=False, heads=None):
        self.opts, self.run, self.batches, self.evaluate = options, run, batches, evaluate
        self.cfg = config  # the run's resolved config: a record for checkpoints, wandb and hooks
        # probes / lenses (tinylab/eval/probes.py): heads over the frozen model are trained instead of it
        self.heads = heads
        self.best_metric = best_metric
        self.generation_every = generation_every  # evaluations with generations: every N-th one
        self.world = run.dist.world_size
        # language-modelling batches only (train.py): batch-size / sequence-length warmup, and
        # the gradient-noise estimate of the critical batch size on log steps
        self.batch_warmup = batch_warmup.check(self.world) if batch_warmup is not None else None
        self.track_noise = critical_batch_size
        self.tokens_seen = 0  # tokens trained on, over all processes (the warmups' clock)
        self.noise_ema = None  # running means of the estimator's |G|^2 and tr(Sigma) (log steps)
        accum = options.gradient_accumulation_steps
        if accum % self.world != 0:
            raise UserError(f"gradient_accumulation_steps={accum} must be divisible by the number of processes ({self.world})")
        self.micro_steps = accum // self.world
        self.iter_num, self.best_val_loss = 0, 1e9
        self.lr_rewarmup, self.param_overrides = None, None
        self.scaler = torch.amp.GradScaler(run.device_type, enabled=(run.dtype == "float16"))
        self.out_dir = options.start.out_dir
        self.aux_state = {}  # the original's probe / lens entries of a resumed checkpoint, saved back unchanged
        self.wandb_run_id = None  # a resumed checkpoint's wandb run, continued by the logger
        self.install(model, ckpt)
        self.start_iter = self.iter_num
        self.resume_iter = self.iter_num if ckpt is not None else None
        self.logger = None  # opened by start_run (or fit), once nothing can refuse the run any more
        self.stop_requested = False
        self.improved_since_save = False  # always_save_checkpoint=False saves only after an improvement
        # hook(trainer, next_batch) after every optimizer step; train.py installs in-run growth here.
        # A hook with a state_dict() is saved with the checkpoint under checkpoint["hooks"][name]
        self.step_hooks = {}
        self.save_hooks = {}  # hook(ckpt_path, model) after each checkpoint rank 0 writes (export_bin)
        self.last_eval = None  # (iteration, metrics) of the latest evaluation

    def open_log(self):
        """The run's metrics.jsonl (and wandb): a resumed run first drops the records it redoes."""
        if self.logger is None:
            # the same wandb run only when this run goes on in its own out_dir (not grow.py's new folder)
            start = self.opts.start
            self.logger = MetricsLogger(start.out_dir, self.cfg, self.opts.wandb, enabled=self.run.master,
                                        resume_iter=self.resume_iter,
                                        wandb_run_id=self.wandb_run_id if start.in_place else None)
        return self.logger

    # -- model / optimizer / state

    def install(self, raw_model, ckpt=None):
        """(Re)build optimizer and wrappers around `raw_model`; restore state from `ckpt`.
        Also used after in-run growth, with a checkpoint-like dict of the grown state."""
        self.raw_model = raw_model
        # a setting of the run, not of the model: not in model_args, so checkpoints are unchanged
        raw_model.activation_checkpointing = self.opts.activation_checkpointing
        if self.run.fsdp:  # in place, so that the optimizer below holds the sharded parameters
            shard_model(raw_model, self.run.dist, self.run.fsdp_param_dtype)
        self.trained = raw_model if self.heads is None else self.heads.attach(raw_model)  # what the optimizer steps
        if ckpt is not None:
            # per-parameter settings belong to the moments they were made for (exact growth)
            self.param_overrides = ckpt.get("param_overrides") if ckpt.get("optimizer") is not None else None
        self.optimizer = build_optimizer(self.trained, self.opts.optimizer, self.param_overrides)
        if ckpt is not None:
            self.restore(ckpt)
            if self.heads is not None:  # original-format entries of these heads were loaded into them
                self.aux_state = {k: v for k, v in self.aux_state.items() if not k.startswith(self.heads.name + ".")}
        model = self.trained
        if self.opts.compile:
            if self.run.master:
                print("compiling the model... (takes a ~minute)")
            model = torch.compile(model)
        if self.run.dist.enabled and not self.run.fsdp:
            ids = [self.run.dist.local_rank] if self.run.device_type == "cuda" else None
            model = DDP(model, device_ids=ids)
        self.model = model

    def restore(self, ckpt):
        """The whole training state of `ckpt`; its optimizer state when it has one (grow.py
        --reset_optimizer writes none: the optimizer starts fresh, the rest continues)."""
        if ckpt.get("optimizer") is not None and not ckpt_lib.trains_aux_heads(ckpt):
            self._restore_optimizer(ckpt)
        elif self.run.master:
            why = ("its optimizer state is the original's probe / lens heads'" if ckpt.get("optimizer") is not None
                   else "the checkpoint has no optimizer state")
            print(f"notice: {why}: the optimizer starts fresh")
        self.aux_state = ckpt_lib.aux_state(ckpt)
        if self.aux_state and self.run.master:
            print(f"notice: {len(self.aux_state)} probe / lens tensors of the checkpoint are not trained here; "
                  f"they are kept in the checkpoints unchanged")
        self.wandb_run_id = ckpt.get("wandb_run_id")
        self.iter_num = ckpt["iter_num"]
        self.best_val_loss = ckpt.get("best_val_loss", 1e9)
        self.lr_rewarmup = ckpt.get("lr_rewarmup")
        self.tokens_seen = ckpt.get("tokens_seen", 0)
        self.noise_ema = ckpt.get("noise_ema")
        if ckpt.get("scaler") is not None:
            self.scaler.load_state_dict(ckpt["scaler"])
        if ckpt.get("loader") is not None and hasattr(self.batches, "load_state_dict"):
            self.batches.load_state_dict(ckpt["loader"])
        per_rank = ckpt.get("rng_per_rank")
        if per_rank is not None and len(per_rank) == self.world:
            ckpt_lib.set_rng_state(per_rank[self.run.dist.rank])  # exact, also under DDP
        elif ckpt.get("rng") is not None:
            ckpt_lib.set_rng_state(ckpt["rng"])
            # another world size (or ckpt_best.pt): rank 0's state, offset so dropout differs per rank
            if self.run.dist.rank:
                torch.manual_seed(int(torch.randint(0, 2**62, (1,)).item()) + self.run.dist.rank)

    def _restore_optimizer(self, ckpt):
        if ckpt.get("optimizer_name", "adamw") != self.opts.optimizer.name:
            raise UserError(f"checkpoint was trained with optimizer={ckpt.get('optimizer_name')}, config says "
                            f"{self.opts.optimizer.name}; use init_from=resume_model to switch")
        # the state by parameter name, the groups' settings from the config given now (e.g. another
        # weight decay, or a grown model resumed with the target model's config), with a notice
        saved, saved_names = ckpt["optimizer"], ckpt.get("param_names")
        state = state_for(self.optimizer, saved, saved_names)
        changed = changed_settings(self.optimizer, saved, saved_names)
        if self.run.fsdp:  # the checkpoint's full tensors, cut like the sharded parameters
            state = shard_optimizer_state(self.optimizer, state)
        self.optimizer.load_state_dict(state)
        if changed and self.run.master:
            print(f"notice: optimizer settings from the config replace the checkpoint's: {'; '.join(changed)}")

    def checkpoint_dict(self, loader_state, rng_per_rank=None, full_state=None):
        """`full_state`: (model, optimizer) state dicts gathered from the FSDP shards."""
        model_state, optimizer_state = full_state or (self.raw_model.state_dict(), self.optimizer.state_dict())
        return {
            "format_version": ckpt_lib.FORMAT_VERSION,
            "model": {**model_state, **self.aux_state},
            "optimizer": optimizer_state,
            "optimizer_name": self.opts.optimizer.name,
            "param_names": optimizer_param_names(self.optimizer),
            "param_overrides": self.param_overrides,
            "lr_rewarmup": self.lr_rewarmup,
            "model_args": ckpt_lib.model_args_dict(self.raw_model),
            "iter_num": self.iter_num,
            "tokens_seen": self.tokens_seen,
            "noise_ema": self.noise_ema,
            "best_val_loss": self.best_val_loss,
            "config": dict(self.cfg),
            "rng": ckpt_lib.rng_state(),
            "rng_per_rank": rng_per_rank,  # under DDP: every rank's generators, in rank order
            "loader": loader_state,
            "hooks": {name: h.state_dict() for name, h in self.step_hooks.items() if hasattr(h, "state_dict")},
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            **({self.heads.name: self.heads.state_dict()} if self.heads is not None else {}),
            "wandb_run_id": self.logger.wandb_run_id if self.logger is not None else self.wandb_run_id,
        }

    def save(self, loader_state, name="ckpt.pt", rng_per_rank=None):
        """Write out_dir/`name` (rank 0), then call the save hooks with its path and the whole model."""
        self.check_finite(weights=True)
        # FSDP: every rank sends its shards, rank 0 writes the full state as an ordinary ckpt.pt
        full = (gather_model_state(self.raw_model), gather_optimizer_state(self.optimizer, self.run.dist)) if self.run.fsdp else None
        if self.run.master:
            path = os.path.join(self.out_dir, name)
            ckpt = self.checkpoint_dict(loader_state, rng_per_rank, full)
            ckpt_lib.save_checkpoint(ckpt, path)
            print(f"saved checkpoint to {path} (iter {self.iter_num})")
            if self.save_hooks:  # under FSDP the whole model is rebuilt from the gathered state
                model = self.raw_model if full is None else ckpt_lib.model_from_checkpoint(ckpt)
                for hook in self.save_hooks.values():
                    hook(path, model)

    # -- NaN guard without per-step host syncs: remember the first bad iteration on device

    def check_finite(self, weights=False):
        # local check under DDP (no collective, so it may run on rank 0 alone); NaN gradients
        # reach every rank through the all-reduce, and torchrun stops the other ranks when one
        # exits. Before a checkpoint the weights are checked too: a step can overflow them while
        # the loss that produced it was still finite (under FSDP every rank's shard: a collective).
        bad = int(self.first_bad_iter.item())
        if weights and not self.weights_finite() and bad < 0:
            bad = self.iter_num - 1
        if bad >= 0:
            ckpt_path = os.path.join(self.out_dir, "ckpt.pt")
            kept = f"last good checkpoint kept at {ckpt_path}" if os.path.exists(ckpt_path) else "no checkpoint was written"
            raise TrainingDiverged(f"loss or weights became nan/inf at iteration {bad}; training stopped, {kept}")

    def weights_finite(self) -> bool:
        """No nan/inf in the weights; under FSDP on any rank's shard (a collective: every rank
        checks before every checkpoint, FSDP saves being collective anyway)."""
        ok = torch.stack([torch.isfinite(local_shard(p)).all() for p in self.raw_model.parameters()]).all()
        if self.run.fsdp:
            ok = all_reduce_max((~ok).int(), self.run.dist) == 0
        return bool(ok)

    # -- schedule

    def end_iter(self):
        # target-mode growth moves the LR schedule back by `shift` iterations; the run ends when
        # the schedule position (iter_num - shift) reaches max_iters
        return self.opts.max_iters + (self.lr_rewarmup or {}).get("shift", 0)

    def is_eval_iter(self, it):
        o = self.opts
        fine = o.finegrained_log_iters
        if fine and it <= fine and it % max(1, o.finegrained_eval_interval or fine // 10) == 0:
            return True, True
        if it % o.eval_interval == 0 or it == self.end_iter():
            mult = self.generation_every
            return True, (it % (o.eval_interval * mult) == 0 or it == self.end_iter())
        return False, False

    def run_eval(self, it, generations):
        was_training = self.raw_model.training
        self.raw_model.eval()
        with torch.no_grad(), self.run.autocast:
            metrics = self.evaluate(self.raw_model, it, generations)
        self.raw_model.train(was_training)
        if metrics:
            best = metrics.get(self.best_metric)
            improved = best is not None and best < self.best_val_loss
            if improved:
                self.best_val_loss = float(best)
            if self.run.fsdp:  # every rank evaluated (identical numbers): agree anyway, saves are collective
                improved = bool(all_reduce_max(torch.tensor(int(improved), device=self.run.device), self.run.dist).item())
            self.last_eval = (it, metrics)
            parts = " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
            if self.run.master:
                print(f"step {it}: {parts}")
            self.logger.log({"iter": it, **metrics, "best_val_loss": self.best_val_loss}, kind="eval")
            return improved
        return False

    # -- the loop

    def fit(self):
        run = self.run
        self.open_log()
        if run.device_type == "cpu":
            retain_freed_memory()  # no page faults for each step's big tensors (tinylab/core/perf.py)
        self.first_bad_iter = torch.full((), -1, dtype=torch.long, device=run.device)
        # every rank handles SIGINT (torchrun forwards it to all); they agree on the stop iteration
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            return self._fit()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            self.logger.close()

    def _on_sigint(self, signum, frame):
        if self.stop_requested:
            raise KeyboardInterrupt
        print("\ninterrupt: finishing this iteration and saving a checkpoint (Ctrl-C again to abort)", file=sys.stderr)
        self.stop_requested = True

    def _fit(self):
        carry = self._begin()
        while True:
            it = self.iter_num
            lr = lr_at(it, self.opts.optimizer.schedule, self.lr_rewarmup)
            set_lr(self.optimizer, lr)
            improved = self._evaluate_on_schedule(it, carry.loader_state)
            if self.opts.eval_only:
                return "eval_only"
            stop = self._stop_agreed(it)
            self._checkpoint_on_schedule(it, improved, stop, carry.loader_state)
            if it >= self.end_iter():
                return "done"
            if stop:
                print(f"stopped at iteration {it}; resume with --init_from=resume_train --out_dir={self.out_dir}")
                return "interrupted"
            step = self._plan_step(it)
            self._micro_steps(step, carry)
            self._optimizer_step(it, carry)
            if step.log:
                self._log_step(it, lr, step, carry)
            for hook in self.step_hooks.values():  # after the step: a checkpoint of iter_num sees what it did
                hook(self, carry.batch)

    def _begin(self) -> _Carry:
        loader_state = self._loader_state()
        return _Carry(batch=self._next_batch(), loader_state=loader_state, t0=time.time(),
                      loss_sum=torch.zeros((), device=self.run.device), peak_flops=self.run.peak_flops())

    def _loader_state(self):
        return self.batches.state_dict() if hasattr(self.batches, "state_dict") else None

    def _next_batch(self):
        batch = next(self.batches)
        if isinstance(batch, (tuple, list)):
            batch = {"tokens": batch[0], "targets": batch[1]}
        return batch

    # -- evaluation, stopping and checkpoints, before the step

    def _evaluate_on_schedule(self, it, loader_state) -> bool:
        """Evaluate when it is time (always with eval_only); True when the best metric improved
        (ckpt_best.pt is rewritten then, with keep_best_checkpoint)."""
        o = self.opts
        do_eval, do_gen = (True, True) if o.eval_only else self.is_eval_iter(it)
        # FSDP: every rank takes part in the sharded model's forward passes (and in the save)
        if not (do_eval and (self.run.master or self.run.fsdp)):
            return False
        improved = self.run_eval(it, do_gen)
        self.improved_since_save |= improved
        if improved and o.keep_best_checkpoint and it > 0 and not o.eval_only:
            self.save(loader_state, "ckpt_best.pt")
        return improved

    def _stop_agreed(self, it) -> bool:
        """Whether this iteration stops after a Ctrl-C: every rank must stop at the same one,
        agreed on log steps only, which sync anyway (an all-reduce + .item() every step would
        stall the GPU)."""
        if not self.run.dist.enabled:
            return self.stop_requested
        if it % self.opts.log_interval != 0:
            return False
        flag = torch.tensor(int(self.stop_requested), device=self.run.device)
        return bool(all_reduce_max(flag, self.run.dist).item())

    def _checkpoint_on_schedule(self, it, improved, stop, loader_state):
        """ckpt.pt every checkpoint_interval (as the save rules allow), at the end, and on a stop."""
        o, final = self.opts, it >= self.end_iter() or stop
        on_schedule = it % o.every_checkpoint == 0
        if not (it > self.start_iter and (on_schedule or final)):
            return
        # every rank's generators (dropout masks differ per rank), gathered on a schedule all
        # ranks share, so that a DDP run resumes exactly too
        rng = all_gather_object(ckpt_lib.rng_state(), self.run.dist)
        if o.save_best_model:  # the study's rule: this iteration's evaluation is a new best
            periodic = on_schedule and improved
        else:
            periodic = on_schedule and (o.always_save_checkpoint or self.improved_since_save)
        if periodic or final:
            self.save(loader_state, rng_per_rank=rng)
            self.improved_since_save = False

    # -- the step

    def _plan_step(self, it) -> _Step:
        micro_steps, rows, seq = self.micro_steps, None, None
        if self.batch_warmup is not None:
            micro_steps, rows, seq = self.batch_warmup.plan(self.tokens_seen, self.world)
        log = it % self.opts.log_interval == 0
        # the noise estimate needs a second gradient: the first micro-step's, which is local (of
        # another batch: with same_batch_accumulation the two would be the same gradient)
        noise = self.track_noise and log and micro_steps > 1 and not self.opts.same_batch_accumulation
        return _Step(micro_steps, rows, seq, log, noise=noise)

    def _micro_steps(self, step: _Step, carry: _Carry):
        """Forward / backward over the step's micro-batches, each a fresh batch; the next batch is
        fetched while the device works (prefetch), and the loader's position just before the next
        iteration's first batch is remembered for checkpoints. With same_batch_accumulation (the
        study's train.py) every micro-step forwards the step's first batch, and the batches
        fetched meanwhile are dropped but the last, which the next step trains on."""
        run = self.run
        for micro_step in range(step.micro_steps):
            last = micro_step == step.micro_steps - 1
            self._sync_gradients(last or (step.noise and micro_step == 0))
            if micro_step == 0 or not self.opts.same_batch_accumulation:
                batch = carry.batch
                scale = batch.pop("loss_scale", 1.0 / step.micro_steps)
                if step.rows is not None:
                    batch = truncate(batch, step.rows, step.seq)
            with run.autocast:
                self.model(**batch, return_logits=False)  # fused head + loss, no logits
                loss = self.trained.last_loss * scale
            micro_rows, micro_tokens = batch["tokens"].shape[0], batch["tokens"].numel()
            if last:
                carry.loader_state = self._loader_state()
            carry.batch = self._next_batch()
            self.scaler.scale(loss).backward()
            carry.loss_sum += loss.detach().float()
            if step.noise and micro_step == 0:
                g_small = grad_sq_norm(self.trained, run) / scale ** 2  # one micro-batch's gradient, squared norm
        step_tokens = micro_tokens * step.micro_steps * self.world
        self.tokens_seen += step_tokens
        carry.tokens += step_tokens
        if step.noise:
            carry.noise = step_sample(g_small, self.trained, run, self.scaler, micro_rows, step.micro_steps)

    def _sync_gradients(self, sync: bool):
        """Whether this micro-step's backward reduces the gradients over the processes."""
        if self.run.fsdp:  # reduce-scatter on the last micro-step only (FSDP's no_sync); FSDP keeps
            # unsynced gradients inside itself, so the noise estimate syncs the first one too
            self.raw_model.set_requires_gradient_sync(sync)
        elif self.run.dist.enabled:
            self.model.require_backward_grad_sync = sync

    def _optimizer_step(self, it, carry: _Carry):
        if self.opts.grad_clip > 0.0:
            self.scaler.unscale_(self.optimizer)
            clip_grad_norm(self.trained, self.opts.grad_clip, self.param_overrides)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.first_bad_iter = torch.where((self.first_bad_iter < 0) & ~torch.isfinite(carry.loss_sum),
                                          it, self.first_bad_iter)  # a Python int: no host-to-device copy
        carry.iters += 1
        self.iter_num = it + 1

    # -- logging, after the step

    def _log_step(self, it, lr, step: _Step, carry: _Carry):
        """The loss since the last log step (the global mean over micro-steps and ranks: one host
        sync per log step), speed and MFU, and the step's extras; then the counters restart."""
        lossf = all_reduce_mean(carry.loss_sum / carry.iters, self.run.dist).item()
        t1 = time.time()
        dt = (t1 - carry.t0) / carry.iters
        carry.t0 = t1
        if not math.isfinite(lossf):
            self.check_finite()
        tokens_per_iter = carry.tokens / carry.iters  # varies during a batch / sequence warmup
        # per process: each process's share of the tokens against one device's peak
        mfu = self.raw_model.estimate_mfu(tokens_per_iter / self.world, dt, carry.peak_flops,
                                          step.seq or self.opts.max_seq_len)
        noise_metrics = {}
        if carry.noise is not None:
            self.noise_ema, noise_metrics = critical_batch_size(self.noise_ema, *carry.noise)
        if self.run.master:
            mfu_s = f" | mfu {mfu * 100:.2f}%" if mfu is not None else ""
            print(f"{it} | loss {lossf:.4f} | lr {lr:e} | {dt * 1000:.2f}ms | {tokens_per_iter / dt:,.0f} tok/s{mfu_s}")
            rec = {"iter": it, "loss/train": lossf, "lr": lr, "ms_per_iter": dt * 1000, "tokens_per_s": tokens_per_iter / dt}
            if mfu is not None:
                rec["mfu"] = mfu
            if self.batch_warmup is not None:
                rec.update(batch_size=step.rows * step.micro_steps * self.world, seq_len=step.seq,
                           tokens_seen=self.tokens_seen)
            rec.update(noise_metrics)
            if hasattr(self.optimizer, "step_size_metrics"):  # Adafactor: its effective step sizes
                rec.update(self.optimizer.step_size_metrics())
            self.logger.log(rec, kind="train", wandb_prefix_map={"loss/train": "train/loss"})
        carry.loss_sum.zero_()
        carry.iters = carry.tokens = 0
        carry.noise = None
