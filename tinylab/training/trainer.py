"""The one training loop, shared by train.py (language modelling) and finetune_t0.py (packed
multitask finetuning), plus the run setup both need: device/dtype, DDP or FSDP2 (parallelism=fsdp:
the model sharded in place before the optimizer is built, evaluation on every rank, checkpoints
gathered on rank 0; docs/training.md), model initialisation (scratch / resume_train /
resume_model), checkpoints with exact resume.

A driver hands the Trainer:
  - a batch source: an iterator whose items are (x, y) or dicts of model.forward keyword arguments
    (tokens, targets, segment_ids, position_ids, loss_weights, ...) plus an optional "loss_scale" (the
    factor applied to model.last_loss before backward; default 1/micro-steps), and which has
    state_dict() / load_state_dict() so a checkpoint can store its position;
  - an evaluate(model, iter_num, generations) callable returning a dict of metrics (and logging
    any tables itself through trainer.logger);
  - optionally `heads` (probes.LayerHeads: train.py's probes / lenses), trained instead of the
    model, which they freeze: the optimizer, clipping and DDP see the heads only, the checkpoint
    keeps them under their own entry beside "model".

The loop, per iteration: set LR -> evaluate (on schedule) -> checkpoint (on schedule) -> stop?
-> micro-steps (a fresh batch each, gradient sync only on the last) -> clip -> step -> log.
Host syncs happen only on log steps and before checkpoints (NaN check).
"""
import gc
import math
import os
import signal
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from model import ModelArgs, Transformer
from tinylab.core import checkpoint as ckpt_lib
from tinylab.core import memory_budget
from tinylab.core.distributed import (
    all_gather_object,
    all_reduce_max,
    all_reduce_mean,
    barrier,
    check_fsdp_setting,
    cleanup,
    gather_model_state,
    gather_optimizer_state,
    init_distributed,
    local_shard,
    shard_model,
    shard_optimizer_state,
)
from tinylab.core.errors import UserError
from tinylab.core.metrics import MetricsLogger
from tinylab.core.perf import retain_freed_memory
from tinylab.core.rundir import RunDir
from tinylab.interop.llama2c import export_bin
from tinylab.training.optim import (
    build_optimizer,
    changed_settings,
    clip_grad_norm,
    lr_at,
    optimizer_param_names,
    set_lr,
    state_for,
)
from tinylab.training.warmup import BatchWarmup, truncate

# dense bf16 peak FLOP/s by device name substring, for MFU (override with peak_flops=...)
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}
MODEL_SHAPE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim", "multiple_of", "tie_embeddings")


class TrainingDiverged(UserError):
    pass


# ---------------------------------------------------------------------- run setup

def resolve_device(cfg):
    if cfg["device"]:
        return cfg["device"]
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_dtype(cfg, device):
    return cfg["dtype"] or ("bfloat16" if device.startswith("cuda") and torch.cuda.is_bf16_supported()
                            else "float16" if device.startswith("cuda") else "float32")


class Run:
    """Device, precision and process-group facts of this process."""

    def __init__(self, cfg):
        device = resolve_device(cfg)
        # parallelism=fsdp: parameters, gradients and optimizer state sharded (FSDP2), also in one process
        self.fsdp = cfg.get("parallelism", "ddp") == "fsdp"
        if self.fsdp:  # the resolved device / dtype (schema.py checks the ones the config names)
            check_fsdp_setting(device, resolve_dtype(cfg, device))
        self.dist = init_distributed(device, own_group=self.fsdp)
        self.device = self.dist.device
        self.device_type = "cuda" if self.device.startswith("cuda") else ("mps" if self.device.startswith("mps") else "cpu")
        self.dtype = resolve_dtype(cfg, self.device)
        self.master = self.dist.is_master
        # FSDP on CUDA in bf16: blocks compute in bf16 after the all-gather, gradients reduce in fp32
        self.fsdp_param_dtype = torch.bfloat16 if self.fsdp and self.device_type == "cuda" and self.dtype == "bfloat16" else None
        # fp32 / fp64 run without autocast; half precision autocasts matmuls, weights stay fp32
        self.param_dtype = torch.float64 if self.dtype == "float64" else torch.float32
        if self.dtype in ("bfloat16", "float16"):
            self.autocast = torch.amp.autocast(device_type=self.device_type, dtype=getattr(torch, self.dtype))
        else:
            self.autocast = nullcontext()
        if self.device_type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    def peak_flops(self, cfg):
        if cfg["peak_flops"]:
            return cfg["peak_flops"]
        if self.device_type == "cuda" and self.dtype in ("bfloat16", "float16"):
            name = torch.cuda.get_device_name(self.device)
            for key, flops in PEAK_FLOPS.items():
                if key in name:
                    return flops
        return None

    def close(self):
        cleanup(self.dist)


