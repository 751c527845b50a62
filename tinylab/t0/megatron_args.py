"""Megatron-DeepSpeed's finetune_t0.py arguments in its own spelling (branch t0loading,
megatron/arguments.py; docs/t0.md, "Megatron-DeepSpeed's arguments"), so that a tr13 script's
argument block runs here unchanged.

Three kinds of flag:
  - the same setting as one of ours, only spelled Megatron's way (`--lr 2e-5` is learning_rate):
    `SAME` gives our keys Megatron's spelling as an alias, with a spaced value;
  - a setting of ours with Megatron's meaning (`--global-batch-size` is rows per optimizer step,
    so it sets gradient_accumulation_steps; `--eval-iters` counts global batches): keys of their
    own (`megatron_*`), translated into ours by `translate` (schema.py's prepare_t0) before
    anything is validated;
  - flags that cannot apply here: accepted with one notice line where they change no result
    (`NOOP`: logging, DeepSpeed's partitioning, kernels), refused with the reason where they would
    (`translate`'s checks: model parallelism, a cyclic data loader, batch-size ramp-up...).
Megatron's own defaults are not implied: a flag left out keeps finetune_t0.py's default.
"""
import json
import os
import sys

from model import ModelArgs
from tinylab.core.config import COUNT, NONNEG, Key
from tinylab.core.errors import UserError
from tinylab.core.fileio import read_text
from tinylab.t0 import megatron as megatron_data

# our key -> Megatron's spelling of the same setting (a spaced value, as there)
SAME = {"learning_rate": "lr", "min_lr": "min-lr", "beta1": "adam-beta1", "beta2": "adam-beta2",
        "adam_eps": "adam-eps", "weight_decay": "weight-decay", "grad_clip": "clip-grad", "seed": "seed",
        "eval_interval": "eval-interval", "checkpoint_interval": "save-interval", "log_interval": "log-interval",
        "lr_decay_iters": "lr-decay-iters", "optimizer": "optimizer", "eval_only": "eval-only", "prefixlm": "prefixlm"}
BARE = {"prefixlm"}  # Megatron's bare flags (store_true) among SAME


def megatron_spellings(keys):
    """`keys` (our Key objects named in SAME) with Megatron's spelling added: `--lr 2e-5`."""
    out = []
    for k in keys:
        flag = SAME[k.name]
        aliases = k.aliases + ((flag,) if flag != k.name and flag not in k.aliases else ())
        out.append(k.replace(aliases=aliases, nargs=0 if k.name in BARE else 1))
    return out


def _key(flag, default, help, nargs=1, **kw):
    return Key("megatron_" + flag.replace("-", "_"), default, help, nargs=nargs, aliases=(flag,), **kw)


INT, STR, FLOAT = dict(type=int), dict(type=str), dict(type=float)
LR_DECAY_STYLES = ("constant", "linear", "cosine")  # arguments.py:606 at t0loading
TOKENIZER_TYPES = ("PretrainedFromHF", "GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase")

