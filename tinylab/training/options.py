"""The training keys (model shape, the loop's intervals and checkpoint rules, optimizer and schedule,
Adafactor), their typed views and the rules between them.

    ModelOptions      the model's shape (ModelArgs for a new model)
    ScheduleOptions   the learning-rate schedule (optim.lr_at)
    AdafactorOptions  Adafactor's settings (optim.build_optimizer with optimizer=adafactor)
    OptimizerOptions  which optimizer, its settings, its schedule (optim.build_optimizer)
    TrainerOptions    what the Trainer does when: intervals, checkpoint rules, stopping, clipping,
                      micro-steps, compile, activation checkpointing, the optimizer, logging

Each is built once, at the boundary, by `from_config(cfg)` (after the driver has resolved the
config); the Trainer and optim.py receive these, never the config dict. tinylab/schema.py assembles
the programs' key sets from the lists below (in --help order) and runs the check_* rules.
"""
from dataclasses import dataclass, fields

from model import ModelArgs
from tinylab.core.compat import declare_difference
from tinylab.core.config import COUNT, FRACTION, NONNEG, POSITIVE, Key
from tinylab.core.errors import UserError
from tinylab.core.run_keys import StartOptions, WandbOptions
from tinylab.training.optim import LR_SCHEDULES, OPTIMIZERS, WARMUP_FORMULA
from tinylab.training.presets import OPTIMIZER_PRESETS

# ---------------------------------------------------------------------- the model's shape

DROPOUT = Key("dropout", 0.0, "dropout probability (embeddings, attention, residual branches)", range=FRACTION)

MODEL_KEYS = [
    Key("dim", 288, "model width", range=COUNT),
    Key("n_layers", 6, "transformer blocks", range=COUNT),
    Key("n_heads", 6, "attention heads (dim must be divisible by it)", range=COUNT),
    Key("n_kv_heads", 6, "key/value heads (GQA; must divide n_heads); 0 = n_heads", range=NONNEG),
    Key("multiple_of", 32, "the SwiGLU hidden size is rounded up to a multiple of this", range=COUNT),
    Key("hidden_dim", 0, "SwiGLU hidden size; 0 = llama2.c's rule from dim and multiple_of", range=NONNEG),
    DROPOUT,
    Key("tie_embeddings", True, "share the token embedding with the output head (llama2.c)"),
]
# the keys a checkpoint's model_args override on resume (init_model names those that differ)
MODEL_SHAPE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim", "multiple_of", "tie_embeddings")


