"""T0-style multitask prompted finetuning of a pretrained model (spec ../shared/spec/t0-finetuning.md).

    python finetune_t0.py configs/t0_small.py --model_dir=out/base --mixture=data/t0/mixture.json \\
        [--prefixlm=True] [--optimizer=adafactor --adafactor_preset=t0] [--loss_normalization=example]
    torchrun --nproc_per_node=N finetune_t0.py ...
    python finetune_t0.py --make_demo_data=data/t0_demo      # the built-in multitask set (t0_demo.py)
    python finetune_t0.py --help                              # every config key

Examples of the mixture's training sources are drawn in proportion to their weights, packed
greedily into rows of max_seq_len + 1 tokens, attend only within their own example (causal, or
prefix-LM over the inputs), restart their positions at 0, and are trained on their targets only
(t0_data.py). Validation groups are evaluated on their own fixed rows (loss/valid/<name>) and, when
they have answer_choices, by rank classification (rank_acc/<name>, evaluation/eval_rank.py).
The loop, checkpoints, exact resume (--init_from=resume_train), DDP and logging are trainer.py's.
"""
import hashlib
import json
import os
import re

import numpy as np

from adafactor import ADAFACTOR_CONFIG_DEFAULTS, apply_optimizer_preset
from configurator import parse_config
from optim import OPTIMIZER_DEFAULTS
from errors import UserError, cli_main
from metrics import WANDB_CONFIG_DEFAULTS
from t0_data import (MIXINGS, NORMALIZATIONS, TOKENIZATION_DEFAULTS, ExampleEncoder, PackedStream, T0Batches,
                     check_hash_overlap, check_range_overlap, example_hash, is_held_out, load_mixture, model_inputs,
                     pack_once, read_records, resolve_weights, rows_to_arrays, tokenize_rows, usable)
from trainer import (Run, Trainer, checkpoint_path, fit_and_close, init_model, seed_everything, training_state,
                     write_run_config)

DEFAULTS = dict(
    # I/O
    out_dir="out/t0",
    model_dir="",  # the pretrained model: model_dir/ckpt.pt
    init_from="resume_model",  # resume_model: finetune model_dir | resume_train: continue out_dir
    eval_interval=200,
    checkpoint_interval=0,  # 0: checkpoint at every eval_interval
    log_interval=10,
    eval_iters=4,  # validation loss on the first eval_iters * batch_size packed rows of each group
    eval_only=False,
    save_best_model=False,  # also keep out_dir/ckpt_best.pt, the best mean validation loss
    seed=1337,
    **WANDB_CONFIG_DEFAULTS,  # wandb_log, wandb_project, wandb_run_name, wandb_entity, wandb_tags, wandb_mode
    # data
    mixture="",  # mixture.json: {"train": [sources], "valid": [sources]} (docs/t0.md)
    make_demo_data="",  # write the built-in multitask set to this folder and exit
    mixing="example",  # example: mix examples by weight, then pack | row: Megatron's blend of packed rows
    tokenizer_model="",  # "" = the tokenizer named by the base checkpoint's config
    **TOKENIZATION_DEFAULTS,  # add_bos, target_space, add_eos, max_input_len, max_target_len, truncation
    pad_id=0,  # id written into padding (masked everywhere, so any id works)
    batch_size=16,  # packed rows per micro-batch
    max_seq_len=0,  # row length L (rows hold L + 1 tokens); 0 = the base model's max_seq_len
    # masks and loss
    prefixlm=False,  # True: input tokens of an example attend to each other both ways
    loss_normalization="token",  # token | example (BLOOMZ --norm-target-loss) | token_microbatch (Megatron)
    # rank-classification evaluation of validation groups with answer_choices
    rank_eval_examples=200,  # per group, a fixed seeded subset; 0 disables
    rank_eval_batch_size=0,  # 0 = batch_size
    # forgetting: the ordinary LM loss on the test shard of a pretokenized pretraining dataset
    pretrain_text="",  # e.g. data/tok8192/pretrain-all: logged as loss/valid/pretrain_text, not in loss/valid
    score_eos=False,  # also score each choice's EOS
    # model (the shape comes from the checkpoint)
    dropout=0.0,  # T0 and BLOOMZ used 0.1
    # optimizer and schedule: constant LR, no warmup, as T0 and BLOOMZ (presets: adafactor_preset)
    gradient_accumulation_steps=1,  # global: split across DDP processes
    learning_rate=1e-4,
    lr_scheduling=False,
    max_iters=1000,
    weight_decay=0.0,
    warmup_iters=0,
    **OPTIMIZER_DEFAULTS,  # optimizer (adamw | adafactor), betas, eps, clipping, min_lr (optim.py)
    **ADAFACTOR_CONFIG_DEFAULTS,  # adafactor_preset: t0 | hf_t5 | bloomz_adam, and adafactor_* settings
    # system
    device="",  # "" = auto: cuda, mps, cpu
    dtype="",  # "" = auto: bfloat16 on CUDA, float32 otherwise; float64 allowed
    compile=False,
    peak_flops=0.0,
)
# finetuning settings that go with an optimizer preset (spec §8), unless set by the user
PRESET_EXTRAS = {"bloomz_adam": {"loss_normalization": "example", "prefixlm": False}}


