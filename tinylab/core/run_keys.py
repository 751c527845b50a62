"""The keys every training driver shares about where a run starts and writes, how it is logged and
what it runs on (train.py's and finetune_t0.py's "I/O", "wandb" and "system" sections), their typed
views (StartOptions, WandbOptions, SystemOptions: what the run setup, the metrics logger and the
process setup receive) and the rules between them (check_init, check_parallelism).
tinylab/schema.py assembles the programs' key sets from these lists.
"""
import os
from dataclasses import dataclass

from tinylab.core.config import NONNEG, Key, check_device
from tinylab.core.distributed import PARALLELISMS, check_fsdp_setting
from tinylab.core.errors import UserError

INIT_FROM = ("scratch", "resume_train", "resume_model", "resume")  # "resume": llama2.c's name for resume_train
DTYPES = ("float32", "float64", "bfloat16", "float16")

# ---------------------------------------------------------------------- where the run starts and writes

OUT_DIR = Key("out_dir", "out", "run folder: ckpt.pt, config.json, metrics.jsonl ({key} placeholders are filled "
              "from the config, e.g. out/{dataset_name}_lr{learning_rate})", nonempty=True, output="run")
MODEL_DIR = Key("model_dir", "", "resume_model: fine-tune from model_dir/ckpt.pt (or a .pt path)", input=True)
INIT = Key("init_from", "scratch", "scratch | resume_train (continue the run in out_dir) | resume_model "
           "(weights of model_dir, fresh optimizer, iteration 0)", choices=INIT_FROM)
RESUME_CKPT = Key("resume_ckpt", "", "init_from=resume_train: continue this checkpoint file instead of "
                  "out_dir/ckpt.pt (e.g. grow.py's <ckpt>.doubled_weights); the run then starts a new out_dir",
                  input=True)
OVERWRITE = Key("overwrite", False, "a new run (scratch, resume_model) into an out_dir that holds a run: move "
                "the old run aside to <out_dir>.previous-<time> instead of refusing")
START_KEYS = [OUT_DIR, MODEL_DIR, INIT, RESUME_CKPT, OVERWRITE]

SEED = Key("seed", 1337, "seed of every random choice (data order, initial weights, dropout, sampling)", range=NONNEG,
           nargs=1)


@dataclass(frozen=True)
class StartOptions:
    """Where a run starts (init_from and the checkpoint it reads) and the folder it writes."""
    out_dir: str
    model_dir: str
    init_from: str
    resume_ckpt: str
    overwrite: bool

    @classmethod
    def from_config(cls, cfg) -> "StartOptions":
        return cls(**{k.name: cfg[k.name] for k in START_KEYS})

    @property
    def resumes(self) -> bool:
        """init_from=resume_train (or llama2.c's "resume"): the run in out_dir goes on."""
        return self.init_from in ("resume_train", "resume")

    @property
    def in_place(self) -> bool:
        """resume_train continuing out_dir's own ckpt.pt (not a --resume_ckpt from elsewhere, such
        as grow.py's <ckpt>.doubled_weights: that run starts a new folder)."""
        if not self.resumes:
            return False
        own = os.path.join(self.out_dir, "ckpt.pt")
        return not self.resume_ckpt or os.path.abspath(self.resume_ckpt) == os.path.abspath(own)

    def checkpoint_path(self) -> str:
        """The ckpt.pt that init_from=resume_train (out_dir, or resume_ckpt) or resume_model
        (model_dir) loads."""
        if self.resumes and self.resume_ckpt:
            if not os.path.isfile(self.resume_ckpt):
                raise UserError(f"--resume_ckpt={self.resume_ckpt}: no such checkpoint file")
            return self.resume_ckpt
        where = self.out_dir if self.resumes else self.model_dir
        if not where:
            raise UserError("init_from=resume_model needs --model_dir=DIR (a folder holding ckpt.pt)")
        path = where if where.endswith(".pt") else os.path.join(where, "ckpt.pt")
        if not os.path.exists(path):
            hint = "train one first or check --out_dir" if self.init_from != "resume_model" else "check --model_dir"
            raise UserError(f"init_from={self.init_from}: no checkpoint at {path} ({hint})")
        return path

    def check(self):
        if self.init_from == "resume_model" and not self.model_dir:
            raise UserError("init_from=resume_model needs --model_dir=DIR (a folder holding ckpt.pt)")