# settings of ours with Megatron's meaning (None = not given)
TRANSLATED = [
    _key("seq-length", None, "tokens the model sees per row (rows hold seq-length + 1) -> max_seq_len", range=COUNT, **INT),
    _key("micro-batch-size", None, "rows per process per forward/backward -> batch_size", range=COUNT, **INT),
    _key("global-batch-size", None, "rows per optimizer step -> gradient_accumulation_steps = global / micro "
         "(must be divisible by micro-batch-size x processes)", range=COUNT, **INT),
    _key("train-iters", None, "optimizer steps -> max_iters", range=NONNEG, **INT),
    _key("train-samples", None, "packed rows to train on -> max_iters = train-samples // global-batch-size",
         range=NONNEG, **INT),
    _key("lr-decay-style", None, "constant | linear | cosine -> lr_schedule (with the LR schedule on)",
         choices=(None,) + LR_DECAY_STYLES, **STR),
    _key("lr-warmup-iters", None, "-> warmup_iters", range=NONNEG, **INT),
    _key("lr-warmup-samples", None, "-> warmup_iters = samples / global-batch-size", range=NONNEG, **INT),
    _key("lr-decay-samples", None, "-> lr_decay_iters = samples / global-batch-size", range=NONNEG, **INT),
    _key("eval-iters", None, "global batches per validation group -> eval_iters = this x gradient_accumulation_steps "
         "(our eval_iters counts micro-batches)", range=NONNEG, **INT),
    _key("save", None, "checkpoint folder -> out_dir", **STR),
    _key("load", None, "the checkpoint to start from -> model_dir (with --reset-progress) or init_from=resume_train",
         input=True, **STR),
    _key("no-load-optim", False, "with --load --reset-progress: the weights only (our resume_model)", nargs=0),
    _key("tokenizer-type", None, "PretrainedFromHF (with --tokenizer-name-or-path)", choices=(None,) + TOKENIZER_TYPES,
         **STR),
    _key("tokenizer-name-or-path", None, "a local Hugging Face tokenizer folder (AutoTokenizer): --preprocess "
         "tokenises with it; training checks it fits the model's vocabulary", input=True, **STR),
    _key("norm-target-loss", False, "-> loss_normalization=example (each target sequence weighs 1)", nargs=0),
    _key("fp16", False, "-> dtype=float16", nargs=0),
    _key("bf16", False, "-> dtype=bfloat16", nargs=0),
    _key("checkpoint-activations", False, "-> activation_checkpointing=True", nargs=0),
    _key("data-path", [], "Megatron's option 1: PREFIX, or W1 PREFIX1 W2 PREFIX2 ..., split by --split",
         nargs="+", type=list, sep=None),
    _key("split", None, "with --data-path: train,valid,test proportions of each prefix's documents (default "
         "969,30,1)", **STR),
    _key("deepspeed_config", None, "DeepSpeed's JSON config: its gradient_clipping is the clip (as under DeepSpeed); "
         "its batch sizes and fp16 / bf16 must agree with the flags", input=True, **STR),
]

# the model's shape: checked against the base checkpoint (check_against_base)
ARCHITECTURE = [
    _key("num-layers", None, "must equal the base checkpoint's n_layers", range=COUNT, **INT),
    _key("hidden-size", None, "must equal the base checkpoint's dim", range=COUNT, **INT),
    _key("num-attention-heads", None, "must equal the base checkpoint's n_heads", range=COUNT, **INT),
    _key("ffn-hidden-size", None, "must equal the base checkpoint's SwiGLU hidden size", range=COUNT, **INT),
    _key("max-position-embeddings", None, "must be >= seq-length (Megatron's assert) and <= the base model's context",
         range=COUNT, **INT),
    _key("pad-vocab-size-to", None, "must equal the base checkpoint's vocab_size (its embedding rows)", range=COUNT,
         **INT),
    _key("position-embedding-type", None, "alibi | rotary (absolute is refused, as Megatron's finetune_t0 does)",
         choices=(None, "absolute", "alibi", "rotary"), **STR),
]

# accepted, changing no result here; listed in one notice line: flag -> (nargs, type, why)
NOOP = {
    "pp-partition-method": (1, str, "pipeline stages (no pipeline here)"),
    "init-method-std": (1, float, "initialisation (every weight comes from the base checkpoint)"),
    "embed-layernorm": (0, bool, "BLOOM's architecture (the model is the base checkpoint's)"),
    "abort-on-unmet-fused-kernel-constraints": (0, bool, "fused-kernel choice"),
    "kill-switch-path": (1, str, "a stop file (not watched: Ctrl-C saves and stops)"),
    "exit-duration-in-mins": (1, int, "a wall-clock limit (not enforced: the run goes to its last iteration)"),
    "tensorboard-dir": (1, str, "TensorBoard logging (metrics.jsonl / wandb here)"),
    "tensorboard-queue-size": (1, int, "TensorBoard logging"),
    "tensorboard-log-interval": (1, int, "TensorBoard logging"),
    "log-timers-to-tensorboard": (0, bool, "TensorBoard logging"),
    "log-batch-size-to-tensorboard": (0, bool, "TensorBoard logging"),
    "log-validation-ppl-to-tensorboard": (0, bool, "TensorBoard logging"),
    "deepspeed": (0, bool, "DeepSpeed (DDP / parallelism=fsdp compute the same update)"),
    "zero-stage": (1, int, "ZeRO partitioning (the same update)"),
    "deepspeed-activation-checkpointing": (0, bool, "activation checkpointing's partitioning"),
    "distributed-backend": (1, str, "the process-group backend (torchrun's default)"),
    "loss-on-targets-only": (0, bool, "no effect in finetune_t0 (the loss is on targets only)"),
    "tensor-model-parallel-size": (1, int, "model parallelism, only 1 (refused otherwise)"),
    "pipeline-model-parallel-size": (1, int, "model parallelism, only 1 (refused otherwise)"),
    "dataloader-type": (1, str, "single: the sequential sampler (cyclic is refused)"),
    "data-impl": (1, str, "the indexed format: mmap / infer (lazy / cached are refused)"),
}
NOOP_KEYS = [_key(flag, False if nargs == 0 else None, f"accepted, changes nothing here: {why}", nargs=nargs,
                  **({} if nargs == 0 else {"type": t})) for flag, (nargs, t, why) in NOOP.items()]