def apply_presets(cfg):
    out = apply_optimizer_preset(cfg, DEFAULTS)
    for key, value in PRESET_EXTRAS.get(cfg["adafactor_preset"], {}).items():
        if cfg[key] == DEFAULTS[key]:
            out[key] = value
    return out


def check_config(cfg):
    if cfg["loss_normalization"] not in NORMALIZATIONS:
        raise UserError(f"loss_normalization must be one of {', '.join(NORMALIZATIONS)}, not '{cfg['loss_normalization']}'")
    if cfg["mixing"] not in MIXINGS:
        raise UserError(f"mixing must be one of {', '.join(MIXINGS)}, not '{cfg['mixing']}'")
    if cfg["init_from"] not in ("resume_model", "resume_train"):
        raise UserError(f"init_from must be resume_model (finetune --model_dir) or resume_train (continue --out_dir), "
                        f"not '{cfg['init_from']}'")
    if cfg["batch_size"] < 1 or cfg["max_seq_len"] < 0 or cfg["eval_iters"] < 0:
        raise UserError("batch_size must be >= 1, max_seq_len and eval_iters >= 0")


def base_checkpoint(cfg):
    """The checkpoint init_model will load, read first for its context length and tokenizer."""
    if cfg["init_from"] == "resume_model" and not cfg.get("model_dir"):
        raise UserError("no base model: pass --model_dir=DIR (a folder holding the pretrained ckpt.pt)")
    from checkpoint import load_checkpoint
    return load_checkpoint(checkpoint_path(cfg), map_location="cpu")


def resolve_tokenizer(cfg, ckpt):
    from sample import tokenizer_for_checkpoint
    tok = tokenizer_for_checkpoint(ckpt, cfg["tokenizer_model"] or None)
    if tok.vocab_size != ckpt["model_args"]["vocab_size"]:
        raise UserError(f"tokenizer {tok.model_path} has {tok.vocab_size} pieces but the model's vocabulary is "
                        f"{ckpt['model_args']['vocab_size']}")
    return tok


# ---------------------------------------------------------------------- data

class T0Data:
    """Everything read from the mixture: tokenised training examples, validation groups (rows
    for the loss, examples for rank classification) and the per-source report."""

    def __init__(self, train_src, valid_src, encoder, row_len, log=print):
        check_range_overlap(train_src, valid_src)
        self.train_sources, self.report = train_src, {"train": {}, "valid": {}}
        self.train, hashes, sizes = [], set(), []
        for src in train_src:
            rows = read_records(src)
            ok, _ = usable(rows)
            hashes.update(example_hash(r["inputs"], r["targets"]) for r in ok)
            sizes.append(len(ok))
            self.train.append(self._tokenize(src, rows, encoder, row_len, "train"))
        self.weights = resolve_weights(train_src, sizes)
        self.valid = []
        for src in valid_src:
            rows = read_records(src)
            check_hash_overlap(hashes, src.name, usable(rows)[0])
            examples = self._tokenize(src, rows, encoder, row_len, "valid")
            self.valid.append({"source": src, "rows": rows, "examples": examples,
                               "held_out": is_held_out(src, train_src)})
        for kind, sources in self.report.items():
            for name, st in sources.items():
                log(f"data {kind}/{name}: " + ", ".join(f"{k} {v}" for k, v in st.items()))

    def _tokenize(self, src, rows, encoder, row_len, kind):
        ex = tokenize_rows(src.name, rows, encoder, row_len)
        if len(ex) == 0 and not ex.shortest:
            raise UserError(f"source {src.describe()} has no usable example (all inputs or targets empty, or all "
                            f"over max_input_len / max_target_len with truncation=drop)")
        if len(ex) == 0:
            raise UserError(f"max_seq_len={row_len - 1} is shorter than the shortest example of source {src.describe()} "
                            f"({ex.shortest} tokens; rows hold max_seq_len + 1); raise max_seq_len (up to the base "
                            f"model's) or lower max_input_len / max_target_len")
        self.report[kind][src.name] = ex.stats
        return ex

    def stream(self, cfg):
        """The training rows: a seeded PackedStream over the training sources."""
        return PackedStream([e.lengths() for e in self.train], self.weights,
                            cfg["max_seq_len"] + 1, cfg["seed"], cfg["mixing"])

    def identity(self, cfg):
        """What the training row stream depends on (a resumed run must see the same one)."""
        keys = ["seed", "mixing", "max_seq_len", "pad_id", *TOKENIZATION_DEFAULTS]
        desc = {"cfg": {k: cfg[k] for k in keys},
                "sources": [(s.name, w, len(e), e.stats["tokens"]) for s, w, e in zip(self.train_sources, self.weights, self.train)]}
        return hashlib.sha1(json.dumps(desc, sort_keys=True).encode()).hexdigest()


