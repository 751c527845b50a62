"""Every program's key set, assembled from the keys each component declares next to its code.

    TRAIN        train.py (language modelling on pretokenized TinyStories datasets)
    FINETUNE_T0  finetune_t0.py (T0-style multitask finetuning): TRAIN's shared keys, with T0's
                 defaults, plus its own data / loss / rank-evaluation keys and their rules
                 (declared in tinylab/t0/options.py)
    SAMPLE, GROW, EVAL   the tools' flags (sample.py, grow.py, the evaluation/ scripts), built from
                 the same Key objects where a setting is the same setting
    COMPARE      evaluation/compare_checkpoints.py: EVAL's keys for two or more checkpoints

Where the keys live: the run folder, logging and system keys in tinylab/core/run_keys.py; the
model shape, the loop's intervals and checkpoint rules, optimizer, schedule and Adafactor in
tinylab/training/options.py; the batch / sequence warmups in tinylab/training/warmup.py. The
cross-key rules live beside their keys; a program's schema lists the ones it runs. The machinery
(parsing, validation, --help) is tinylab/core/config.py's; everything is checked before a run
writes anything. Library code never imports this module (only the entry scripts and tests do).
"""
from tinylab.core.compat import COMPAT, apply_compat
from tinylab.core.config import COUNT, NONNEG, Key, Schema
from tinylab.core.errors import UserError
from tinylab.core.run_keys import (
    DEVICE,
    INIT,
    SEED,
    START_KEYS,
    SYSTEM_KEYS,
    WANDB_KEYS,
    check_init,
    check_parallelism,
)
from tinylab.data.documents import DOCUMENT_KEYS, check_documents
from tinylab.data.options import LM_DATA_KEYS, LM_SPLIT_KEYS, TOKENIZER_MODEL
from tinylab.eval.compare import COMPARE_KEYS, COMPARE_OUT, check_compare
from tinylab.eval.keys import CHECKPOINT, EVAL_KEYS, TOOL_DATA_CACHE
from tinylab.eval.lm_eval import (
    EVAL_BATCH_SIZES,
    GENERATION_KEYS,
    MAX_NEW_TOKENS,
    TEMPERATURE,
    TOP_K,
    check_generation_datasets,
)
from tinylab.eval.probes import HEADS_KEYS, check_heads
from tinylab.growth.options import GROW_SECTIONS, GROWTH_KEYS
from tinylab.growth.plan.options import PLAN_SECTION
from tinylab.growth.schedule import check_growth
from tinylab.nn import attention
from tinylab.nn.attention import check_attention_impl
from tinylab.t0 import megatron_args
from tinylab.t0.megatron_args import SAME, megatron_spellings
from tinylab.t0.options import (
    PRESET_EXTRAS,
    T0_DATA,
    T0_LOSS,
    T0_MEGATRON,
    T0_MEGATRON_ARGS,
    T0_START,
    check_megatron,
    check_reset_progress,
    check_start,
    loads_model,
)
from tinylab.t0.preprocess import PREPROCESS_KEYS, check_preprocess
from tinylab.training import staged_flags
from tinylab.training.options import (
    ADAFACTOR_KEYS,
    CRITICAL_BATCH_SIZE,
    DROPOUT,
    LOOP_KEYS,
    MODEL_KEYS,
    OPTIMIZER_KEYS,
    check_model_shape,
    check_save_best,
    check_schedule,
)
from tinylab.training.presets import apply_optimizer_preset
from tinylab.training.restart import check_restart
from tinylab.training.staged_flags import REFUSED, STAGED_FLAG_KEYS, check_staged_flags
from tinylab.training.warmup import WARMUP_KEYS, check_warmups

# ---------------------------------------------------------------------- train.py's data section: the data keys, document masks, the warmups

LM_DATA = [
    *LM_DATA_KEYS, EVAL_BATCH_SIZES, *DOCUMENT_KEYS, *WARMUP_KEYS, CRITICAL_BATCH_SIZE, *LM_SPLIT_KEYS,
]


def train_family(cfg) -> str:
    """The original compat=original reproduces for a train.py run: staged-training's gpt_pretrain.py
    when the run uses its flags (tinylab/training/staged_flags.py) or grows (grow_schedule), else the
    TinyStories study's train.py."""
    return "staged" if staged_flags.given(cfg) or cfg["grow_schedule"] else "study"


def prepare_train(cfg, sources):
    defaults = TRAIN.defaults()
    cfg = staged_flags.translate(cfg, sources)  # staged-training's flags onto our keys, said once
    return apply_compat(apply_optimizer_preset(cfg, defaults), defaults, train_family(cfg), given=sources)