# refused with the reason (a value that would change the result)
REFUSED = {"tensor-model-parallel-size": lambda v: v != 1 and "no tensor parallelism here (DDP or parallelism=fsdp)",
           "pipeline-model-parallel-size": lambda v: v != 1 and "no pipeline parallelism here (DDP or parallelism=fsdp)",
           "dataloader-type": lambda v: v != "single" and "only Megatron's 'single' (sequential) sampler: the rows "
                                                          "come from one seeded stream",
           "data-impl": lambda v: v not in ("mmap", "infer") and "only the mmap indexed format is read here",
           "kill-switch-path": lambda v: os.path.exists(v) and f"the kill-switch file {v} exists: Megatron would "
                                                                 f"exit at start"}
MEGATRON_ARGS = TRANSLATED + ARCHITECTURE + NOOP_KEYS


def _get(cfg, flag):
    return cfg["megatron_" + flag.replace("-", "_")]


def _set(out, cfg, defaults, key, value, flag):
    """out[key] = value, unless the user also set `key` itself to something else."""
    if cfg[key] != defaults[key] and cfg[key] != value:
        raise UserError(f"--{flag} gives {key}={value!r} but {key}={cfg[key]!r} is also set; give one")
    out[key] = value


def _per_batch(samples, batch, flag):
    if samples % batch:
        raise UserError(f"--{flag} {samples} is not a multiple of the global batch size {batch} (rows per optimizer step)")
    return samples // batch


def _check_exclusive(cfg):
    """Megatron's argument asserts (arguments.py:207-235) and what cannot apply here."""
    for a, b in (("train-iters", "train-samples"), ("train-iters", "lr-warmup-samples"),
                 ("train-iters", "lr-decay-samples"), ("train-samples", "lr-warmup-iters"),
                 ("lr-warmup-iters", "lr-warmup-samples"), ("fp16", "bf16")):
        if _get(cfg, a) not in (None, False, []) and _get(cfg, b) not in (None, False, []):
            raise UserError(f"--{a} and --{b} exclude each other (Megatron: give one)")
    for flag, why in REFUSED.items():
        value = _get(cfg, flag)
        problem = value is not None and why(value)
        if problem:
            raise UserError(f"--{flag} {value}: {problem}")
    if _get(cfg, "data-path"):
        megatron_data.data_path_items(_get(cfg, "data-path"))
        megatron_data.split_fractions(_get(cfg, "split") or "969,30,1")
    elif _get(cfg, "split"):
        raise UserError("--split goes with --data-path")
    if _get(cfg, "position-embedding-type") == "absolute":
        raise UserError("--position-embedding-type absolute: finetune_t0 refuses it (packed examples need positions "
                        "that do not depend on the row; ours restart at 0 for every example)")
    if _get(cfg, "tokenizer-type") not in (None, "PretrainedFromHF"):
        raise UserError(f"--tokenizer-type {_get(cfg, 'tokenizer-type')}: only PretrainedFromHF (a local tokenizer "
                        f"folder given by --tokenizer-name-or-path) is read here")
    if bool(_get(cfg, "tokenizer-type")) != bool(_get(cfg, "tokenizer-name-or-path")):
        raise UserError("--tokenizer-type PretrainedFromHF and --tokenizer-name-or-path DIR go together")


