"""staged-training's `eval_wikitext.py train TRAIN_DATASET_PATH VALIDATION_DATASET_PATH LOG_DIR`,
through this project's one model (model.py) and one training loop (trainer.py); the flags are
evaluation/eval_wikitext.py's, the protocol and what differs from the original are in
docs/evaluation.md ("The staged-training repository's commands").

    data        token files (token_files.py): blocks of --block-size, [BOS] + block_size - 2 tokens
                + [EOS]; training batches a seeded shuffle of the training file's chunks
                (ChunkBatches, --data-seed), exactly resumable; validation the first
                --validation-steps batches of the validation file, in order, every time
    model       our Llama-style Transformer with --hidden-size / --num-layers / --num-heads,
                context --block-size, dropout 0.1 (GPT-2's config), tied embeddings; the
                vocabulary is --vocab-size, or the largest id in the two files (and the BOS /
                EOS ids) + 1; initial weights seeded by --init-seed
    optimizer   AdamW (--lr, default 0.003239 - 0.0001395 ln N over the N non-embedding
                parameters; --adam-beta1/2, --adam-epsilon), no weight decay, no gradient
                clipping, LR linear warmup over --warmup-steps then linear decay to 0 at
                --train-steps (lr_schedule=linear: get_linear_schedule_with_warmup)
    run folder  LOG_DIR (rundir.py): a new run needs it absent or empty, as the original
                asserted; --recover continues the run in it exactly (resume_train), --recover
                --recover-from=DIR first copies DIR's run into an empty LOG_DIR
    logs        LOG_DIR/metrics.jsonl: loss/train and lr every 10 steps, val_loss and val_ppl
                every --validate-every steps (W&B too when a --wandb-* flag is given);
                LOG_DIR/ckpt.pt every --checkpoint-every steps and at the end;
                LOG_DIR/staged_training.json: the resolved settings (vocabulary, BOS / EOS,
                learning rate), which `eval_wikitext.py eval --checkpoint-file` reads
"""
import math
import os
import shutil
from dataclasses import dataclass

import torch

from model import Transformer
from tinylab.core.errors import UserError
from tinylab.core.rundir import LOCK_NAME, RunDir
from tinylab.eval.staged_eval import RUN_INFO
from tinylab.eval.token_files import ChunkBatches, TokenFile, check_special_ids, ordered_batches, to_xy
from tinylab.training.options import TrainerOptions, model_args_from_config
from tinylab.training.setup import Run, fit_and_close, init_model, seed_everything, start_run, training_state
from tinylab.training.trainer import Trainer

LR_RULE = (0.003239, 0.0001395)  # the original's default learning rate: a - b ln(N)
GPT2_DROPOUT = 0.1  # GPT2Config's resid / embd / attn dropout, which the original trained with
DEFAULT_WANDB_PROJECT = "staged-training"
LOG_EVERY = 10  # the original logged every 10 steps


def default_lr(non_embedding_params: int) -> float:
    a, b = LR_RULE
    return a - b * math.log(non_embedding_params)


def non_embedding_params(cfg) -> int:
    """Parameters of the model `cfg` describes, without the token embedding (which the output
    head shares): the original's count, which left out GPT-2's token and position embeddings."""
    with torch.device("meta"):
        model = Transformer(model_args_from_config(cfg))
    return model.num_params(non_embedding=True)


def _entries(folder):
    return sorted(e for e in os.listdir(folder) if e != LOCK_NAME) if os.path.isdir(folder) else []


def check_log_dir(a):
    """The original's assertions about LOG_DIR (and --recover-from), as one-line errors, before
    anything is written."""
    if a.recover_from and not a.recover:
        raise UserError("--recover-from needs --recover (the original ignored it without)")
    if os.path.lexists(a.log_dir) and not os.path.isdir(a.log_dir):
        raise UserError(f"LOG_DIR {a.log_dir} exists and is not a folder")
    if a.recover and a.recover_from:
        if not os.path.isfile(os.path.join(a.recover_from, "ckpt.pt")):
            raise UserError(f"--recover-from={a.recover_from} holds no run to recover (no ckpt.pt)")
        if _entries(a.log_dir):
            raise UserError(f"LOG_DIR {a.log_dir} is not empty: --recover-from copies a run into an empty or new LOG_DIR")
    elif a.recover:
        if not os.path.isfile(os.path.join(a.log_dir, "ckpt.pt")):
            raise UserError(f"--recover: LOG_DIR {a.log_dir} holds no run to recover (no ckpt.pt)")
    elif _entries(a.log_dir):
        raise UserError(f"LOG_DIR {a.log_dir} is not empty: pass --recover to continue the run in it, or choose a "
                        f"new or empty folder")


def decay_end(a) -> int:
    """lr_decay_iters of the run: 0 (= --train-steps, the original's decay to 0 there), or, for a
    warmup longer than the run, the warmup's end. The original runs such a run, its learning rate
    rising all along (get_linear_schedule_with_warmup: step / warmup), and learning_rate says so; the
    positions never reach the warmup's end, so no learning rate changes, and TRAIN's rule against
    a warmup that never ends (which would name warmup_iters, not --warmup-steps) does not apply."""
    return a.warmup_steps if a.warmup_steps > a.train_steps else 0