TRAIN = Schema("train.py", [
    ("I/O", START_KEYS + LOOP_KEYS + [SEED]), ("wandb", WANDB_KEYS), ("data", LM_DATA), ("model", MODEL_KEYS),
    ("probes and lenses: heads trained on the frozen model", HEADS_KEYS), ("optimizer and schedule", OPTIMIZER_KEYS),
    ("Adafactor", ADAFACTOR_KEYS), ("staged training: growth inside the run", GROWTH_KEYS),
    ("generation evaluation", GENERATION_KEYS), ("system", SYSTEM_KEYS),
    ("the original codebases' behaviour (docs/originals.md)", [COMPAT]),
    ("staged-training's gpt_pretrain.py flags, spelt --flag VALUE (docs/growth.md)", STAGED_FLAG_KEYS),
], rules=[check_model_shape, check_schedule, check_warmups, check_save_best, check_init, check_generation_datasets, check_growth,
       check_heads, check_parallelism, check_staged_flags, check_restart, check_documents],
    prepare=prepare_train, refused=REFUSED)


# ---------------------------------------------------------------------- finetune_t0.py

# finetune_t0.py's own keys and their rules are declared in tinylab/t0/options.py; attention_impl is the
# model's: its choices and words come from the backends' registry (tinylab/nn/attention/)
ATTENTION_IMPL = Key("attention_impl", "auto", attention.describe(), choices=attention.choices())


def check_t0(cfg):
    check_start(cfg)
    if loads_model(cfg):
        check_init(cfg)


def prepare_t0(cfg, sources=None):
    defaults = FINETUNE_T0.defaults()
    # Megatron's arguments first (--optimizer adam), then the preset
    out = apply_optimizer_preset(megatron_args.translate(cfg, defaults), defaults)
    for key, value in PRESET_EXTRAS.get(cfg["adafactor_preset"], {}).items():
        if cfg[key] == defaults[key]:
            out[key] = value
    return apply_compat(out, defaults, "t0", given=sources)


FINETUNE_T0 = TRAIN.derive(
    "finetune_t0.py",
    defaults=dict(out_dir="out/t0", init_from="resume_model", eval_interval=200, log_interval=10, export_bin=False,
                  gradient_accumulation_steps=1, learning_rate=1e-4, lr_scheduling=False, max_iters=1000,
                  weight_decay=0.0, warmup_iters=0),
    keys=[Key("eval_iters", 4, "validation loss on the first eval_iters * batch_size packed rows of each group",
              range=NONNEG),
          INIT.replace(choices=("resume_model", "resume_train"), help="resume_model: finetune model_dir | "
                       "resume_train: continue out_dir")]
    + megatron_spellings([TRAIN.keys[name] for name in SAME if name in TRAIN.keys]),
    # the model's shape comes from the base checkpoint; these are language-modelling keys
    drop=[k.name for k in LM_DATA + GROWTH_KEYS + GENERATION_KEYS + HEADS_KEYS + STAGED_FLAG_KEYS] + [k.name for k in MODEL_KEYS
                                                                                   if k is not DROPOUT],
    sections=[("data", T0_DATA), ("Megatron-DeepSpeed data and arguments", T0_MEGATRON + PREPROCESS_KEYS),
              ("masks, loss and rank evaluation", T0_LOSS + [ATTENTION_IMPL]), ("starting point", T0_START),
              ("Megatron-DeepSpeed's finetune_t0.py arguments, its spelling and meaning (docs/t0.md)", T0_MEGATRON_ARGS)],
    rules=[check_schedule, check_save_best, check_t0, check_megatron, check_preprocess, check_parallelism, check_attention_impl,
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



def prepare_grow(cfg, sources=None):
    """compat=original: staged-training's operators (its family's keys grow.py has); planning has none."""
    if cfg["plan"]:
        return cfg
    if cfg["compat"] == "original" and cfg["mode"] == "exact":  # before the notice: one error line
        raise UserError("compat=original reproduces staged-training's operators, which have no exact mode: "
                        "use mode=target (the default)")
    return apply_compat(cfg, GROW.defaults(), "staged", given=sources)


GROW = Schema("grow.py", GROW_SECTIONS + [PLAN_SECTION, ("the original codebase's behaviour (docs/originals.md)",
                                                          [COMPAT])], prepare=prepare_grow)  # the keys: tinylab/growth/

EVAL = Schema("evaluation", [("model", EVAL_KEYS)])  # every evaluation tool's flags (tinylab/eval/keys.py)

# evaluation/compare_checkpoints.py: its checkpoints are positional (two or more), not --checkpoint
COMPARE = EVAL.derive("evaluation/compare_checkpoints.py", drop=["checkpoint", "force"], rules=[check_compare],
                      keys=[COMPARE_OUT], sections=[("comparison", COMPARE_KEYS)])

# the drivers by file name (sweep.py checks a sweep's parameters against them)
DRIVERS = {"train.py": TRAIN, "finetune_t0.py": FINETUNE_T0}
