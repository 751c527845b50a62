import hashlib
import json
import os
import re

import numpy as np

from tinylab.checkpoint import load_checkpoint
from tinylab.errors import UserError
from tinylab.pretokenized import BatchLoader, check_dataset
from tinylab.rank_eval import rank_accuracy, rank_examples, summarize
from tinylab.t0_data import (
    TOKENIZATION_KEYS,
    PackedStream,
    check_hash_overlap,
    check_range_overlap,
    example_hash,
    is_held_out,
    model_inputs,
    pack_once,
    read_records,
    resolve_weights,
    rows_to_arrays,
    tokenize_rows,
    usable,
)
from tinylab.tokenizer import tokenizer_for_checkpoint
from tinylab.trainer import checkpoint_path


def base_checkpoint(cfg):
    """The checkpoint init_model will load, read first for its context length and tokenizer."""
    if cfg["init_from"] == "resume_model" and not cfg["model_dir"]:
        raise UserError("no base model: pass --model_dir=DIR (a folder holding the pretrained ckpt.pt)")
    return load_checkpoint(checkpoint_path(cfg), map_location="cpu")


def resolve_tokenizer(cfg, ckpt):
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
        keys = ["seed", "mixing", "max_seq_len", "pad_id", *TOKENIZATION_KEYS]
        desc = {"cfg": {k: cfg[k] for k in keys},
                "sources": [(s.name, w, len(e), e.stats["tokens"]) for s, w, e in zip(self.train_sources, self.weights, self.train)]}
        return hashlib.sha1(json.dumps(desc, sort_keys=True).encode()).hexdigest()


def check_pretrain_text(folder, tok, vocab_size):
    """The pretraining-text group's dataset folder <data_cache_dir>/tok<V>/<name> (or
    <data_cache_dir>/llama2/<name>), checked like train.py checks its datasets: complete, and made
    with this model's vocabulary and tokenizer."""
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