def check_pretrain_text(folder, tok, vocab_size):
    """The pretraining-text group's dataset folder <data_cache_dir>/tok<V>/<name> (or
    <data_cache_dir>/llama2/<name>), checked like train.py checks its datasets: complete, and made
    with this model's vocabulary and tokenizer."""
    from pretok_data import check_dataset
    folder = os.path.normpath(folder)
    layout, name = os.path.split(folder)
    cache, layout_name = os.path.split(layout)
    match = re.fullmatch(r"tok(\d+)", layout_name)
    if layout_name != "llama2" and not match:
        raise UserError(f"pretrain_text={folder} is not a pretokenized dataset folder "
                        f"(<data_cache_dir>/tok<vocab>/<name>, made by python tinystories.py pretokenize)")
    manifest = check_dataset(cache, int(match.group(1)) if match else 0, name, tok.model_path)
    if manifest["vocab_size"] != vocab_size:
        raise UserError(f"pretrain_text={folder} has vocab {manifest['vocab_size']}, the model {vocab_size}")
    return folder


class T0Evaluator:
    """loss/valid/<name> on each group's fixed rows (one seeded packing, first eval_iters *
    batch_size rows), their mean loss/valid, rank_acc/<name> with medians, and the training
    rows' fill rate so far."""

    def __init__(self, cfg, run, data: T0Data, encoder, stream):
        from evaluation.eval_rank import rank_examples
        self.cfg, self.run, self.stream = cfg, run, stream
        row_len, n_rows = cfg["max_seq_len"] + 1, cfg["eval_iters"] * cfg["batch_size"]
        self.groups = []
        for g in data.valid:
            ex = g["examples"]
            rows = pack_once(ex.lengths(), row_len, cfg["seed"])[:n_rows]
            arrays = rows_to_arrays(rows, [ex], row_len, cfg["pad_id"])
            rank = []
            if cfg["rank_eval_examples"] > 0:
                rank, _ = rank_examples(g["rows"], encoder, cfg["score_eos"], cfg["rank_eval_examples"], cfg["seed"])
            self.groups.append({"name": g["source"].name, "dataset": g["source"].dataset, "arrays": arrays,
                                "rank": rank, "held_out": g["held_out"]})
        self.pretrain_text = cfg["pretrain_text"]

    def pretrain_text_loss(self, model):
        """Mean LM loss over eval_iters batches of the pretraining text's test shard; a fresh
        loader with the same seed reads the same windows at every evaluation."""
        from pretok_data import BatchLoader
        cfg = self.cfg
        batches = BatchLoader(self.pretrain_text, "test", cfg["batch_size"], cfg["max_seq_len"], seed=cfg["seed"],
                              device=self.run.device)
        losses = []
        for _ in range(cfg["eval_iters"]):
            x, y = next(batches)
            model(x, y, return_logits=False)
            losses.append(model.last_loss.item())
        return float(np.mean(losses))

    def __call__(self, model, iter_num, generations):
        from evaluation.eval_rank import rank_accuracy, summarize
        cfg, metrics, accs = self.cfg, {}, {}
        bs = cfg["batch_size"]
        for g in self.groups:
            total = count = 0.0
            for start in range(0, len(g["arrays"][0]), bs):
                batch, label_mask, _ = model_inputs(*(a[start:start + bs] for a in g["arrays"]), cfg["prefixlm"], self.run.device)
                model(**batch, loss_weights=label_mask.to(self.run.device), return_logits=False)
                total += model.last_loss.item()
                count += label_mask.sum().item()
            if count:
                metrics[f"loss/valid/{g['name']}"] = total / count
            if g["rank"]:
                r = rank_accuracy(model, g["rank"], cfg["rank_eval_batch_size"] or bs, cfg["prefixlm"])
                metrics[f"rank_acc/{g['name']}"] = accs[g["name"]] = r["acc"]
                metrics[f"rank_acc_norm/{g['name']}"] = r["acc_norm"]
        losses = [v for k, v in metrics.items() if k.startswith("loss/valid/")]
        if losses:
            metrics["loss/valid"] = float(np.mean(losses))
        if self.pretrain_text and self.cfg["eval_iters"] > 0:  # after the mean: it tracks forgetting, not the finetuning tasks
            metrics["loss/valid/pretrain_text"] = self.pretrain_text_loss(model)
        held = {g["name"] for g in self.groups if g["held_out"]}
        metrics.update(summarize(accs, held, {g["name"]: g["dataset"] for g in self.groups}))
        if self.stream.rows:
            metrics["fill_rate/train"] = self.stream.fill_rate()
        return metrics