@dataclass(frozen=True)
class ModelOptions:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int  # 0 = n_heads
    multiple_of: int
    hidden_dim: int  # 0 = llama2.c's rule
    dropout: float
    tie_embeddings: bool

    @classmethod
    def from_config(cls, cfg) -> "ModelOptions":
        return cls(**{k.name: cfg[k.name] for k in MODEL_KEYS})

    def model_args(self, vocab_size: int, max_seq_len: int) -> ModelArgs:
        return ModelArgs(dim=self.dim, n_layers=self.n_layers, n_heads=self.n_heads,
                         n_kv_heads=self.n_kv_heads or self.n_heads, vocab_size=vocab_size,
                         hidden_dim=self.hidden_dim or None, multiple_of=self.multiple_of, max_seq_len=max_seq_len,
                         dropout=self.dropout, tie_embeddings=self.tie_embeddings)

    def check(self):
        dim, heads, kv = self.dim, self.n_heads, self.n_kv_heads or self.n_heads
        if dim % heads:
            raise UserError(f"dim={dim} is not divisible by n_heads={heads} (each head gets dim / n_heads channels)")
        if (dim // heads) % 2:
            raise UserError(f"the head size dim / n_heads = {dim // heads} must be even (RoPE rotates pairs of channels)")
        if kv > heads or heads % kv:
            raise UserError(f"n_kv_heads={kv} must divide n_heads={heads} (each key/value head serves n_heads / "
                            f"n_kv_heads query heads)")


def model_args_from_config(cfg) -> ModelArgs:
    """The shape train.py builds a new model with (the data keys give vocab_size and max_seq_len)."""
    return ModelOptions.from_config(cfg).model_args(cfg["vocab_size"], cfg["max_seq_len"])


def check_model_shape(cfg):
    ModelOptions.from_config(cfg).check()


# ---------------------------------------------------------------------- the loop: evaluations and checkpoints

EVAL_INTERVAL = Key("eval_interval", 2000, "evaluate (and checkpoint) every this many iterations", range=COUNT)
LOOP_KEYS = [
    EVAL_INTERVAL,
    Key("checkpoint_interval", 0, "checkpoint every this many iterations; 0 = every eval_interval", range=NONNEG),
    Key("log_interval", 1, "log the training loss every this many iterations", range=COUNT),
    Key("eval_iters", 100, "batches per evaluation loss", range=COUNT),
    Key("eval_only", False, "evaluate the initial / resumed model once and exit"),
    Key("always_save_checkpoint", True, "False: a periodic checkpoint only when loss/test improved (llama2.c)"),
    Key("save_best_model", False, "True: a periodic ckpt.pt only when the evaluation at that iteration is a new best "
        "loss/test (the study's flag; the final one is always saved)"),
    Key("keep_best_checkpoint", False, "also keep out_dir/ckpt_best.pt, rewritten whenever loss/test improves"),
    Key("export_bin", True, "write model.bin (llama2.c v0, for run.c) beside every ckpt.pt (model_best.bin beside "
        "ckpt_best.pt), as the study's train.py did"),
    Key("finegrained_log_iters", 0, ">0: also evaluate (train.py: with generations) often during the first N iterations",
        range=NONNEG),
    Key("finegrained_eval_interval", 0, "evaluation interval during finegrained_log_iters; 0 = a tenth of it",
        range=NONNEG),
]
CRITICAL_BATCH_SIZE = Key("critical_batch_size", True, "log the gradient-noise estimate of the critical batch size on "
                          "log steps (needs gradient accumulation)")

# ---------------------------------------------------------------------- optimizer and schedule

LR = Key("learning_rate", 5e-4, "peak learning rate", range=NONNEG, aliases=("lr",), nargs=1)
# the study's train.py forwarded the step's first micro-batch at every micro-step (its do_update
# read the fresh batch into names the loop never used): trainer._micro_steps
SAME_BATCH_ACCUMULATION = Key("same_batch_accumulation", False, "True: every micro-step forwards the step's batch, "
                              "and k - 1 batches of the stream are read and dropped per step (the study's train.py: "
                              "a step is the gradient of one micro-batch)")
declare_difference(SAME_BATCH_ACCUMULATION, original=True, family="study",
                   behaviour="every micro-step forwards the same (x, y) with loss / k; the k batches fetched meanwhile "
                   "are dropped but the last, which the next step trains on",
                   source="RobertKirk/tinystories-wrappers train.py:628")
WEIGHT_DECAY = Key("weight_decay", 1e-1, "AdamW / Adafactor weight decay (matrices only)", range=NONNEG)
BETA2 = Key("beta2", 0.95, "AdamW beta2", range=FRACTION)
ADAM_EPS = Key("adam_eps", 1e-8, "AdamW epsilon", range=POSITIVE)
ADAM_BIAS_CORRECTION = Key("adam_bias_correction", True, "AdamW divides its moments by 1 - beta^t | False: "
                           "transformers' AdamW(correct_bias=False), lr m / (sqrt(v) + eps) (staged-training's)")
# staged-training's gpt_pretrain.py: transformers' AdamW(params, lr, eps=adam_epsilon, betas=(0.9, 0.98),
# correct_bias=False) over one group, its --weight_decay never passed (the grouped parameters are commented out)
_GPT_PRETRAIN_ADAMW = "allenai/staged-training gpt_pretrain.py:1189"
declare_difference(ADAM_BIAS_CORRECTION, original=False, family="staged", source=_GPT_PRETRAIN_ADAMW,
                   behaviour="AdamW(correct_bias=False): updates by lr m / (sqrt(v) + eps), no 1 / (1 - beta^t)")
declare_difference(BETA2, original=0.98, family="staged", source="allenai/staged-training gpt_pretrain.py:1306",
                   behaviour="AdamW betas (0.9, 0.98) (--adam_beta2 0.98)")
declare_difference(ADAM_EPS, original=1e-6, family="staged", source="allenai/staged-training gpt_pretrain.py:1304",
                   behaviour="AdamW eps 1e-6 (--adam_epsilon)")
declare_difference(WEIGHT_DECAY, original=0.0, family="staged", source=_GPT_PRETRAIN_ADAMW,
                   behaviour="no weight decay: AdamW gets no weight_decay (transformers' default 0.0); the "
                   "--weight_decay 0.01 flag is never read")
OPTIMIZER_KEYS = [
    Key("gradient_accumulation_steps", 4, "micro-steps per optimizer step, over all processes (divided among them)",
        range=COUNT),
    SAME_BATCH_ACCUMULATION,
    LR,
    Key("lr_scheduling", True, "False: constant learning_rate (the *_no_lrs fine-tuning configs)"),
    Key("lr_schedule", "cosine", "cosine (llama2.c's decay; its warmup: warmup_formula) | linear (warmup, then a straight line to min_lr: "
        "staged-training's get_linear_schedule_with_warmup) | constant (warmup, then constant)",
        choices=LR_SCHEDULES),
    Key("max_iters", 100000, "optimizer steps of the run", range=NONNEG),
    WEIGHT_DECAY,
    Key("warmup_iters", 1000, "linear LR warmup iterations", range=NONNEG),
    WARMUP_FORMULA,
    Key("optimizer", "adamw", "adamw | adafactor", choices=OPTIMIZERS),
    Key("beta1", 0.9, "AdamW beta1", range=FRACTION),
    BETA2,
    ADAM_EPS,
    ADAM_BIAS_CORRECTION,
    Key("grad_clip", 1.0, "clip the gradient norm to this; 0 disables clipping", range=NONNEG, nargs=1),
    Key("decay_lr", True, "False: a constant learning_rate (llama2.c's flag)"),
    Key("min_lr", 0.0, "learning rate at the end of the decay", range=NONNEG),
    Key("lr_decay_iters", 0, "iterations over which the LR decays; 0 = max_iters", range=NONNEG),
]

ADAFACTOR_KEYS = [
    Key("adafactor_preset", "", "'' | t0 | hf_t5 (Adafactor) | bloomz_adam (AdamW): fills the optimizer keys it names "
        "that the config leaves at their defaults", choices=("",) + tuple(OPTIMIZER_PRESETS)),
    Key("adafactor_scale_parameter", True, "step sizes relative to each tensor's RMS"),
    Key("adafactor_relative_step", False, "step size from the step count (then learning_rate is ignored)"),
    Key("adafactor_warmup_init", False, "relative_step's warmup (needs adafactor_relative_step)"),
    Key("adafactor_clip_threshold", 1.0, "update clipping threshold", range=POSITIVE),
    Key("adafactor_decay_rate", -0.8, "second-moment decay exponent (beta2_t = 1 - t^decay_rate)", range="[-inf, 0]"),
    Key("adafactor_beta1", 0.0, "first moment; 0 = none", range=FRACTION),
    Key("adafactor_eps1", 1e-30, "added to the squared gradient (HF's eps[0]; Mesh-TF / T0: 1e-30)", range=POSITIVE),
    Key("adafactor_eps2", 1e-3, "floor of a tensor's RMS in the scale_parameter step size (HF's eps[1]; T0: 1e-3)",
        range=POSITIVE),
]


def _from(cls, cfg, prefix=""):
    """cls(field=cfg[prefix + field] for each dataclass field)."""
    return cls(**{f.name: cfg[prefix + f.name] for f in fields(cls)})


@dataclass(frozen=True)
class ScheduleOptions:
    """The learning-rate schedule (optim.schedule_lr says what each setting does)."""
    learning_rate: float
    lr_scheduling: bool
    decay_lr: bool
    lr_schedule: str
    warmup_iters: int
    warmup_formula: str  # nanogpt | original (optim.schedule_lr)
    min_lr: float
    lr_decay_iters: int  # 0 = max_iters
    max_iters: int

    @classmethod
    def from_config(cls, cfg) -> "ScheduleOptions":
        return _from(cls, cfg)

    @property
    def decays(self) -> bool:
        return self.lr_scheduling and self.decay_lr

    def check(self, trains: bool):
        """`trains`: the run takes optimizer steps (not eval_only, max_iters > 0)."""
        if self.min_lr > self.learning_rate:
            raise UserError(f"min_lr={self.min_lr} is above learning_rate={self.learning_rate}")
        decay, warmup, max_iters = self.lr_decay_iters, self.warmup_iters, self.max_iters
        if self.decays and decay and decay < warmup:
            raise UserError(f"lr_decay_iters={decay} ends before warmup_iters={warmup} does")
        # with lr_decay_iters=0 the decay ends at max_iters: a longer warmup never ends (a run that
        # trains no step, eval_only or max_iters=0, uses no schedule)
        if self.decays and not decay and trains and warmup > max_iters:
            raise UserError(f"warmup_iters={warmup} is longer than the run, max_iters={max_iters} (where the "
                            f"{self.lr_schedule} schedule ends with lr_decay_iters=0): the learning rate would never "
                            f"leave its warmup; lower warmup_iters, or keep a longer run's schedule with "
                            f"lr_decay_iters (>= warmup_iters)")


@dataclass(frozen=True)
class AdafactorOptions:
    """The adafactor_* keys (the Adafactor class's arguments; adafactor.py)."""
    scale_parameter: bool
    relative_step: bool
    warmup_init: bool
    clip_threshold: float
    decay_rate: float
    beta1: float  # 0 = no first moment
    eps1: float
    eps2: float

    @classmethod
    def from_config(cls, cfg) -> "AdafactorOptions":
        return _from(cls, cfg, "adafactor_")

    def check(self):
        if self.warmup_init and not self.relative_step:
            raise UserError("adafactor_warmup_init=True needs adafactor_relative_step=True")


@dataclass(frozen=True)
class OptimizerOptions:
    name: str  # the optimizer key: adamw | adafactor
    learning_rate: float
    weight_decay: float
    beta1: float
    beta2: float
    adam_eps: float
    adafactor: AdafactorOptions
    schedule: ScheduleOptions
    adam_bias_correction: bool = True

    @classmethod
    def from_config(cls, cfg) -> "OptimizerOptions":
        return cls(name=cfg["optimizer"], learning_rate=cfg["learning_rate"], weight_decay=cfg["weight_decay"],
                   beta1=cfg["beta1"], beta2=cfg["beta2"], adam_eps=cfg["adam_eps"],
                   adafactor=AdafactorOptions.from_config(cfg), schedule=ScheduleOptions.from_config(cfg),
                   adam_bias_correction=cfg["adam_bias_correction"])


def check_schedule(cfg):
    schedule = ScheduleOptions.from_config(cfg)
    schedule.check(trains=schedule.max_iters > 0 and not cfg["eval_only"])
    AdafactorOptions.from_config(cfg).check()
    if not cfg["adam_bias_correction"] and cfg["optimizer"] != "adamw":
        raise UserError(f"adam_bias_correction=False is AdamW's (transformers' correct_bias=False); "
                        f"optimizer={cfg['optimizer']} has no such setting")


# ---------------------------------------------------------------------- the Trainer's options

@dataclass(frozen=True)
class TrainerOptions:
    start: StartOptions  # out_dir, and whether the run goes on in its own folder
    eval_interval: int
    checkpoint_interval: int  # 0 = eval_interval
    log_interval: int
    eval_only: bool
    always_save_checkpoint: bool
    save_best_model: bool
    keep_best_checkpoint: bool
    finegrained_log_iters: int
    finegrained_eval_interval: int  # 0 = a tenth of finegrained_log_iters
    max_iters: int
    grad_clip: float  # 0 = no clipping
    gradient_accumulation_steps: int  # over all processes
    same_batch_accumulation: bool  # every micro-step forwards the step's first batch (the study's train.py)
    max_seq_len: int  # for MFU (a sequence warmup logs its own length)
    compile: bool  # the system keys the loop applies to the model
    activation_checkpointing: bool
    optimizer: OptimizerOptions
    wandb: WandbOptions

    @classmethod
    def from_config(cls, cfg) -> "TrainerOptions":
        nested = {"start": StartOptions, "optimizer": OptimizerOptions, "wandb": WandbOptions}
        return cls(**{f.name: nested[f.name].from_config(cfg) if f.name in nested else cfg[f.name]
                      for f in fields(cls)})

    @property
    def every_checkpoint(self) -> int:
        return self.checkpoint_interval or self.eval_interval

    def check(self):
        ckpt, every = self.checkpoint_interval, self.eval_interval
        if self.save_best_model and ckpt and ckpt % every:
            raise UserError(f"save_best_model=True judges each checkpoint by the evaluation at its iteration: "
                            f"checkpoint_interval={ckpt} must be a multiple of eval_interval={every} (or 0)")


def check_save_best(cfg):
    TrainerOptions.from_config(cfg).check()