def seed_everything(seed):
    import random
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def model_args_from_config(cfg) -> ModelArgs:
    return ModelArgs(dim=cfg["dim"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"],
                     n_kv_heads=cfg["n_kv_heads"] or cfg["n_heads"], vocab_size=cfg["vocab_size"],
                     hidden_dim=cfg["hidden_dim"] or None, multiple_of=cfg["multiple_of"],
                     max_seq_len=cfg["max_seq_len"], dropout=cfg["dropout"], tie_embeddings=cfg["tie_embeddings"])


def resumes_run(cfg) -> bool:
    """init_from=resume_train (or llama2.c's "resume"): the run in out_dir goes on."""
    return cfg["init_from"] in ("resume_train", "resume")


def in_place(cfg) -> bool:
    """resume_train continuing out_dir's own ckpt.pt (not a --resume_ckpt from elsewhere, such as
    grow.py's <ckpt>.doubled_weights: that run starts a new folder)."""
    if not resumes_run(cfg):
        return False
    own = os.path.join(cfg["out_dir"], "ckpt.pt")
    return not cfg["resume_ckpt"] or os.path.abspath(cfg["resume_ckpt"]) == os.path.abspath(own)


def checkpoint_path(cfg):
    """The ckpt.pt that init_from=resume_train (out_dir, or resume_ckpt) or resume_model
    (model_dir) loads."""
    init_from = cfg["init_from"]
    if resumes_run(cfg) and cfg["resume_ckpt"]:
        if not os.path.isfile(cfg["resume_ckpt"]):
            raise UserError(f"--resume_ckpt={cfg['resume_ckpt']}: no such checkpoint file")
        return cfg["resume_ckpt"]
    where = cfg["out_dir"] if resumes_run(cfg) else cfg["model_dir"]
    if not where:
        raise UserError("init_from=resume_model needs --model_dir=DIR (a folder holding ckpt.pt)")
    path = where if where.endswith(".pt") else os.path.join(where, "ckpt.pt")
    if not os.path.exists(path):
        hint = "train one first or check --out_dir" if init_from != "resume_model" else "check --model_dir"
        raise UserError(f"init_from={init_from}: no checkpoint at {path} ({hint})")
    return path


def init_model(cfg, run: Run, log=print, ckpt=None):
    """Return (model, loaded checkpoint or None) for cfg['init_from']; pass the checkpoint to
    Trainer only for resume_train (see `training_state`).

    scratch       a new model from the config's shape.
    resume_train  continue the run in out_dir (everything restored later by Trainer).
    resume_model  weights of model_dir/ckpt.pt, fresh optimizer and iteration 0 (fine-tuning).
    On resume the shape comes from the checkpoint (so a grown checkpoint resumes with the small
    model's config file); max_seq_len and dropout come from the config. A driver that already
    read the checkpoint (finetune_t0.py needs its context length first) passes it as `ckpt`.
    A checkpoint read here is checked for the memory the run needs with its shape
    (memory_budget.check_training) before the model is built; the drivers check a shape they
    know before the run folder is opened.
    """
    if cfg["init_from"] == "scratch":
        model, ckpt = Transformer(model_args_from_config(cfg)), None
    else:
        path = checkpoint_path(cfg)
        if ckpt is None:
            ckpt = ckpt_lib.load_checkpoint(path)
            memory_budget.check_training(cfg, run, memory_budget.Shape.from_model_args(ckpt["model_args"]))
        saved = ckpt["model_args"]
        differs = [f"{k}={saved.get(k)} (config {cfg.get(k)})" for k in MODEL_SHAPE_KEYS
                   if k in cfg and k in saved and cfg.get(k) not in (None, 0) and saved.get(k) is not None
                   and saved.get(k) != cfg.get(k)]
        if differs and run.master:
            log(f"notice: model shape taken from {path}: " + ", ".join(differs))
        model = ckpt_lib.model_from_checkpoint(ckpt, max_seq_len=cfg["max_seq_len"], dropout=cfg["dropout"])
    return model.to(device=run.device, dtype=run.param_dtype), ckpt


def training_state(cfg, ckpt, reset_progress=False):
    """The checkpoint whose optimizer/iteration/RNG/loader state a Trainer should restore: the
    whole one for resume_train; with `reset_progress` (finetune_t0.py's key) the optimizer state
    alone (progress_reset); else None."""
    if resumes_run(cfg):
        return ckpt
    return progress_reset(cfg, ckpt) if reset_progress and ckpt is not None else None


def progress_reset(cfg, ckpt):
    """Megatron's --reset-progress without --no-load-optim (checkpointing.py, branch t0loading):
    the checkpoint's optimizer state (moments; Adafactor's per-tensor step counts) is kept, while
    the iteration count (so the LR schedule), the data position, best loss, token count, RNG and
    wandb run start afresh, as with plain init_from=resume_model. (Megatron also loaded its LR
    scheduler's step count; here the schedule restarts at 0.)"""
    where = checkpoint_path(cfg)
    if ckpt.get("optimizer") is None or ckpt_lib.trains_aux_heads(ckpt):
        raise UserError(f"reset_progress=True keeps the optimizer state of {where}, which has none for this model "
                        f"(written without it, or by probe / lens training); use reset_progress=False")
    if ckpt.get("optimizer_name", "adamw") != cfg["optimizer"]:
        raise UserError(f"reset_progress=True keeps {where}'s {ckpt.get('optimizer_name', 'adamw')} state, but the "
                        f"config says optimizer={cfg['optimizer']}; set optimizer={ckpt.get('optimizer_name', 'adamw')} "
                        f"or reset_progress=False (a fresh optimizer)")
    kept = ("optimizer", "optimizer_name", "param_names", "param_overrides", "model_args")
    return {"model": {}, "iter_num": 0, **{k: ckpt.get(k) for k in kept}}


def open_run_folder(cfg, run) -> RunDir:
    """out_dir, created and locked by rank 0 for the whole run (use it as a context manager);
    a new run (scratch, resume_model, resume_train from a resume_ckpt elsewhere) must not land on
    an old one unless cfg["overwrite"]."""
    rd = RunDir(cfg["out_dir"], enabled=run.master).open()
    try:
        if not in_place(cfg):
            rd.check_new_run(cfg["overwrite"])
    except BaseException:
        rd.close()
        raise
    return rd


def start_run(rd: RunDir, cfg, trainer=None):
    """Everything is checked and loaded (the Trainer has accepted the checkpoint's optimizer
    state): move an old run aside (overwrite=True), open the trainer's metrics log (on resume:
    drop the records the resumed run redoes), write the resolved config.json, and keep the folder
    from now on. A run refused before this point leaves an old run's files as they were; a new
    run that fails before it did any work (RunDir.did_work: no checkpoint, no training record)
    removes the files it wrote again (RunDir.close), an in-place resume never."""
    if not in_place(cfg) and cfg["overwrite"]:
        rd.move_aside()
    if trainer is not None:
        rd.track("metrics.jsonl")
        trainer.open_log()
    rd.write_json("config.json", cfg)
    rd.commit(rollback=not in_place(cfg))


def fit_and_close(trainer, run):
    """A driver's last step: train, release the process group; after a Ctrl-C stop (checkpoint
    written, resume hint printed) a KeyboardInterrupt, so that cli_main ends the process as after
    any Ctrl-C: "error: interrupted" as the last line on stderr, exit 130.

    Under DDP every rank waits for the others (rank 0 may still be writing the last checkpoint)
    before the process group is destroyed: tearing gloo down while a peer is busy can abort the
    process at exit ("terminate called without an active exception"). After an error the group is
    left alone (a collective with a failed peer would hang) and torchrun stops the other ranks."""
    status = trainer.fit()
    barrier(run.dist)
    # the DDP wrapper's reducer holds the process group: free it first, so the group's gloo
    # threads are joined here and not during interpreter teardown
    trainer.model = trainer.raw_model
    gc.collect()
    run.close()
    if status == "interrupted":
        raise KeyboardInterrupt


def bin_name(ckpt_name: str) -> str:
    """export_bin's file beside a checkpoint: ckpt.pt -> model.bin, ckpt_best.pt -> model_best.bin."""
    return "model" + ckpt_name[len("ckpt"):-len(".pt")] + ".bin"


def grad_sq_norm(model, run=None) -> torch.Tensor:
    """Sum of the squared gradients of `model` (a device tensor: no host sync); under FSDP
    (`run.fsdp`) over all ranks' gradient shards (an all-reduce)."""
    grads = [local_shard(p.grad) for p in model.parameters() if p.grad is not None]
    total = torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum()
    return all_reduce_mean(total, run.dist) * run.dist.world_size if run is not None and run.fsdp else total


# ---------------------------------------------------------------------- the loop

class Trainer:
    def __init__(self, cfg, run: Run, model, batches, evaluate, ckpt=None, best_metric="loss/test",
                 generation_every=1, batch_warmup: BatchWarmup = None,
                 critical_batch_size=False, heads=None):
        self.cfg, self.run, self.batches, self.evaluate = cfg, run, batches, evaluate
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
        accum = cfg["gradient_accumulation_steps"]
        if accum % self.world != 0:
            raise UserError(f"gradient_accumulation_steps={accum} must be divisible by the number of processes ({self.world})")
        self.micro_steps = accum // self.world
        self.iter_num, self.best_val_loss = 0, 1e9
        self.lr_rewarmup, self.param_overrides = None, None
        self.scaler = torch.amp.GradScaler(run.device_type, enabled=(run.dtype == "float16"))
        self.out_dir = cfg["out_dir"]
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
        self.last_eval = None  # (iteration, metrics) of the latest evaluation

    def open_log(self):
        """The run's metrics.jsonl (and wandb): a resumed run first drops the records it redoes."""
        if self.logger is None:
            # the same wandb run only when this run goes on in its own out_dir (not grow.py's new folder)
            self.logger = MetricsLogger(self.out_dir, self.cfg, enabled=self.run.master, resume_iter=self.resume_iter,
                                        wandb_run_id=self.wandb_run_id if in_place(self.cfg) else None)
        return self.logger

    # -- model / optimizer / state

    def install(self, raw_model, ckpt=None):
        """(Re)build optimizer and wrappers around `raw_model`; restore state from `ckpt`.
        Also used after in-run growth, with a checkpoint-like dict of the grown state."""
        self.raw_model = raw_model
        # a setting of the run, not of the model: not in model_args, so checkpoints are unchanged
        raw_model.activation_checkpointing = self.cfg["activation_checkpointing"]
        if self.run.fsdp:  # in place, so that the optimizer below holds the sharded parameters
            shard_model(raw_model, self.run.dist, self.run.fsdp_param_dtype)
        self.trained = raw_model if self.heads is None else self.heads.attach(raw_model)  # what the optimizer steps
        if ckpt is not None:
            # per-parameter settings belong to the moments they were made for (exact growth)
            self.param_overrides = ckpt.get("param_overrides") if ckpt.get("optimizer") is not None else None
        self.optimizer = build_optimizer(self.trained, self.cfg, self.param_overrides)
        if ckpt is not None:
            self.restore(ckpt)
            if self.heads is not None:  # original-format entries of these heads were loaded into them
                self.aux_state = {k: v for k, v in self.aux_state.items() if not k.startswith(self.heads.name + ".")}
        model = self.trained
        if self.cfg["compile"]:
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
        if ckpt.get("optimizer_name", "adamw") != self.cfg["optimizer"]:
            raise UserError(f"checkpoint was trained with optimizer={ckpt.get('optimizer_name')}, config says "
                            f"{self.cfg['optimizer']}; use init_from=resume_model to switch")
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
            "optimizer_name": self.cfg["optimizer"],
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
        self.check_finite(weights=True)
        # FSDP: every rank sends its shards, rank 0 writes the full state as an ordinary ckpt.pt
        full = (gather_model_state(self.raw_model), gather_optimizer_state(self.optimizer, self.run.dist)) if self.run.fsdp else None
        if self.run.master:
            path = os.path.join(self.out_dir, name)
            ckpt = self.checkpoint_dict(loader_state, rng_per_rank, full)
            ckpt_lib.save_checkpoint(ckpt, path)
            print(f"saved checkpoint to {path} (iter {self.iter_num})")
            if self.cfg["export_bin"]:  # beside it, as the original did (llama2.c v0, for run.c)
                model = self.raw_model if full is None else ckpt_lib.model_from_checkpoint(ckpt)
                export_bin(model, os.path.join(self.out_dir, bin_name(name)), 0)

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
        return self.cfg["max_iters"] + (self.lr_rewarmup or {}).get("shift", 0)

    def is_eval_iter(self, it):
        c = self.cfg
        fine = c["finegrained_log_iters"]
        if fine and it <= fine and it % max(1, c["finegrained_eval_interval"] or fine // 10) == 0:
            return True, True
        if it % c["eval_interval"] == 0 or it == self.end_iter():
            mult = self.generation_every
            return True, (it % (c["eval_interval"] * mult) == 0 or it == self.end_iter())
        return False, False

    def critical_batch_size(self, g_small, g_big, b_small, b_big):
        """The gradient-noise estimate of the critical batch size (McCandlish et al. 2018, App. A;
        staged-training logs it to decide when to grow): from the squared norms of one
        micro-batch's gradient (b_small sequences) and of the whole step's (b_big sequences),
            |G|^2 ~ (b_big |g_big|^2 - b_small |g_small|^2) / (b_big - b_small)
            S     ~ (|g_small|^2 - |g_big|^2) / (1/b_small - 1/b_big)
        B_crit = S / |G|^2, in sequences. A single step's estimate is noisy (it can be negative),
        so the logged `critical_batch_size` is the ratio of running means (decay 0.9) over log
        steps, the step's own ratio `critical_batch_size_step`. (The original plugged gradient
        norms, not squared norms, into these formulas.)"""
        g_small, g_big = float(g_small), float(g_big)
        g2 = (b_big * g_big - b_small * g_small) / (b_big - b_small)
        trace = (g_small - g_big) / (1.0 / b_small - 1.0 / b_big)
        ema = self.noise_ema or {"g2": g2, "trace": trace}
        ema = {"g2": 0.9 * ema["g2"] + 0.1 * g2, "trace": 0.9 * ema["trace"] + 0.1 * trace}
        self.noise_ema = ema
        return {"critical_batch_size": ema["trace"] / ema["g2"] if ema["g2"] > 0 else float("nan"),
                "critical_batch_size_step": trace / g2 if g2 != 0 else float("nan")}

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

    def _next_batch(self):
        batch = next(self.batches)
        if isinstance(batch, (tuple, list)):
            batch = {"tokens": batch[0], "targets": batch[1]}
        return batch

    def _fit(self):
        cfg, run = self.cfg, self.run
        ckpt_interval = cfg["checkpoint_interval"] or cfg["eval_interval"]
        peak = run.peak_flops(cfg)
        loader_state = self.batches.state_dict() if hasattr(self.batches, "state_dict") else None
        batch = self._next_batch()
        t0 = time.time()
        loss_sum = torch.zeros((), device=run.device)
        iters_since_log = tokens_since_log = 0
        noise_sample = None
        while True:
            it = self.iter_num
            lr = lr_at(it, cfg, self.lr_rewarmup)
            set_lr(self.optimizer, lr)

            do_eval, do_gen = self.is_eval_iter(it)
            if cfg["eval_only"]:
                do_eval, do_gen = True, True
            improved = False
            # FSDP: every rank takes part in the sharded model's forward passes (and in the save)
            if do_eval and (run.master or run.fsdp):
                improved = self.run_eval(it, do_gen)
                self.improved_since_save |= improved
                if improved and cfg["keep_best_checkpoint"] and it > 0 and not cfg["eval_only"]:
                    self.save(loader_state, "ckpt_best.pt")
            if cfg["eval_only"]:
                return "eval_only"
            stop = self.stop_requested
            if run.dist.enabled:
                # every rank must stop at the same iteration; agreed on log steps only, which
                # sync anyway (an all-reduce + .item() every step would stall the GPU)
                if it % cfg["log_interval"] == 0:
                    stop = bool(all_reduce_max(torch.tensor(int(stop), device=run.device), run.dist).item())
                else:
                    stop = False
            if it > self.start_iter and (it % ckpt_interval == 0 or it >= self.end_iter() or stop):
                # every rank's generators (dropout masks differ per rank), gathered on a schedule
                # all ranks share, so that a DDP run resumes exactly too
                rng = all_gather_object(ckpt_lib.rng_state(), run.dist)
                if cfg["save_best_model"]:  # the study's rule: this iteration's evaluation is a new best
                    periodic = it % ckpt_interval == 0 and improved
                else:
                    periodic = it % ckpt_interval == 0 and (cfg["always_save_checkpoint"] or self.improved_since_save)
                if periodic or it >= self.end_iter() or stop:
                    self.save(loader_state, rng_per_rank=rng)
                    self.improved_since_save = False
            if it >= self.end_iter():
                return "done"
            if stop:
                print(f"stopped at iteration {it}; resume with --init_from=resume_train --out_dir={self.out_dir}")
                return "interrupted"

            # forward / backward over micro-batches, each a fresh batch
            micro_steps, rows, seq = self.micro_steps, None, None
            if self.batch_warmup is not None:
                micro_steps, rows, seq = self.batch_warmup.plan(self.tokens_seen, self.world)
            log_step = it % cfg["log_interval"] == 0
            noise = self.track_noise and log_step and micro_steps > 1  # the first micro-step's gradient is local
            for micro_step in range(micro_steps):
                if run.fsdp:  # reduce-scatter on the last micro-step only (FSDP's no_sync); FSDP keeps
                    # unsynced gradients inside itself, so the noise estimate syncs the first one too
                    self.raw_model.set_requires_gradient_sync(micro_step == micro_steps - 1 or (noise and micro_step == 0))
                elif run.dist.enabled:
                    self.model.require_backward_grad_sync = micro_step == micro_steps - 1
                scale = batch.pop("loss_scale", 1.0 / micro_steps)
                if rows is not None:
                    batch = truncate(batch, rows, seq)
                with run.autocast:
                    self.model(**batch, return_logits=False)  # fused head + loss, no logits
                    loss = self.trained.last_loss * scale
                micro_rows, micro_tokens = batch["tokens"].shape[0], batch["tokens"].numel()
                # fetch the next batch while the device works (prefetch); remember the position
                # just before the first batch of each iteration for checkpoints
                if micro_step == micro_steps - 1:
                    loader_state = self.batches.state_dict() if hasattr(self.batches, "state_dict") else None
                batch = self._next_batch()
                self.scaler.scale(loss).backward()
                loss_sum += loss.detach().float()
                if noise and micro_step == 0:
                    g_small = grad_sq_norm(self.trained, run) / scale ** 2  # one micro-batch's gradient, squared norm
            step_tokens = micro_tokens * micro_steps * self.world
            self.tokens_seen += step_tokens
            tokens_since_log += step_tokens
            if noise:
                g_big = grad_sq_norm(self.trained, run)  # the step's gradient, before clipping
                if self.scaler.is_enabled():
                    g_small, g_big = g_small / self.scaler.get_scale() ** 2, g_big / self.scaler.get_scale() ** 2
                if run.fsdp:  # the first micro-step's gradient is already the mean over all ranks' first micro-batches
                    noise_sample = (g_small, g_big, micro_rows * self.world, micro_rows * micro_steps * self.world)
                else:
                    noise_sample = (all_reduce_mean(g_small, run.dist), g_big, micro_rows, micro_rows * micro_steps * self.world)
            if cfg["grad_clip"] > 0.0:
                self.scaler.unscale_(self.optimizer)
                clip_grad_norm(self.trained, cfg["grad_clip"], self.param_overrides)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.first_bad_iter = torch.where((self.first_bad_iter < 0) & ~torch.isfinite(loss_sum),
                                              it, self.first_bad_iter)  # a Python int: no host-to-device copy
            iters_since_log += 1
            self.iter_num = it + 1

            if it % cfg["log_interval"] == 0:
                # one host sync per log step; the loss is the global mean over micro-steps and ranks
                lossf = all_reduce_mean(loss_sum / iters_since_log, run.dist).item()
                t1 = time.time()
                dt = (t1 - t0) / iters_since_log
                t0 = t1
                if not math.isfinite(lossf):
                    self.check_finite()
                tokens_per_iter = tokens_since_log / iters_since_log  # varies during a batch / sequence warmup
                tokens_per_s = tokens_per_iter / dt
                # per process: each process's share of the tokens against one device's peak
                mfu = self.raw_model.estimate_mfu(tokens_per_iter / self.world, dt, peak, seq or cfg["max_seq_len"])
                noise_metrics = self.critical_batch_size(*noise_sample) if noise_sample is not None else {}
                if run.master:
                    mfu_s = f" | mfu {mfu * 100:.2f}%" if mfu is not None else ""
                    print(f"{it} | loss {lossf:.4f} | lr {lr:e} | {dt * 1000:.2f}ms | {tokens_per_s:,.0f} tok/s{mfu_s}")
                    rec = {"iter": it, "loss/train": lossf, "lr": lr, "ms_per_iter": dt * 1000, "tokens_per_s": tokens_per_s}
                    if mfu is not None:
                        rec["mfu"] = mfu
                    if self.batch_warmup is not None:
                        rec.update(batch_size=rows * micro_steps * self.world, seq_len=seq, tokens_seen=self.tokens_seen)
                    rec.update(noise_metrics)
                    if hasattr(self.optimizer, "step_size_metrics"):  # Adafactor: its effective step sizes
                        rec.update(self.optimizer.step_size_metrics())
                    self.logger.log(rec, kind="train", wandb_prefix_map={"loss/train": "train/loss"})
                loss_sum.zero_()
                iters_since_log = tokens_since_log = 0
                noise_sample = None
            for hook in self.step_hooks.values():  # after the step: a checkpoint of iter_num sees what it did
                hook(self, batch)