def main(argv=None):
    cfg = parse_config(DEFAULTS, argv, prog="finetune_t0.py")
    if cfg["make_demo_data"]:
        from t0_demo import write_demo_data
        mixture = write_demo_data(cfg["make_demo_data"], seed=0)
        print(f"wrote {len(mixture['train'])} training and {len(mixture['valid'])} validation sources to "
              f"{cfg['make_demo_data']}/mixture.json")
        return
    cfg = apply_presets(cfg)
    check_config(cfg)
    train_src, valid_src = load_mixture(cfg["mixture"])  # mistakes first, before anything is loaded
    base = base_checkpoint(cfg)
    base_len = base["model_args"]["max_seq_len"]
    if cfg["max_seq_len"] > base_len:
        raise UserError(f"max_seq_len={cfg['max_seq_len']} exceeds the base model's {base_len}")
    cfg["max_seq_len"] = cfg["max_seq_len"] or base_len
    tok = resolve_tokenizer(cfg, base)
    cfg["tokenizer_model"] = os.path.abspath(tok.model_path)  # so resume and eval_rank find it
    if cfg["pretrain_text"]:
        cfg["pretrain_text"] = check_pretrain_text(cfg["pretrain_text"], tok, base["model_args"]["vocab_size"])
    run = Run(cfg)
    encoder = ExampleEncoder(tok, **{k: cfg[k] for k in TOKENIZATION_DEFAULTS})
    data = T0Data(train_src, valid_src, encoder, cfg["max_seq_len"] + 1, log=print if run.master else (lambda *a: None))
    seed_everything(cfg["seed"])  # identical initial weights on every rank
    model, ckpt = init_model(cfg, run, ckpt=base)
    seed_everything(cfg["seed"] + run.dist.rank)  # training randomness (dropout) differs per rank
    world = run.dist.world_size
    stream = data.stream(cfg)
    batches = T0Batches(stream, data.train, cfg["batch_size"], cfg["gradient_accumulation_steps"] // world,
                        run.dist.rank, world, cfg["loss_normalization"], cfg["prefixlm"], run.device,
                        run.param_dtype, cfg["pad_id"], identity=data.identity(cfg))
    evaluator = T0Evaluator(cfg, run, data, encoder, stream)
    fill = data.stream(cfg)
    fill.next_rows(256)
    write_run_config(cfg, run)
    if run.master:
        report = {"sources": data.report, "fill_rate_first_256_rows": fill.fill_rate(), "mixing": cfg["mixing"],
                  "held_out": [g["source"].name for g in data.valid if g["held_out"]]}
        with open(os.path.join(cfg["out_dir"], "data_report.json"), "w") as f:
            json.dump(report, f, indent=1)
        print(f"model: {model.num_params() / 1e6:.2f}M parameters; rows of {cfg['max_seq_len'] + 1} tokens, "
              f"fill rate {fill.fill_rate():.3f} (first 256 rows, mixing={cfg['mixing']})")
    trainer = Trainer(cfg, run, model, batches, evaluator, training_state(cfg, ckpt), best_metric="loss/valid")
    if run.master:
        trainer.logger.log({"iter": trainer.iter_num, "data": report}, kind="data")
    fit_and_close(trainer, run)


if __name__ == "__main__":
    cli_main(main)
