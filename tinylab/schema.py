"""Every config key of every program, declared once: type, default, allowed values, one-line help.

    TRAIN        train.py (language modelling on pretokenized TinyStories datasets)
    FINETUNE_T0  finetune_t0.py (T0-style multitask finetuning): TRAIN's shared keys, with T0's
                 defaults, plus its own data / loss / rank-evaluation keys
    SAMPLE, GROW, EVAL   the tools' flags (sample.py, grow.py, the evaluation/ scripts), built from
                 the same Key objects where a setting is the same setting
    COMPARE      evaluation/compare_checkpoints.py: EVAL's keys for two or more checkpoints

The machinery (parsing, validation, --help) is config.py's. Cross-key rules are the functions
below the declarations; everything is checked before a run writes anything.
"""
from tinylab.core.config import Key, Schema, check_device
from tinylab.core.distributed import PARALLELISMS, check_fsdp_setting
from tinylab.core.errors import UserError
from tinylab.data.dataset_spec import FEATURES, STORY_FEATURES
from tinylab.growth.operators import (
    C_DEPTH,
    C_WIDTH,
    PLACEMENTS,
    SLOPE_THRESHOLDS,
    SYMMETRY_BREAKING,
    parse_auto_growth,
    parse_grow_schedule,
    unreachable_growth,
)
from tinylab.growth.operators import MODES as GROW_MODES
from tinylab.nn import attention
from tinylab.nn.attention import check_attention_impl
from tinylab.t0.data import MAX_PACK_BUFFER, MIXINGS, NORMALIZATIONS, PACKINGS, TRUNCATE_SIDES, TRUNCATIONS
from tinylab.t0.megatron import check_weighted_splits
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

BATCH_SIZE = Key("batch_size", 128, "micro-batch size (sequences per forward pass)", range=COUNT)
MAX_SEQ_LEN = Key("max_seq_len", 256, "context length in tokens", range=COUNT)
TOKENIZER_MODEL = Key("tokenizer_model", "", "sentencepiece .model to use instead of the default one", input=True)
DATA_CACHE_DIR = Key("data_cache_dir", "data", "where raw shards, tokenizers and pretokenized datasets live",
                     nonempty=True)