def check_init(cfg):
    StartOptions.from_config(cfg).check()


# ---------------------------------------------------------------------- logging

WANDB_KEYS = [
    Key("wandb_log", False, "also log to Weights & Biases (metrics.jsonl is always written)"),
    Key("wandb_project", "tinystories-lab", "wandb project"),
    Key("wandb_run_name", "", "wandb run name (default: wandb's)"),
    Key("wandb_entity", "", "wandb entity (team or user; default: yours)"),
    Key("wandb_tags", [], "wandb tags (a list, or a comma-separated string)"),
    Key("wandb_mode", "", "'' = wandb's own default / WANDB_MODE", choices=("", "online", "offline", "disabled")),
]


@dataclass(frozen=True)
class WandbOptions:
    """What metrics.MetricsLogger passes to wandb.init (log=False: metrics.jsonl alone)."""
    log: bool
    project: str
    run_name: str
    entity: str
    tags: list
    mode: str

    @classmethod
    def from_config(cls, cfg) -> "WandbOptions":
        return cls(**{k.name[len("wandb_"):]: cfg[k.name] for k in WANDB_KEYS})


# ---------------------------------------------------------------------- what the run runs on

DEVICE = Key("device", "", "cpu, cuda, cuda:N, mps; '' = the best available", check=check_device)
DTYPE = Key("dtype", "", "'' = bfloat16 on CUDA (float16 without bf16 support), float32 otherwise",
            choices=("",) + DTYPES)
COMPILE = Key("compile", False, "torch.compile the model")
PARALLELISM = Key("parallelism", "ddp", "with torchrun: ddp = a full replica per process (DistributedDataParallel) "
                  "| fsdp = parameters, gradients and optimizer state sharded over the processes (FSDP2 fully_shard "
                  "per block; also without torchrun, as one process); docs/training.md", choices=PARALLELISMS)
ACTIVATION_CHECKPOINTING = Key("activation_checkpointing", False, "recompute each block's activations in backward "
                               "instead of keeping them (torch.utils.checkpoint): less memory, about one more "
                               "forward pass of the blocks per step")
PEAK_FLOPS = Key("peak_flops", 0.0, "the device's peak FLOP/s for MFU; 0 = known GPUs only (A100, H100, H200 bf16)",
                 range=NONNEG)
SYSTEM_KEYS = [DEVICE, DTYPE, COMPILE, PARALLELISM, ACTIVATION_CHECKPOINTING, PEAK_FLOPS]


@dataclass(frozen=True)
class SystemOptions:
    """The process's device, precision and parallelism as configured ('' = chosen at run time)."""
    device: str
    dtype: str
    parallelism: str
    peak_flops: float

    @classmethod
    def from_config(cls, cfg) -> "SystemOptions":
        return cls(**{k.name: cfg[k.name] for k in (DEVICE, DTYPE, PARALLELISM, PEAK_FLOPS)})


def check_parallelism(cfg):
    """What FSDP cannot do here (train.py's and finetune_t0.py's keys; absent ones are skipped)."""
    if cfg["parallelism"] != "fsdp":
        return
    check_fsdp_setting(cfg["device"], cfg["dtype"])
    if cfg["optimizer"] == "adafactor":
        raise UserError("parallelism=fsdp needs optimizer=adamw: Adafactor's factored moments need whole matrices, "
                        "not row shards (use parallelism=ddp for Adafactor)")
    if cfg.get("probes") or cfg.get("lenses"):
        raise UserError("parallelism=fsdp trains the whole model; probes / lenses train small heads on a frozen "
                        "one: use parallelism=ddp")
    if cfg.get("grow_schedule"):
        raise UserError("parallelism=fsdp cannot grow inside the run (grow_schedule): train with parallelism=ddp, or "
                        "grow the fsdp run's ckpt.pt with grow.py and resume that with parallelism=fsdp")
