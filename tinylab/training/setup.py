"""A training run's setup, shared by train.py and finetune_t0.py (and the staged-training tool):

    run = Run.from_config(cfg)                 device, precision, DDP or FSDP2 process group
    with open_run_folder(cfg, run) as rd:      out_dir, created and locked; a new run refuses an old one
        seed_everything(cfg["seed"])
        model, ckpt = init_model(cfg, run)     scratch / resume_train / resume_model
        trainer = Trainer(TrainerOptions.from_config(cfg), run, model, batches, evaluate,
                          training_state(cfg, ckpt), config=cfg)
        start_run(rd, cfg, trainer)            the first write: config.json, metrics.jsonl
        fit_and_close(trainer, run)

Everything a driver can refuse happens before start_run, so a refused run leaves nothing behind
(docs/training.md). The loop itself is trainer.py's.
"""
import gc
from contextlib import nullcontext

import numpy as np
import torch

from model import Transformer
from tinylab.core import checkpoint as ckpt_lib
from tinylab.core import memory_budget
from tinylab.core.distributed import barrier, check_fsdp_setting, cleanup, init_distributed
from tinylab.core.errors import UserError
from tinylab.core.run_keys import StartOptions, SystemOptions
from tinylab.core.rundir import RunDir
from tinylab.training.options import MODEL_SHAPE_KEYS, OptimizerOptions, model_args_from_config

# dense bf16 peak FLOP/s by device name substring, for MFU (override with peak_flops=...)
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


# ---------------------------------------------------------------------- the process

def resolve_device(device: str) -> str:
    """The configured device, or ('' ) the best available one."""
    if device:
        return device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_dtype(dtype: str, device: str) -> str:
    return dtype or ("bfloat16" if device.startswith("cuda") and torch.cuda.is_bf16_supported()
                     else "float16" if device.startswith("cuda") else "float32")


class Run:
    """Device, precision and process-group facts of this process."""

    def __init__(self, system: SystemOptions):
        self.system = system
        device = resolve_device(system.device)
        # parallelism=fsdp: parameters, gradients and optimizer state sharded (FSDP2), also in one process
        self.fsdp = system.parallelism == "fsdp"
        if self.fsdp:  # the resolved device / dtype (check_parallelism checked the ones the config names)
            check_fsdp_setting(device, resolve_dtype(system.dtype, device))
        self.dist = init_distributed(device, own_group=self.fsdp)
        self.device = self.dist.device
        self.device_type = "cuda" if self.device.startswith("cuda") else ("mps" if self.device.startswith("mps") else "cpu")
        self.dtype = resolve_dtype(system.dtype, self.device)
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

    @classmethod
    def from_config(cls, cfg) -> "Run":
        return cls(SystemOptions.from_config(cfg))

    def peak_flops(self):
        """The device's peak FLOP/s for MFU: peak_flops, else a known GPU's in half precision."""
        if self.system.peak_flops:
            return self.system.peak_flops
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


# ---------------------------------------------------------------------- the model and the state to restore

def init_model(cfg, run: Run, log=print, ckpt=None):
    """Return (model, loaded checkpoint or None) for init_from; pass the checkpoint to the
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
    start = StartOptions.from_config(cfg)
    if start.init_from == "scratch":
        model, ckpt = Transformer(model_args_from_config(cfg)), None
    else:
        path = start.checkpoint_path()
        if ckpt is None:
            ckpt = ckpt_lib.load_checkpoint(path)
            memory_budget.check_training(cfg, run, memory_budget.Shape.from_model_args(ckpt["model_args"]))
        configured = {k: cfg[k] for k in MODEL_SHAPE_KEYS if k in cfg}
        _notice_shape(configured, ckpt["model_args"], path, log if run.master else None)
        max_seq_len, dropout = cfg["max_seq_len"], cfg["dropout"]
        model = ckpt_lib.model_from_checkpoint(ckpt, max_seq_len=max_seq_len, dropout=dropout)
    return model.to(device=run.device, dtype=run.param_dtype), ckpt


def _notice_shape(configured, saved, path, log):
    """Name the shape keys the config sets (non-zero) that the checkpoint's model_args override."""
    differs = [f"{k}={saved.get(k)} (config {v})" for k, v in configured.items()
               if v not in (None, 0) and saved.get(k) is not None and saved.get(k) != v]
    if differs and log is not None:
        log(f"notice: model shape taken from {path}: " + ", ".join(differs))


def training_state(cfg, ckpt, reset_progress=False):
    """The checkpoint whose optimizer/iteration/RNG/loader state a Trainer should restore: the
    whole one for resume_train; with `reset_progress` (finetune_t0.py's key) the optimizer state
    alone (progress_reset); else None."""
    if StartOptions.from_config(cfg).resumes:
        return ckpt
    return progress_reset(cfg, ckpt) if reset_progress and ckpt is not None else None


def progress_reset(cfg, ckpt):
    """Megatron's --reset-progress without --no-load-optim (checkpointing.py, branch t0loading):
    the checkpoint's optimizer state (moments; Adafactor's per-tensor step counts) is kept, while
    the iteration count (so the LR schedule), the data position, best loss, token count, RNG and
    wandb run start afresh, as with plain init_from=resume_model. (Megatron also loaded its LR
    scheduler's step count; here the schedule restarts at 0.)"""
    where = StartOptions.from_config(cfg).checkpoint_path()
    optimizer, saved = OptimizerOptions.from_config(cfg).name, ckpt.get("optimizer_name", "adamw")
    if ckpt.get("optimizer") is None or ckpt_lib.trains_aux_heads(ckpt):
        raise UserError(f"reset_progress=True keeps the optimizer state of {where}, which has none for this model "
                        f"(written without it, or by probe / lens training); use reset_progress=False")
    if saved != optimizer:
        raise UserError(f"reset_progress=True keeps {where}'s {saved} state, but the config says "
                        f"optimizer={optimizer}; set optimizer={saved} or reset_progress=False (a fresh optimizer)")
    kept = ("optimizer", "optimizer_name", "param_names", "param_overrides", "model_args")
    return {"model": {}, "iter_num": 0, **{k: ckpt.get(k) for k in kept}}


# ---------------------------------------------------------------------- the run folder

def open_run_folder(cfg, run) -> RunDir:
    """out_dir, created and locked by rank 0 for the whole run (use it as a context manager);
    a new run (scratch, resume_model, resume_train from a resume_ckpt elsewhere) must not land on
    an old one unless overwrite=True."""
    start = StartOptions.from_config(cfg)
    rd = RunDir(start.out_dir, enabled=run.master).open()
    try:
        if not start.in_place:
            rd.check_new_run(start.overwrite)
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
    start = StartOptions.from_config(cfg)
    if not start.in_place and start.overwrite:
        rd.move_aside()
    if trainer is not None:
        rd.track("metrics.jsonl")
        trainer.open_log()
    rd.write_json("config.json", cfg)
    rd.commit(rollback=not start.in_place)


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
    # threads are joined here and not during interpreter teardown (only then: a full collection
    # in a process holding many objects takes a fifth of a second)
    trainer.model = trainer.raw_model
    if run.dist.enabled:
        gc.collect()
    run.close()
    if status == "interrupted":
        raise KeyboardInterrupt