def train_config(a, vocab_size: int, learning_rate: float, schema) -> dict:
    """The full train.py config of the run (what ckpt.pt and config.json record), checked by
    `schema`, train.py's (evaluation/eval_wikitext.py passes it)."""
    tags = [t.strip() for t in (a.wandb_tags or "").split(",") if t.strip()]
    overrides = dict(
        out_dir=a.log_dir, init_from="resume_train" if a.recover else "scratch", overwrite=False,
        eval_interval=a.validate_every, checkpoint_interval=a.checkpoint_every, log_interval=LOG_EVERY,
        eval_iters=a.validation_steps, always_save_checkpoint=True, save_best_model=False, keep_best_checkpoint=False,
        export_bin=False, eval_only=False,
        seed=a.init_seed,
        wandb_log=bool(a.wandb_entity or a.wandb_project or tags), wandb_project=a.wandb_project or DEFAULT_WANDB_PROJECT,
        wandb_entity=a.wandb_entity, wandb_tags=tags,
        batch_size=a.batch_size, max_seq_len=a.block_size, vocab_source="custom", vocab_size=vocab_size,
        tokenizer_model="", dataset_name=os.path.abspath(a.train_dataset_path), eval_dataset_names=[],
        dim=a.hidden_size, n_layers=a.num_layers, n_heads=a.num_heads, n_kv_heads=a.num_heads, hidden_dim=0,
        dropout=GPT2_DROPOUT, tie_embeddings=True,
        gradient_accumulation_steps=a.grad_accum, learning_rate=learning_rate, lr_scheduling=True, decay_lr=True,
        lr_schedule="linear", max_iters=a.train_steps, warmup_iters=a.warmup_steps, lr_decay_iters=decay_end(a), min_lr=0.0,
        optimizer="adamw", weight_decay=0.0, beta1=a.adam_beta1, beta2=a.adam_beta2, adam_eps=a.adam_epsilon,
        grad_clip=0.0, max_new_tokens=0, device=a.device, dtype="float16" if a.amp else "float32", compile=False,
    )
    unknown = sorted(set(overrides) - set(schema.keys))
    if unknown:
        raise RuntimeError(f"staged_train: {schema.prog} has no keys {unknown}")  # a bug here, not the user's input
    return schema.validate({**schema.defaults(), **overrides})


class Validation:
    """The evaluate() callable of the Trainer: the mean over the first --validation-steps batches
    of the validation file (in file order, the same every time) of each batch's mean loss."""

    def __init__(self, tf: TokenFile, block_size, batch_size, bos_id, eos_id, steps, device):
        self.batches = list(ordered_batches(tf, block_size, batch_size, bos_id, eos_id, max_batches=steps))
        self.device = device

    def __call__(self, model, iter_num, generations):
        losses = []
        for blocks in self.batches:
            x, y = to_xy(blocks, self.device)
            model(x, y, return_logits=False)
            losses.append(float(model.last_loss))
        val = sum(losses) / len(losses)
        return {"val_loss": val, "val_ppl": math.exp(val) if val < 700 else float("inf")}


@dataclass
class TokenData:
    """The two token files, checked, and the vocabulary of the model trained on them."""
    train: TokenFile
    valid: TokenFile
    n_train: int  # blocks of --block-size
    n_valid: int
    vocab: int


