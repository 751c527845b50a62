"""Every config key of every program, declared once: type, default, allowed values, one-line help.

    TRAIN        train.py (language modelling on pretokenized TinyStories datasets)
    FINETUNE_T0  finetune_t0.py (T0-style multitask finetuning): TRAIN's shared keys, with T0's
                 defaults, plus its own data / loss / rank-evaluation keys and their rules
                 (declared in tinylab/t0/options.py)
    SAMPLE, GROW, EVAL   the tools' flags (sample.py, grow.py, the evaluation/ scripts), built from
                 the same Key objects where a setting is the same setting
    COMPARE      evaluation/compare_checkpoints.py: EVAL's keys for two or more checkpoints

The machinery (parsing, validation, --help) is config.py's. Cross-key rules are the functions
below the declarations; everything is checked before a run writes anything.
"""
from model import ATTENTION_IMPLS, flex_attention
from tinylab.core.config import Key, Schema, check_device
from tinylab.core.distributed import PARALLELISMS, check_fsdp_setting
from tinylab.core.errors import UserError
from tinylab.data.options import LM_DATA_KEYS, LM_SPLIT_KEYS, TOKENIZER_MODEL
from tinylab.eval.compare import COMPARE_KEYS, COMPARE_OUT, check_compare
from tinylab.eval.keys import CHECKPOINT, EVAL_KEYS, TOOL_DATA_CACHE
from tinylab.eval.lm_eval import GENERATION_KEYS, MAX_NEW_TOKENS, TEMPERATURE, TOP_K, check_generation_datasets
from tinylab.eval.probes import HEADS_KEYS, check_heads
from tinylab.growth.options import GROW_SECTIONS, GROWTH_KEYS
from tinylab.growth.plan.options import PLAN_SECTION
from tinylab.growth.schedule import check_growth
from tinylab.t0.options import (
    PRESET_EXTRAS,
    T0_DATA,
    T0_LOSS,
    T0_MEGATRON,
    T0_START,
    check_megatron,
    check_reset_progress,
    check_start,
    loads_model,
)
from tinylab.training.optim import LR_SCHEDULES, OPTIMIZER_PRESETS, OPTIMIZERS, apply_optimizer_preset

INIT_FROM = ("scratch", "resume_train", "resume_model", "resume")  # "resume": llama2.c's name for resume_train
DTYPES = ("float32", "float64", "bfloat16", "float16")
COUNT, NONNEG, POSITIVE, FRACTION = "[1, inf)", "[0, inf)", "(0, inf)", "[0, 1)"

# ---------------------------------------------------------------------- keys shared by the drivers

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
SEED = Key("seed", 1337, "seed of every random choice (data order, initial weights, dropout, sampling)", range=NONNEG)

IO = [
    OUT_DIR, MODEL_DIR, INIT, RESUME_CKPT, OVERWRITE,
    Key("eval_interval", 2000, "evaluate (and checkpoint) every this many iterations", range=COUNT),
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
    SEED,
]

WANDB = [
    Key("wandb_log", False, "also log to Weights & Biases (metrics.jsonl is always written)"),
    Key("wandb_project", "tinystories-lab", "wandb project"),
    Key("wandb_run_name", "", "wandb run name (default: wandb's)"),
    Key("wandb_entity", "", "wandb entity (team or user; default: yours)"),
    Key("wandb_tags", [], "wandb tags (a list, or a comma-separated string)"),
    Key("wandb_mode", "", "'' = wandb's own default / WANDB_MODE", choices=("", "online", "offline", "disabled")),
]

LM_DATA = [
    *LM_DATA_KEYS,
    Key("warmup_bsz", 0, "tokens over which the global batch grows from warmup_bsz_start sequences to "
        "batch_size * gradient_accumulation_steps (staged-training's --warmup_bsz); 0 = off", range=NONNEG),
    Key("warmup_bsz_start", 64, "sequences in the first batch of a batch-size warmup", range=COUNT),
    Key("warmup_seq", 0, "tokens over which the sequence length grows from warmup_seq_start to max_seq_len "
        "(staged-training's --warmup_seq); 0 = off", range=NONNEG),
    Key("warmup_seq_start", 64, "tokens per sequence at the start of a sequence-length warmup", range=COUNT),
    Key("critical_batch_size", True, "log the gradient-noise estimate of the critical batch size on log steps "
        "(needs gradient accumulation)"),
    *LM_SPLIT_KEYS,
]