LM_DATA = [
    BATCH_SIZE, MAX_SEQ_LEN,
    Key("vocab_source", "custom", "custom: <data_cache_dir>/tok{vocab_size}.model, else tokenizers/tok{vocab_size}"
        ".model | llama2: the Llama 2 tokenizers/tokenizer.model",
        choices=("custom", "llama2")),
    Key("vocab_size", 8192, "tokenizer size (vocab_source=custom); ids are stored as uint16", range="[1, 65536]"),
    TOKENIZER_MODEL, DATA_CACHE_DIR,
    Key("dataset_name", "F_none_MM_none_AT_none_RF_none_IS_none", "pretokenized dataset to train on "
        "(<data_cache_dir>/tok{V}/<dataset_name>)", nonempty=True),
    Key("eval_dataset_names", [], "extra datasets whose test shard is evaluated as loss/<name>"),
    Key("eval_batch_size", 0, "micro-batch size of the loss evaluations; 0 = batch_size", range=NONNEG),
    Key("warmup_bsz", 0, "tokens over which the global batch grows from warmup_bsz_start sequences to "
        "batch_size * gradient_accumulation_steps (staged-training's --warmup_bsz); 0 = off", range=NONNEG),
    Key("warmup_bsz_start", 64, "sequences in the first batch of a batch-size warmup", range=COUNT),
    Key("warmup_seq", 0, "tokens over which the sequence length grows from warmup_seq_start to max_seq_len "
        "(staged-training's --warmup_seq); 0 = off", range=NONNEG),
    Key("warmup_seq_start", 64, "tokens per sequence at the start of a sequence-length warmup", range=COUNT),
    Key("critical_batch_size", True, "log the gradient-noise estimate of the critical batch size on log steps "
        "(needs gradient accumulation)"),
    Key("split_shards_pretrain", False, "80/20 split of the train shards into pretrain / fine-tune"),
    Key("pretraining", True, "with split_shards_pretrain: True = the first 80%, False = the last 20%"),
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

# the original's auxiliary heads on a frozen model (tinylab/eval/probes.py; docs/evaluation.md, "Probes and lenses in training")
HEADS = [
    Key("probes", False, "train per-layer linear feature probes on blocks 0..n_layers-2 of the frozen model (story-only "
        "inputs, BCE on the Features labels): loss/<key>/probe_<i>, acc/<key>/probe_<i>, acc/<key>/feat_<j>/probe_<i>"),
    Key("probes_classes", len(STORY_FEATURES), "outputs per probe: the first N features in STORY_FEATURES order "
        "(twist, foreshadowing, dialogue, badending, moralvalue, conflict)", range=f"[1, {len(STORY_FEATURES)}]"),
    Key("lenses", False, "train a linear lens dim -> vocab per block 0..n_layers-2 of the frozen model (next-token loss "
        "at every position): loss/<key>/probe_<i>, i = n_layers-1 the model's own head"),
    Key("init_lens_with_unembed", False, "lenses start as copies of the output head (else N(0, 0.02))"),
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

GROW_C_WIDTH = Key("grow_c_width", C_WIDTH, "target mode: S_target = S_pre / c after width growth", range="[1, inf)")
GROW_C_DEPTH = Key("grow_c_depth", C_DEPTH, "target mode: S_target = S_pre / c after depth growth", range="[1, inf)")
GROW_REWARMUP = Key("grow_rewarmup_iters", 150, "target mode: linear LR re-warmup iterations after growth",
                    range=NONNEG)
GROW_MODE = Key("grow_mode", "target", "target: schedule back to S_pre/c + LR re-warmup | exact: reproduce the "
                "small model's updates (width only)", choices=GROW_MODES)
GROW_SB = Key("grow_symmetry_breaking", "", "how the duplicated halves split each matrix; '' = random (target), "
              "off (exact)", choices=("",) + SYMMETRY_BREAKING)
GROWTH = [
    Key("grow_schedule", "", "grow inside the run: '2000:weights,6000:layers' (double width / depth after those "
        "iterations) or 'auto:weights,layers' (when the paper's slope rule fires on loss/test; docs/growth.md §7)"),
    GROW_MODE, GROW_SB, GROW_C_WIDTH, GROW_C_DEPTH, GROW_REWARMUP,
]

MAX_NEW_TOKENS = Key("max_new_tokens", 350, "tokens generated per prompt; 0 = no generations", range=NONNEG)
TEMPERATURE = Key("temperature", 1.0, "sampling temperature; 0 = greedy", range=NONNEG)
TOP_K = Key("top_k", 0, "sample among the k most likely tokens; 0 = all", range=NONNEG)
GENERATION = [
    TEMPERATURE, TOP_K, MAX_NEW_TOKENS,
    Key("generation_eval_iters", 1, "prompts per dataset = generation_eval_iters * generation_batch_size; "
        "0 = no generations", range=NONNEG),
    Key("generation_batch_size", 16, "prompts generated together", range=COUNT,
        aliases=("generation_eval_batch_size",)),
    Key("generation_eval_interval_multiplier", 1, "generations every N evaluations", range=COUNT),
    Key("generation_datasets", [], "which of 'id' and eval_dataset_names get generations; [] = all of them"),
    Key("feature_eval", "", "a feature to judge in the generations, logged as gen_feature_score "
        "(evaluation/eval_features.py)", choices=("",) + FEATURES),
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


def check_generation_datasets(cfg):
    unknown = sorted(set(cfg["generation_datasets"]) - {"id", *cfg["eval_dataset_names"]})
    if unknown:
        raise UserError(f"generation_datasets names {unknown}, which are neither 'id' nor in eval_dataset_names")


def check_growth(cfg):
    schedule = parse_grow_schedule(cfg)
    parse_auto_growth(cfg)
    # a resumed run may carry schedule shifts of its own (a grow.py checkpoint): checked from 0 only
    late = None if cfg["init_from"] in ("resume_train", "resume") else unreachable_growth(cfg, schedule)
    if late:
        it, end = late
        beyond = (f"max_iters={cfg['max_iters']}" if end == cfg["max_iters"] else
                  f"the run's end at iteration {end} (max_iters={cfg['max_iters']} + {end - cfg['max_iters']} from "
                  f"the earlier growths' schedule shifts)")
        raise UserError(f"grow_schedule step {it} is beyond {beyond}: the run stops before it and would never grow "
                        f"there; raise max_iters or move the step")


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


def check_heads(cfg):
    if cfg["probes"] and cfg["lenses"]:
        raise UserError("probes=True and lenses=True: one kind of heads per run (the original logs both as "
                        "loss/<key>/probe_<i>, and trains them on different batches)")
    if cfg["init_lens_with_unembed"] and not cfg["lenses"]:
        raise UserError("init_lens_with_unembed=True needs lenses=True")
    kind = "probes" if cfg["probes"] else "lenses" if cfg["lenses"] else None
    if kind and cfg["grow_schedule"]:
        raise UserError(f"{kind}=True trains heads on a frozen model: it cannot grow (grow_schedule)")
    if kind == "probes" and (cfg["warmup_bsz"] or cfg["warmup_seq"]):
        raise UserError("probes=True reads whole stories: batch-size / sequence-length warmups do not apply")
    if kind == "probes" and cfg["feature_eval"]:
        raise UserError("feature_eval judges generations, which a probes=True run does not make")


def prepare_train(cfg):
    return apply_optimizer_preset(cfg, TRAIN.defaults())


TRAIN = Schema("train.py", [
    ("I/O", IO), ("wandb", WANDB), ("data", LM_DATA), ("model", MODEL),
    ("probes and lenses: heads trained on the frozen model", HEADS), ("optimizer and schedule", OPTIMIZER),
    ("Adafactor", ADAFACTOR), ("staged training: growth inside the run", GROWTH),
    ("generation evaluation", GENERATION), ("system", SYSTEM),
], rules=[check_model_shape, check_schedule, check_warmups, check_save_best, check_init, check_generation_datasets, check_growth,
       check_heads, check_parallelism],
    prepare=prepare_train)


# ---------------------------------------------------------------------- finetune_t0.py

T0_DATA = [
    Key("mixture", "", "mixture.json: {\"train\": [sources], \"valid\": [sources or groups], \"test\": [...]} "
        "(docs/t0.md)", input=True),
    Key("make_demo_data", "", "write the built-in multitask set to this folder and exit (an existing one is moved "
        "aside only with --overwrite=True)", output="demo_data"),
    Key("mixing", "example", "example: mix examples by weight, then pack | row: Megatron's blend of packed rows",
        choices=MIXINGS),
    TOKENIZER_MODEL.replace(help="'' = the tokenizer named by the base checkpoint's config"),
    Key("add_bos", True, "BOS before every input (our models were pretrained with one per document)"),
    Key("target_space", True, "exactly one space between input and target (False: the target text as is)"),
    Key("add_eos", True, "EOS after every target (what makes generation stop)"),
    Key("max_input_len", 1024, "input limit in tokens (BOS included; T0's)", range=COUNT),
    Key("max_target_len", 256, "target limit in tokens (EOS included; T0's)", range=COUNT),
    Key("truncation", "truncate", "what to do with examples over those limits", choices=TRUNCATIONS),
    Key("truncate_side", "left", "which part of a too-long input is kept: left = BOS + its last tokens (the question) "
        "| right = its first max_input_len tokens (Mesh-TF / seqio, as T0 was trained)", choices=TRUNCATE_SIDES),
    Key("packing", "best_fit", "best_fit: best-fit decreasing over pack_buffer drawn examples, rows in an order that "
        "keeps the mixture's proportions (>= 0.99 full on long-tailed lengths) | next_fit: the earlier greedy packer, "
        "examples in draw order (~0.85-0.88 full)", choices=PACKINGS),
    Key("pack_buffer", 2000, "packing=best_fit: examples packed together (more = fuller rows, more work per chunk)",
        range=f"[1, {MAX_PACK_BUFFER}]"),
    Key("pad_id", 0, "id written into padding (masked everywhere, so any id works)", range=NONNEG),
    BATCH_SIZE.replace(default=16, help="packed rows per micro-batch"),
    MAX_SEQ_LEN.replace(default=0, range=NONNEG, help="row length L (rows hold L + 1 tokens); 0 = the base model's"),
    Key("pretrain_text", "", "a pretokenized dataset folder whose test shard's LM loss is logged as "
        "loss/valid/pretrain_text (forgetting; not in loss/valid)", input=True),
]
T0_LOSS = [
    Key("prefixlm", False, "input tokens of an example attend to each other both ways"),
    Key("loss_normalization", "token", "token | example (BLOOMZ --norm-target-loss) | token_microbatch (Megatron)",
        choices=NORMALIZATIONS),
    Key("rank_eval_examples", 200, "rank-classification examples per validation group with answer_choices; "
        "0 disables", range=NONNEG),
    Key("rank_eval_batch_size", 0, "0 = batch_size", range=NONNEG),
    Key("score_eos", False, "also score each choice's EOS"),
    # the backends' names and words from their registry (tinylab/nn/attention/)
    Key("attention_impl", "auto", attention.describe(), choices=attention.choices()),
]


def _megatron_split_keys():
    """Megatron's data arguments in its spelling (docs/t0.md, "Megatron-DeepSpeed's data and arguments")."""
    keys = []
    for split, what in (("train", "the training blend"), ("valid", "validation groups, each evaluated on its own"),
                        ("test", "test groups, evaluated once at the end (loss/test/<name>)")):
        keys.append(Key(f"{split}_weighted_split_paths", [], f"{what}: --{split}-weighted-split-paths "
                        f"\"NAME: W1 START:END PREFIX1, W2 START:END PREFIX2\" [\"NAME2: ...\" ...]", type=list, sep=None,
                        nargs="+", aliases=(f"{split}-weighted-split-paths",)))
        keys.append(Key(f"{split}_weighted_split_paths_path", "", f"a file holding the {split} groups as one line of "
                        f"quoted groups (Megatron's --{split}-weighted-split-paths-path)", nargs=1,
                        aliases=(f"{split}-weighted-split-paths-path",)))
    return keys


T0_MEGATRON = _megatron_split_keys() + [
    Key("preprocess", False, "write --input's inputs/targets as a Megatron indexed prefix --output_prefix and exit "
        "(tools/preprocess_data.py's files, with this run's tokenizer and tokenisation keys)", nargs=0),
    Key("input", "", "--preprocess: the json / jsonl / parquet file of inputs and targets", nargs=1, input=True),
    Key("output_prefix", "", "--preprocess: writes <prefix>_inputs_document.{bin,idx} and "
        "<prefix>_targets_document.{bin,idx} (existing ones only with --overwrite=True)", nargs=1,
        aliases=("output-prefix",), output="megatron_prefix"),
]


def check_megatron(cfg):
    if cfg["preprocess"]:
        if not cfg["input"] or not cfg["output_prefix"]:
            raise UserError("--preprocess needs --input=FILE.jsonl and --output_prefix=PREFIX")
        if cfg["make_demo_data"]:
            raise UserError("--preprocess and --make_demo_data are two separate commands; give one")
        if not cfg["tokenizer_model"] and not cfg["model_dir"]:
            raise UserError("--preprocess tokenises with the base checkpoint's tokenizer: give --model_dir=DIR "
                            "(or --tokenizer_model=FILE.model)")
    elif cfg["input"] or cfg["output_prefix"]:
        raise UserError("--input / --output_prefix are for --preprocess (a Megatron indexed dataset from a jsonl file)")
    check_weighted_splits(cfg)


T0_START = [
    Key("reset_progress", False, "init_from=resume_model: also take model_dir's optimizer state (moments, Adafactor's "
        "step counts); the iteration count, LR schedule, data stream and best loss start at 0 (Megatron's "
        "--reset-progress without --no-load-optim)", nargs=0, aliases=("reset-progress",)),
]


def check_reset_progress(cfg):
    if cfg["reset_progress"] and cfg["init_from"] != "resume_model":
        raise UserError(f"reset_progress=True restarts a run from model_dir's weights and optimizer state: it needs "
                        f"init_from=resume_model, not {cfg['init_from']} (resume_train continues out_dir's progress)")


def check_t0(cfg):
    if cfg["init_from"] not in ("resume_model", "resume_train"):
        raise UserError(f"init_from must be resume_model (finetune --model_dir) or resume_train (continue --out_dir), "
                        f"not '{cfg['init_from']}'")
    if not cfg["make_demo_data"] and not cfg["preprocess"]:
        check_init(cfg)


# finetuning settings that go with an optimizer preset (docs/t0.md), unless set by the user
PRESET_EXTRAS = {"bloomz_adam": {"loss_normalization": "example", "prefixlm": False}}


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
    drop=[k.name for k in LM_DATA + GROWTH + GENERATION + HEADS] + [k.name for k in MODEL if k is not DROPOUT],
    sections=[("data", T0_DATA), ("Megatron-DeepSpeed data and arguments", T0_MEGATRON),
              ("masks, loss and rank evaluation", T0_LOSS), ("starting point", T0_START)],
    rules=[check_schedule, check_save_best, check_t0, check_megatron, check_parallelism, check_attention_impl,
           check_reset_progress],
    prepare=prepare_t0)


# ---------------------------------------------------------------------- the tools

CHECKPOINT = Key("checkpoint", "out/ckpt.pt", "our checkpoint (ckpt.pt or its folder) or a Hugging Face Llama folder",
                 nonempty=True, input=True)
TOOL_DATA_CACHE = DATA_CACHE_DIR.replace(default="", nonempty=False,
                                         help="where tokenizers and datasets live (default: the checkpoint's config)")

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

GROW = Schema("grow.py", [
    ("growth", [
        Key("doubling", None, "weights (width x2) | layers (depth x2)", type=str, choices=("weights", "layers")),
        Key("resume", None, "checkpoint file or a folder holding ckpt.pt", type=str, nonempty=True, input=True),
        Key("out_dir", None, "folder for the grown ckpt.pt (default: <checkpoint>.doubled_weights / "
            ".doubled_layer beside the input, the original's names)", type=str, nonempty=True,
            output="grown_checkpoint", output_path=False),
        GROW_MODE.replace(name="mode"),
        GROW_SB.replace(name="symmetry_breaking"),
        Key("sb_scale", 0.5, "symmetry_breaking=random: R ~ N(0, (sb_scale * RMS(W))^2)", range=NONNEG),
        Key("sb_alpha", 0.8, "symmetry_breaking=split: A = C = alpha W, B = D = (1 - alpha) W", range="[0, 1]"),
        Key("placement", "interleave", "layers: the copy of layer i at 2i + 1, or all copies after the stack",
            choices=PLACEMENTS),
        SEED.replace(default=0, help="seed of the symmetry-breaking noise"),
        GROW_C_WIDTH.replace(name="c_width"), GROW_C_DEPTH.replace(name="c_depth"),
        GROW_REWARMUP.replace(name="rewarmup_iters"),
        Key("force", False, "replace an existing grown checkpoint or plan (never a training run's checkpoint)"),
    ]),
    ("the staged-training repository's flags (docs/growth.md §6.5)", [
        Key("doubling_layers", None, "layers: alternate_id | append_id (function-preserving: the copies' output "
            "projections are zero; = --placement interleave | append) | alternate_copy | append_copy (plain "
            "copies, NOT loss-preserving: the loss change is printed)", type=str,
            choices=("alternate_id", "append_id", "alternate_copy", "append_copy")),
        Key("restart_steps", None, "the grown run's schedule position: its first step is restart_steps + 1 "
            "(replaces target mode's S_pre / c)", type=int, range=NONNEG),
        Key("restart_warmup_steps", 0, "with --restart_steps: a linear re-warmup over this many steps, the "
            "original's get_restart_linear_schedule_with_warmup", range=NONNEG),
        Key("reset_lr_scheduler", False, "the grown run takes its peak learning rate from the config it is resumed "
            "with (without it, with --restart_steps, the checkpoint's learning_rate is kept, as a restored "
            "LambdaLR keeps its base_lrs)"),
        Key("reset_optimizer", False, "drop the optimizer state: the grown run starts with fresh AdamW moments"),
    ]),
    ("plan (--plan): growth points from the runs' fitted scaling laws (docs/growth.md §7.1)", [
        Key("plan", False, "plan the compute-optimal growth stages from run logs instead of growing a checkpoint"),
        Key("runs", [], "run folders with config.json + metrics.jsonl: --runs A B (or --runs=A,B)", input=True),
        Key("budget", None, "training FLOPs of the whole plan: recommend the lowest predicted final loss",
            type=float, range=POSITIVE),
        Key("target_loss", None, "instead: the least compute to this loss (with --budget as a cap)", type=float,
            range=POSITIVE),
        Key("max_growths", 2, "candidate plans grow up to this many times", range="[0, 4]"),
        Key("operators", "weights,layers", "the growth operators the candidates combine (weights, layers)",
            check=lambda v: None if all(o.strip() in ("weights", "layers") for o in v.split(","))
            else "must be a comma-separated list of weights, layers"),
        Key("threshold_width", SLOPE_THRESHOLDS["weights"], "grow width when d log10 L / d log10 C rises above this",
            range="(-inf, 0)"),
        Key("threshold_depth", SLOPE_THRESHOLDS["layers"], "grow depth when the slope rises above this",
            range="(-inf, 0)"),
        Key("threshold_optimality", SLOPE_THRESHOLDS["optimality"], "the optimality point (reported for the last "
            "stage)", range="(-inf, 0)"),
        Key("continue_at", "c", "c: the grown model continues at S_pre / c_width or c_depth (the paper) | loss: at "
            "the step where its fitted curve has the loss at growth", choices=("c", "loss")),
        Key("alpha_N", 0.076, "one model size in --runs: E(N) = (N_c/N)^alpha_N with this exponent (Kaplan et al.)",
            range=POSITIVE),
        Key("plan_out", "", "the plan's JSON ('' = <first run>/growth_plan.json); replaced only with --force",
            output="json"),
    ]),
])

EVAL = Schema("evaluation", [
    ("model", [CHECKPOINT, TOKENIZER_MODEL.replace(help="sentencepiece .model (default: the one the checkpoint's "
                                                   "config names)"),
               TOOL_DATA_CACHE, DEVICE.replace(help="cpu, cuda, ... ('' = cuda when available)"),
               DTYPE.replace(default="float32", choices=DTYPES, help="precision of the model"),
               BATCH_SIZE.replace(default=8, help="sequences per forward pass"), SEED,
               Key("out", "", "also write the metrics JSON to this file (an existing one only with --force)",
                   output="json"),
               Key("force", False, "replace an existing --out (never a checkpoint, a run's files or another kind)")]),
])


def _check_pairs(pairs):
    for p in pairs:
        a, sep, b = p.partition(":")
        if not (sep and a.strip().isdigit() and b.strip().isdigit()) or int(a) == int(b):
            return f"{p!r} is not a pair A:B of two different checkpoint positions (0 = the first), e.g. 0:1"
    return None


def check_compare(cfg):
    if cfg["dataset"] and cfg["prompts"]:
        raise UserError("--dataset and --prompts both name the prompts; pass one of them")


# evaluation/compare_checkpoints.py: its checkpoints are positional (two or more), not --checkpoint
COMPARE = EVAL.derive("evaluation/compare_checkpoints.py", drop=["checkpoint", "force"], rules=[check_compare], keys=[
    EVAL.keys["out"].replace(help="also write the JSON to this file (an existing one only with --force)")],
    sections=[("comparison", [
        Key("dataset", "", "pretokenized dataset (in the first checkpoint's data cache) whose test examples are the "
            "prompts; '' = the dataset the first checkpoint was trained on"),
        Key("prompts", "", "instead of --dataset: a prompt file (plain text: one per line; .jsonl: a 'text' field "
            "or a JSON string per line)", input=True),
        Key("num_prompts", 64, "prompts: a seeded choice of test examples of --dataset, or the first N of --prompts",
            range=COUNT),
        Key("story_only", False, "--dataset: BOS + the story (the probes' inputs) instead of the whole example"),
        Key("pairs", [], "pairs to compare as A:B positions (0 = the first checkpoint), e.g. 0:1,1:2; [] = each "
            "consecutive pair and each checkpoint against the first", check=_check_pairs),
        Key("labels", [], "names of the checkpoints in the outputs, one each; [] = their run folders' names"),
        Key("plot", "", "also draw the heat maps to this PNG (an existing one only with --force)", output="png"),
        Key("force", False, "replace an existing --out / --plot"),
    ])])

# the drivers by file name (sweep.py checks a sweep's parameters against them)
DRIVERS = {"train.py": TRAIN, "finetune_t0.py": FINETUNE_T0}