def check_train_inputs(a) -> TokenData:
    """Every check of the flags and the token files that needs no model: LOG_DIR, the files'
    blocks and ids, the head size, the vocabulary, --amp's device."""
    check_log_dir(a)
    train = TokenFile(a.train_dataset_path, "TRAIN_DATASET_PATH")
    valid = TokenFile(a.validation_dataset_path, "VALIDATION_DATASET_PATH")
    n_train, n_valid = train.check_chunks(a.block_size), valid.check_chunks(a.block_size)
    if a.hidden_size % a.num_heads or (a.hidden_size // a.num_heads) % 2:
        raise UserError(f"--hidden-size={a.hidden_size} must be --num-heads={a.num_heads} times an even head size "
                        f"(RoPE rotates pairs of channels)")
    if a.vocab_size:
        for tf in (train, valid):
            tf.check_ids(a.vocab_size, what="--vocab-size")
        check_special_ids(a.bos_id, a.eos_id, a.vocab_size, "--bos-id / --eos-id")
        vocab = a.vocab_size
    else:
        vocab = max(train.max_id(), valid.max_id(), a.bos_id, a.eos_id) + 1
    if vocab > 65536:
        raise UserError(f"the vocabulary would be {vocab} ids; token files hold uint16 ids (at most 65536)")
    if a.amp and not (a.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
        raise UserError("--amp (fp16 mixed precision with a gradient scaler, as the original's Accelerator(fp16=True)) "
                        "needs a CUDA device")
    return TokenData(train, valid, n_train, n_valid, vocab)


def learning_rate(a, n_params: int, log) -> float:
    """--lr, or the original's default for a model of n_params non-embedding parameters."""
    if decay_end(a):
        log(f"notice: --warmup-steps={a.warmup_steps} is longer than --train-steps={a.train_steps}: the learning rate "
            f"rises all along and never decays (as in the original)")
    lr = a.lr if a.lr is not None else default_lr(n_params)
    if lr <= 0:
        raise UserError(f"the default learning rate {LR_RULE[0]} - {LR_RULE[1]} ln({n_params:,}) = {lr:.3g} is not "
                        f"positive for a model this large: pass --lr")
    return lr


def run_info(a, data: TokenData, n_params: int, lr: float) -> dict:
    """staged_training.json: the resolved settings, which `eval_wikitext.py eval` reads back."""
    return {"command": "evaluation/eval_wikitext.py train",
            "train_dataset_path": os.path.abspath(a.train_dataset_path),
            "validation_dataset_path": os.path.abspath(a.validation_dataset_path),
            "block_size": a.block_size, "bos_id": a.bos_id, "eos_id": a.eos_id, "vocab_size": data.vocab,
            "vocab_size_from": "--vocab-size" if a.vocab_size else "the token files: largest id (or BOS / EOS) + 1",
            "non_embedding_params": n_params, "learning_rate": lr,
            "learning_rate_from": "--lr" if a.lr is not None else f"{LR_RULE[0]} - {LR_RULE[1]} ln(non_embedding_params)",
            "init_seed": a.init_seed, "data_seed": a.data_seed}


def copy_recovered_run(a, copied: list, log):
    """--recover-from: its run's entries into the (empty, locked) LOG_DIR; each path copied is
    appended to `copied` as it is made, so a failure can remove exactly those."""
    for e in _entries(a.recover_from) if a.recover_from else []:
        src, dst = os.path.join(a.recover_from, e), os.path.join(a.log_dir, e)
        (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, dst)
        copied.append(dst)
    if copied:
        log(f"recovering from {a.recover_from}: copied {len(copied)} entries into {a.log_dir}")


def build_trainer(a, cfg, run, data: TokenData):
    """The model (seeded by --init-seed, or the recovered checkpoint), the training batches (seeded
    by --data-seed) and the validation: (the Trainer of the run, the model, the validation)."""
    seed_everything(a.init_seed)  # the original: set_seeds(init_seed), then the model
    model, ckpt = init_model(cfg, run)
    for tf in (data.train, data.valid):
        tf.check_ids(model.params.vocab_size)
    check_special_ids(a.bos_id, a.eos_id, model.params.vocab_size, "--bos-id / --eos-id")
    seed_everything(a.data_seed + run.dist.rank)  # then set_seeds(data_seed): data order, dropout
    batches = ChunkBatches(data.train, a.block_size, a.batch_size, a.bos_id, a.eos_id, seed=a.data_seed,
                           rank=run.dist.rank, world_size=run.dist.world_size, device=run.device)
    validation = Validation(data.valid, a.block_size, a.batch_size, a.bos_id, a.eos_id, a.validation_steps, run.device)
    trainer = Trainer(TrainerOptions.from_config(cfg), run, model, batches, validation, training_state(cfg, ckpt),
                      config=cfg, best_metric="val_loss")
    return trainer, model, validation


def run_train(a, schema, log=print):
    """The `train` subcommand for parsed flags `a` (evaluation/eval_wikitext.py); `schema` is
    train.py's, which checks the run's config (ckpt.pt and config.json record a train.py config)."""
    # ---- every check first: nothing is written before the run folder is opened and checked
    data = check_train_inputs(a)
    n_params = non_embedding_params(train_config(a, data.vocab, 1.0, schema))
    lr = learning_rate(a, n_params, log)
    cfg = train_config(a, data.vocab, lr, schema)

    run = Run.from_config(cfg)
    rd = RunDir(a.log_dir, what="LOG_DIR", enabled=run.master).open()
    copied = []
    try:
        if run.master:
            check_log_dir(a)  # again, now that the folder is ours (locked)
            copy_recovered_run(a, copied, log)
        trainer, model, validation = build_trainer(a, cfg, run, data)
        start_run(rd, cfg, trainer)  # the first write of a new run: everything above may still refuse it
        rd.write_json(RUN_INFO, run_info(a, data, n_params, lr))
    except BaseException:
        if not rd.committed:
            for p in copied:
                shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
        rd.close()
        raise
    with rd:
        if run.master:
            log(f"Total non-embedding parameters: {n_params:,}; learning rate {lr:.6g}"
                f"{' (--lr)' if a.lr is not None else ' (0.003239 - 0.0001395 ln N)'}; vocabulary "
                f"{model.params.vocab_size}")
            log(f"training data {a.train_dataset_path}: {data.n_train:,} blocks of {a.block_size}; validation "
                f"{a.validation_dataset_path}: {data.n_valid:,} blocks, the first {len(validation.batches)} batches")
        fit_and_close(trainer, run)