def _batch(out, cfg, defaults):
    """Micro / global batch size -> batch_size, gradient_accumulation_steps (over all processes)."""
    micro, glob = _get(cfg, "micro-batch-size"), _get(cfg, "global-batch-size")
    if micro is not None:
        _set(out, cfg, defaults, "batch_size", micro, "micro-batch-size")
    if glob is not None:
        micro = out["batch_size"]
        world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's; Megatron's data-parallel size
        if glob % (micro * world):
            raise UserError(f"--global-batch-size {glob} is not divisible by micro-batch-size x processes = "
                            f"{micro} x {world} (Megatron's gradient accumulation must be a whole number)")
        _set(out, cfg, defaults, "gradient_accumulation_steps", glob // micro, "global-batch-size")
    return out["batch_size"] * out["gradient_accumulation_steps"]


def _schedule(out, cfg, defaults, batch):
    """Iterations, warmup and the decay style (Megatron counts them in samples: the same at a fixed batch)."""
    if _get(cfg, "train-iters") is not None:
        _set(out, cfg, defaults, "max_iters", _get(cfg, "train-iters"), "train-iters")
    if _get(cfg, "train-samples") is not None:  # training.py:226, the remainder dropped
        _set(out, cfg, defaults, "max_iters", _get(cfg, "train-samples") // batch, "train-samples")
    if _get(cfg, "lr-warmup-iters") is not None:
        _set(out, cfg, defaults, "warmup_iters", _get(cfg, "lr-warmup-iters"), "lr-warmup-iters")
    if _get(cfg, "lr-warmup-samples") is not None:
        iters = _per_batch(_get(cfg, "lr-warmup-samples"), batch, "lr-warmup-samples")
        _set(out, cfg, defaults, "warmup_iters", iters, "lr-warmup-samples")
    if _get(cfg, "lr-decay-samples") is not None:
        iters = _per_batch(_get(cfg, "lr-decay-samples"), batch, "lr-decay-samples")
        _set(out, cfg, defaults, "lr_decay_iters", iters, "lr-decay-samples")
    style = _get(cfg, "lr-decay-style")
    if style is not None:
        if style == "cosine" and out["warmup_iters"] > 0:
            raise UserError("--lr-decay-style cosine with a warmup: Megatron warms up as lr * it / warmup, our cosine "
                            "schedule as lr * (it + 1) / (warmup + 1); use linear or constant, or no warmup")
        _set(out, cfg, defaults, "lr_scheduling", True, "lr-decay-style")
        _set(out, cfg, defaults, "lr_schedule", style, "lr-decay-style")


def _start(out, cfg, defaults):
    """--save / --load / --reset-progress / --no-load-optim -> out_dir, model_dir, init_from, reset_progress."""
    save, load = _get(cfg, "save"), _get(cfg, "load")
    if save is not None:
        _set(out, cfg, defaults, "out_dir", save, "save")
    if _get(cfg, "no-load-optim") and not cfg["reset_progress"]:
        raise UserError("--no-load-optim without --reset-progress continues the checkpoint's iteration count with a "
                        "fresh optimizer; that is not done here: add --reset-progress (a new run from the weights)")
    if load is None:
        return
    if cfg["reset_progress"]:  # a new run from the loaded weights (with --no-load-optim: the weights only)
        if save is not None and os.path.abspath(save) == os.path.abspath(load):
            raise UserError(f"--save and --load both name {load}: here a run folder holds one run, and the finetuned "
                            f"model would replace the base one; give --save another folder")
        _set(out, cfg, defaults, "model_dir", load, "load")
        out["init_from"] = "resume_model"
        out["reset_progress"] = not _get(cfg, "no-load-optim")  # ours: True = also the optimizer state
    elif save is None or os.path.abspath(save) == os.path.abspath(load):
        _set(out, cfg, defaults, "out_dir", load, "load")
        out["init_from"] = "resume_train"  # continue the run: iteration, optimizer, data position
    else:
        out["init_from"], out["resume_ckpt"] = "resume_train", os.path.join(load, "ckpt.pt")


def _deepspeed_config(out, cfg, defaults, batch):
    """Under DeepSpeed, its config's gradient_clipping is the clip (Megatron's --clip-grad is not
    used, optimizer/__init__.py:91-92); its batch sizes and precision must agree with the flags."""
    path = _get(cfg, "deepspeed_config")
    try:
        ds = json.loads(read_text(path, "--deepspeed_config file"))
    except json.JSONDecodeError as e:
        raise UserError(f"--deepspeed_config {path} is not valid JSON ({e.msg} at line {e.lineno})")
    if not isinstance(ds, dict):
        raise UserError(f"--deepspeed_config {path}: needs a JSON object")
    for field, ours in (("train_batch_size", batch), ("train_micro_batch_size_per_gpu", out["batch_size"])):
        if field in ds and ds[field] != ours:
            raise UserError(f"--deepspeed_config {path}: {field} {ds[field]!r} disagrees with the flags ({ours})")
    for prec in ("fp16", "bf16"):
        enabled = isinstance(ds.get(prec), dict) and bool(ds[prec].get("enabled"))
        if enabled != bool(_get(cfg, prec)):
            raise UserError(f"--deepspeed_config {path}: {prec} enabled={enabled} disagrees with --{prec}")
    clip = ds.get("gradient_clipping", 0.0)
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0:
        raise UserError(f"--deepspeed_config {path}: gradient_clipping must be a number >= 0, got {clip!r}")
    _set(out, cfg, defaults, "grad_clip", float(clip), "deepspeed_config")


def _flags_set(cfg):
    return {k.aliases[0] for k in MEGATRON_ARGS if cfg[k.name] not in (None, False, [])}


def translate(cfg, defaults, quiet=False):
    """A new config: the Megatron-spelled keys that are set, written into ours (each checked first
    with its own declaration); one notice line lists the accepted flags that change nothing."""
    out, given = dict(cfg), _flags_set(cfg)
    if out["optimizer"] == "adam":  # Megatron's adam is apex FusedAdam in AdamW mode
        out["optimizer"] = "adamw"
    if not given:
        return out
    for k in MEGATRON_ARGS:
        if k.aliases[0] in given:
            k.validate(cfg[k.name], f"--{k.aliases[0]}")
    _check_exclusive(cfg)
    batch = _batch(out, cfg, defaults)
    _schedule(out, cfg, defaults, batch)
    _start(out, cfg, defaults)
    for flag, key, value in (("seq-length", "max_seq_len", _get(cfg, "seq-length")),
                             ("norm-target-loss", "loss_normalization", "example"),
                             ("fp16", "dtype", "float16"), ("bf16", "dtype", "bfloat16"),
                             ("checkpoint-activations", "activation_checkpointing", True)):
        if flag in given:
            _set(out, cfg, defaults, key, value, flag)
    if "eval-iters" in given:
        _set(out, cfg, defaults, "eval_iters", _get(cfg, "eval-iters") * out["gradient_accumulation_steps"], "eval-iters")
    if "deepspeed_config" in given:
        _deepspeed_config(out, cfg, defaults, batch)
    noops = sorted(given & set(NOOP))
    if noops and not quiet:
        print(f"notice: Megatron arguments accepted that change nothing here: {', '.join('--' + f for f in noops)} "
              f"(docs/t0.md lists why)", file=sys.stderr)
    return out


def check_against_base(cfg, model_args):
    """The architecture flags describe the loaded model: they must match the base checkpoint."""
    hidden = ModelArgs(**model_args).ffn_hidden_dim()
    for flag, ours, name in (("num-layers", model_args["n_layers"], "n_layers"), ("hidden-size", model_args["dim"], "dim"),
                             ("num-attention-heads", model_args["n_heads"], "n_heads"),
                             ("pad-vocab-size-to", model_args["vocab_size"], "vocab_size"),
                             ("ffn-hidden-size", hidden, "hidden_dim")):
        value = _get(cfg, flag)
        if value is not None and value != ours:
            raise UserError(f"--{flag} {value}: the base checkpoint has {name}={ours} (the model is the checkpoint's)")
    path = _get(cfg, "tokenizer-name-or-path")
    if path is not None and len(load_hf_tokenizer(path)) > model_args["vocab_size"]:
        raise UserError(f"--tokenizer-name-or-path {path}: {len(load_hf_tokenizer(path))} tokens, more than the base "
                        f"model's vocabulary of {model_args['vocab_size']}")
    positions = _get(cfg, "max-position-embeddings")
    if positions is not None and positions < cfg["max_seq_len"]:
        raise UserError(f"--max-position-embeddings {positions} is below --seq-length {cfg['max_seq_len']} "
                        f"(Megatron's assert)")


def load_hf_tokenizer(path):
    """A local Hugging Face tokenizer folder (AutoTokenizer; nothing is downloaded)."""
    if not os.path.isdir(path):
        raise UserError(f"--tokenizer-name-or-path {path}: not a folder (a local Hugging Face tokenizer folder is read "
                        f"here; nothing is downloaded)")
    from transformers import AutoTokenizer  # slow to import: only when asked for
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise UserError(f"--tokenizer-name-or-path {path}: AutoTokenizer cannot load it ({str(e).splitlines()[0]})")