DROPOUT = Key("dropout", 0.0, "dropout probability (embeddings, attention, residual branches)", range=FRACTION)

MODEL = [
    Key("dim", 288, "model width", range=COUNT),
    Key("n_layers", 6, "transformer blocks", range=COUNT),
    Key("n_heads", 6, "attention heads (dim must be divisible by it)", range=COUNT),
    Key("n_kv_heads", 6, "key/value heads (GQA; must divide n_heads); 0 = n_heads", range=NONNEG),
    Key("multiple_of", 32, "the SwiGLU hidden size is rounded up to a multiple of this", range=COUNT),
    Key("hidden_dim", 0, "SwiGLU hidden size; 0 = llama2.c's rule from dim and multiple_of", range=NONNEG),
    DROPOUT,
    Key("tie_embeddings", True, "share the token embedding with the output head (llama2.c)"),
]

LR = Key("learning_rate", 5e-4, "peak learning rate", range=NONNEG, aliases=("lr",))
OPTIMIZER = [
    Key("gradient_accumulation_steps", 4, "micro-steps per optimizer step, over all processes (divided among them)",
        range=COUNT),
    LR,
    Key("lr_scheduling", True, "False: constant learning_rate (the *_no_lrs fine-tuning configs)"),
    Key("lr_schedule", "cosine", "cosine (llama2.c) | linear (warmup, then a straight line to min_lr: "
        "staged-training's get_linear_schedule_with_warmup) | constant (warmup, then constant)",
        choices=LR_SCHEDULES),
    Key("max_iters", 100000, "optimizer steps of the run", range=NONNEG),
    Key("weight_decay", 1e-1, "AdamW / Adafactor weight decay (matrices only)", range=NONNEG),
    Key("warmup_iters", 1000, "linear LR warmup iterations", range=NONNEG),
    Key("optimizer", "adamw", "adamw | adafactor", choices=OPTIMIZERS),
    Key("beta1", 0.9, "AdamW beta1", range=FRACTION),
    Key("beta2", 0.95, "AdamW beta2", range=FRACTION),
    Key("adam_eps", 1e-8, "AdamW epsilon", range=POSITIVE),
    Key("grad_clip", 1.0, "clip the gradient norm to this; 0 disables clipping", range=NONNEG),
    Key("decay_lr", True, "False: a constant learning_rate (llama2.c's flag)"),
    Key("min_lr", 0.0, "learning rate at the end of the decay", range=NONNEG),
    Key("lr_decay_iters", 0, "iterations over which the LR decays; 0 = max_iters", range=NONNEG),
]

ADAFACTOR = [
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

DEVICE = Key("device", "", "cpu, cuda, cuda:N, mps; '' = the best available", check=check_device)
DTYPE = Key("dtype", "", "'' = bfloat16 on CUDA (float16 without bf16 support), float32 otherwise",
            choices=("",) + DTYPES)
SYSTEM = [
    DEVICE, DTYPE,
    Key("compile", False, "torch.compile the model"),
    Key("parallelism", "ddp", "with torchrun: ddp = a full replica per process (DistributedDataParallel) | fsdp = "
        "parameters, gradients and optimizer state sharded over the processes (FSDP2 fully_shard per block; also "
        "without torchrun, as one process); docs/training.md", choices=PARALLELISMS),
    Key("activation_checkpointing", False, "recompute each block's activations in backward instead of keeping "
        "them (torch.utils.checkpoint): less memory, about one more forward pass of the blocks per step"),
    Key("peak_flops", 0.0, "the device's peak FLOP/s for MFU; 0 = known GPUs only (A100, H100, H200 bf16)",
        range=NONNEG),
]


# ---------------------------------------------------------------------- rules between keys

def check_model_shape(cfg):
    dim, heads, kv = cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"] or cfg["n_heads"]
    if dim % heads:
        raise UserError(f"dim={dim} is not divisible by n_heads={heads} (each head gets dim / n_heads channels)")
    if (dim // heads) % 2:
        raise UserError(f"the head size dim / n_heads = {dim // heads} must be even (RoPE rotates pairs of channels)")
    if kv > heads or heads % kv:
        raise UserError(f"n_kv_heads={kv} must divide n_heads={heads} (each key/value head serves n_heads / "
                        f"n_kv_heads query heads)")


def check_schedule(cfg):
    if cfg["min_lr"] > cfg["learning_rate"]:
        raise UserError(f"min_lr={cfg['min_lr']} is above learning_rate={cfg['learning_rate']}")
    decay, warmup, max_iters = cfg["lr_decay_iters"], cfg["warmup_iters"], cfg["max_iters"]
    if cfg["lr_scheduling"] and cfg["decay_lr"] and decay and decay < warmup:
        raise UserError(f"lr_decay_iters={decay} ends before warmup_iters={warmup} does")
    # with lr_decay_iters=0 the decay ends at max_iters: a longer warmup never ends (a run that
    # trains no step, eval_only or max_iters=0, uses no schedule)
    trains = max_iters > 0 and not cfg["eval_only"]
    if cfg["lr_scheduling"] and cfg["decay_lr"] and not decay and trains and warmup > max_iters:
        raise UserError(f"warmup_iters={warmup} is longer than the run, max_iters={max_iters} (where the "
                        f"{cfg['lr_schedule']} schedule ends with lr_decay_iters=0): the learning rate would never "
                        f"leave its warmup; lower warmup_iters, or keep a longer run's schedule with "
                        f"lr_decay_iters (>= warmup_iters)")
    if cfg["adafactor_warmup_init"] and not cfg["adafactor_relative_step"]:
        raise UserError("adafactor_warmup_init=True needs adafactor_relative_step=True")


def check_warmups(cfg):
    batch = cfg["batch_size"] * cfg["gradient_accumulation_steps"]
    if cfg["warmup_bsz"] and cfg["warmup_bsz_start"] >= batch:
        raise UserError(f"warmup_bsz_start={cfg['warmup_bsz_start']} sequences is not below the global batch it should "
                        f"grow to (batch_size * gradient_accumulation_steps = {batch}): raise gradient_accumulation_steps "
                        f"or lower warmup_bsz_start")
    if cfg["warmup_seq"] and cfg["warmup_seq_start"] >= cfg["max_seq_len"]:
        raise UserError(f"warmup_seq_start={cfg['warmup_seq_start']} is not below max_seq_len={cfg['max_seq_len']}")


def check_save_best(cfg):
    ckpt, every = cfg["checkpoint_interval"], cfg["eval_interval"]
    if cfg["save_best_model"] and ckpt and ckpt % every:
        raise UserError(f"save_best_model=True judges each checkpoint by the evaluation at its iteration: "
                        f"checkpoint_interval={ckpt} must be a multiple of eval_interval={every} (or 0)")


def check_init(cfg):
    if cfg["init_from"] == "resume_model" and not cfg["model_dir"]:
        raise UserError("init_from=resume_model needs --model_dir=DIR (a folder holding ckpt.pt)")




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


def prepare_train(cfg):
    return apply_optimizer_preset(cfg, TRAIN.defaults())


TRAIN = Schema("train.py", [
    ("I/O", IO), ("wandb", WANDB), ("data", LM_DATA), ("model", MODEL),
    ("probes and lenses: heads trained on the frozen model", HEADS_KEYS), ("optimizer and schedule", OPTIMIZER),
    ("Adafactor", ADAFACTOR), ("staged training: growth inside the run", GROWTH_KEYS),
    ("generation evaluation", GENERATION_KEYS), ("system", SYSTEM),
], rules=[check_model_shape, check_schedule, check_warmups, check_save_best, check_init, check_generation_datasets, check_growth,
       check_heads, check_parallelism],
    prepare=prepare_train)


# ---------------------------------------------------------------------- finetune_t0.py

# finetune_t0.py's own keys and their rules are declared in tinylab/t0/options.py; attention_impl is the model's
ATTENTION_IMPL = Key("attention_impl", "auto", "packed rows' attention, built from their segment ids at each forward: "
                     "sdpa (a mask per forward) | flex (FlexAttention's block mask; CUDA: torch has no flex backward "
                     "on the CPU) | auto = flex on CUDA, sdpa elsewhere", choices=ATTENTION_IMPLS)


def check_attention_impl(cfg):
    if cfg["attention_impl"] != "flex":
        return
    import torch
    device = cfg["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    if flex_attention is None or not device.startswith("cuda"):
        raise UserError(f"attention_impl=flex trains on CUDA only (torch {torch.__version__} has no FlexAttention "
                        f"backward on {device.split(':')[0]}); use attention_impl=auto or sdpa")
    if cfg["dropout"] > 0:
        raise UserError(f"attention_impl=flex has no attention dropout (dropout={cfg['dropout']}): use dropout=0 or "
                        f"attention_impl=sdpa")


def check_t0(cfg):
    check_start(cfg)
    if loads_model(cfg):
        check_init(cfg)


def prepare_t0(cfg):
    defaults = FINETUNE_T0.defaults()
    out = apply_optimizer_preset(cfg, defaults)
    for key, value in PRESET_EXTRAS.get(cfg["adafactor_preset"], {}).items():
        if cfg[key] == defaults[key]:
            out[key] = value
    return out


FINETUNE_T0 = TRAIN.derive(
    "finetune_t0.py",
    defaults=dict(out_dir="out/t0", init_from="resume_model", eval_interval=200, log_interval=10, export_bin=False,
                  gradient_accumulation_steps=1, learning_rate=1e-4, lr_scheduling=False, max_iters=1000,
                  weight_decay=0.0, warmup_iters=0),
    keys=[Key("eval_iters", 4, "validation loss on the first eval_iters * batch_size packed rows of each group",
              range=NONNEG),
          INIT.replace(choices=("resume_model", "resume_train"), help="resume_model: finetune model_dir | "
                       "resume_train: continue out_dir")],
    # the model's shape comes from the base checkpoint; these are language-modelling keys
    drop=[k.name for k in LM_DATA + GROWTH_KEYS + GENERATION_KEYS + HEADS_KEYS] + [k.name for k in MODEL if k is not DROPOUT],
    sections=[("data", T0_DATA), ("Megatron-DeepSpeed data and arguments", T0_MEGATRON),
              ("masks, loss and rank evaluation", T0_LOSS + [ATTENTION_IMPL]), ("starting point", T0_START)],
    rules=[check_schedule, check_save_best, check_t0, check_megatron, check_parallelism, check_attention_impl,
           check_reset_progress],
    prepare=prepare_t0)


# ---------------------------------------------------------------------- the tools

SAMPLE = Schema("sample.py", [
    ("sampling", [CHECKPOINT.replace(help="checkpoint (ckpt.pt or its folder)"),
                  Key("start", "Features: Twist\\nWords: run, ball, red\\nStory:",
                      "the prompt (a literal \\n is a newline; FILE:path reads it from a file)"),
                  Key("num_samples", 1, "stories to sample", range=COUNT),
                  MAX_NEW_TOKENS.replace(default=256, range=COUNT, help="tokens generated per story"),
                  TEMPERATURE, TOP_K, SEED]),
    ("tokenizer and device", [TOKENIZER_MODEL.replace(help="'' = the one the checkpoint was trained with"),
                              TOOL_DATA_CACHE, DEVICE]),
])

GROW = Schema("grow.py", GROW_SECTIONS + [PLAN_SECTION])  # the keys: tinylab/growth/

EVAL = Schema("evaluation", [("model", EVAL_KEYS)])  # every evaluation tool's flags (tinylab/eval/keys.py)

# evaluation/compare_checkpoints.py: its checkpoints are positional (two or more), not --checkpoint
COMPARE = EVAL.derive("evaluation/compare_checkpoints.py", drop=["checkpoint", "force"], rules=[check_compare],
                      keys=[COMPARE_OUT], sections=[("comparison", COMPARE_KEYS)])

# the drivers by file name (sweep.py checks a sweep's parameters against them)
DRIVERS = {"train.py": TRAIN, "finetune_t0.py": FINETUNE_T0}
