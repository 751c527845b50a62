import hashlib
import json
import os
import re

import numpy as np

from tinylab.core.checkpoint import load_checkpoint
from tinylab.core.errors import UserError
from tinylab.core.run_keys import StartOptions
from tinylab.data.pretokenized import BatchLoader, check_dataset
from tinylab.data.tokenizer import tokenizer_for_checkpoint
from tinylab.t0.batches import model_inputs
from tinylab.t0.encode import fit_examples, new_stats
from tinylab.t0.mixture import Group, check_range_overlap, is_held_out, resolve_weights
from tinylab.t0.options import PackingOptions, TokenizationOptions
from tinylab.t0.overlap import check_overlap
from tinylab.t0.packing import pack_once, rows_to_arrays
from tinylab.t0.rank_eval import rank_accuracy, rank_examples, summarize
from tinylab.t0.valid_blend import BlendedRows, eval_position, microbatch_mean_loss


def base_checkpoint(cfg):
    """The checkpoint init_model will load, read first for its context length and tokenizer."""
    if cfg["init_from"] == "resume_model" and not cfg["model_dir"]:
        raise UserError("no base model: pass --model_dir=DIR (a folder holding the pretrained ckpt.pt)")
    return load_checkpoint(StartOptions.from_config(cfg).checkpoint_path(), map_location="cpu")


def resolve_tokenizer(cfg, ckpt):
    tok = tokenizer_for_checkpoint(ckpt, cfg["tokenizer_model"] or None)
    if tok.vocab_size != ckpt["model_args"]["vocab_size"]:
        raise UserError(f"tokenizer {tok.model_path} has {tok.vocab_size} pieces but the model's vocabulary is "
                        f"{ckpt['model_args']['vocab_size']}")
    return tok


# ---------------------------------------------------------------------- data

class T0Data:
    """Everything read from the mixture: tokenised training examples, validation and test groups
    (per source: examples for the loss rows, text rows for rank classification, the group's
    weights) and the per-source report. `valid` / `test` hold Groups (a Source is its own group)."""

    def __init__(self, train_src, valid_src, encoder, row_len, log=print, test=(), overlap_check=True,
                 too_long="drop"):
        valid = [g if isinstance(g, Group) else Group(g.name, [g], "valid") for g in valid_src]
        test = [g if isinstance(g, Group) else Group(g.name, [g], "test") for g in test]
        self.overlap_check = overlap_check  # False: Megatron's (no check; overlap.OVERLAP_CHECK)
        self.keep_too_long = too_long == "close_row"  # Megatron's: packing meets and skips them
        if overlap_check:
            check_range_overlap(train_src, [s for g in valid for s in g.sources], [s for g in test for s in g.sources])
        self.train_sources, self.report = train_src, {"train": {}, "valid": {}, **({"test": {}} if test else {})}
        self.train, hashes, sizes = [], set(), []
        for src in train_src:
            ex, _, n_usable, src_hashes = self._load(src, encoder, row_len, "train", src.name)
            hashes.update(src_hashes)
            sizes.append(n_usable)
            self.train.append(ex)
        self.weights = resolve_weights(train_src, sizes)
        self.valid = [self._group(g, encoder, row_len, hashes) for g in valid]
        self.test = [self._group(g, encoder, row_len, hashes) for g in test]
        for kind, sources in self.report.items():
            for name, st in sources.items():
                log(f"data {kind}/{name}: " + ", ".join(f"{k} {v}" for k, v in st.items()))

    def _group(self, g, encoder, row_len, train_hashes):
        """A validation / test group, each source checked against the training examples; report
        keys are the group's name (one source) or <group>:<source>."""
        members, sizes = [], []
        for src in g.sources:
            key = g.name if len(g.sources) == 1 else f"{g.name}:{src.name}"
            ex, rows, n_usable, _ = self._load(src, encoder, row_len, g.split, key, train_hashes)
            members.append({"source": src, "rows": rows, "examples": ex})
            sizes.append(n_usable)
        return {"name": g.name, "dataset": g.dataset, "members": members, "weights": resolve_weights(g.sources, sizes),
                "held_out": all(is_held_out(s, self.train_sources) for s in g.sources)}

    def _load(self, src, encoder, row_len, kind, key, train_hashes=None):
        """(Examples, text records ([] for a kind without them: no rank classification), usable
        examples, content hashes) of one source, whatever its kind; with train_hashes, an
        evaluation source sharing examples with the training data is refused."""
        data = src.reader.read(src, encoder)
        if train_hashes is not None and self.overlap_check:
            check_overlap(train_hashes, f"{kind} source {src.describe()}", data.hashes, data.show)
        stats = new_stats(data.n_rows)
        stats["skipped_empty"] = data.n_rows - len(data.pairs)
        ex = fit_examples(src.name, data.pairs, encoder, row_len, stats, self.keep_too_long)
        self._check_examples(src, ex, row_len)
        self.report[kind][key] = ex.stats
        return ex, data.records, len(data.pairs), {h for hs in data.hashes for h in hs if h is not None}

    def _check_examples(self, src, ex, row_len):
        if ex.stats["examples"] == 0 and not ex.shortest:
            raise UserError(f"source {src.describe()} has no usable example (all inputs or targets empty, or all "
                            f"over max_input_len / max_target_len with truncation=drop)")
        if ex.stats["examples"] == 0:
            raise UserError(f"max_seq_len={row_len - 1} is shorter than the shortest example of source {src.describe()} "
                            f"({ex.shortest} tokens; rows hold max_seq_len + 1); raise max_seq_len (up to the base "
                            f"model's) or lower max_input_len / max_target_len")

    def stream(self, cfg):
        """The training rows: a seeded PackedStream over the training sources."""
        return PackingOptions.from_config(cfg).stream([e.lengths() for e in self.train], self.weights)

    def identity(self, cfg):
        """What the training row stream depends on (a resumed run must see the same one)."""
        settings = {**PackingOptions.from_config(cfg).identity(), **TokenizationOptions.from_config(cfg).identity()}
        desc = {"cfg": settings,
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
    rows' fill rate so far; at the end of training (and with eval_only) the same for the test
    groups as loss/test/<name>, rank_acc/test/<name> and their mean loss/test. A group of several
    sources shares those rows and rank examples among them by weight (at least one each) and
    reports the weighted mean of its sources' values. With valid_groups=blended a group's loss is
    Megatron's instead (tinylab/t0/valid_blend.py): the mean of micro-batch losses over the next
    rows of one blended stream."""

    def __init__(self, cfg, run, data: T0Data, encoder, stream):
        self.cfg, self.run, self.stream = cfg, run, stream
        self.groups = [self._prepare(g, encoder) for g in data.valid]
        self.test_groups = [self._prepare(g, encoder) for g in data.test]
        self.pretrain_text = cfg["pretrain_text"]

    def _prepare(self, g, encoder):
        cfg, total = self.cfg, sum(g["weights"])
        row_len, n_rows = cfg["max_seq_len"] + 1, cfg["eval_iters"] * cfg["batch_size"]
        fixed_rows = 0 if cfg["valid_groups"] == "blended" else n_rows  # blended: BlendedRows below

        def share(n, w):
            return n if len(g["members"]) == 1 or n == 0 else max(1, round(n * w / total))
        members = []
        for m, w in zip(g["members"], g["weights"]):
            ex = m["examples"]
            rows = pack_once(ex.lengths(), row_len, cfg["seed"])[:share(fixed_rows, w)]
            arrays = rows_to_arrays(rows, [ex], row_len, cfg["pad_id"])
            rank = []
            if cfg["rank_eval_examples"] > 0 and m["rows"]:
                rank, _ = rank_examples(m["rows"], encoder, cfg["score_eos"], share(cfg["rank_eval_examples"], w), cfg["seed"])
            members.append({"weight": w, "arrays": arrays, "rank": rank})
        blended = None
        if cfg["valid_groups"] == "blended":
            blended = BlendedRows([m["examples"] for m in g["members"]], g["weights"], row_len, cfg["seed"], n_rows,
                                  cfg["too_long_examples"], cfg["pad_id"])
        return {"name": g["name"], "dataset": g["dataset"], "held_out": g["held_out"], "members": members,
                "blended": blended}

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

    def _rows_loss(self, model, arrays):
        """Token-mean target loss over fixed rows (None without target tokens)."""
        cfg, bs = self.cfg, self.cfg["batch_size"]
        total = count = 0.0
        for start in range(0, len(arrays[0]), bs):
            batch, label_mask, _ = model_inputs(*(a[start:start + bs] for a in arrays), cfg["prefixlm"], self.run.device)
            model(**batch, loss_weights=label_mask.to(self.run.device), return_logits=False)
            total += model.last_loss.item()
            count += label_mask.sum().item()
        return total / count if count else None

    def _blended_loss(self, model, g, k):
        cfg = self.cfg
        if cfg["eval_iters"] == 0:
            return []
        return [(1.0, microbatch_mean_loss(model, g["blended"].block(k), cfg["batch_size"], cfg["loss_normalization"],
                                           cfg["prefixlm"], self.run.device))]

    def _evaluate(self, model, groups, split, k=0):
        """loss/<split>/<name> and rank_acc[_norm]/<name> (valid) or rank_acc[_norm]/test/<name>;
        k: the block of a blended group's rows (valid_blend.eval_position)."""
        cfg, metrics, accs = self.cfg, {}, {}
        tag = "" if split == "valid" else f"{split}/"
        for g in groups:
            losses = self._blended_loss(model, g, k) if g["blended"] else []
            ranks = []
            for m in g["members"]:
                loss = None if g["blended"] else self._rows_loss(model, m["arrays"])
                if loss is not None:
                    losses.append((m["weight"], loss))
                if m["rank"]:
                    ranks.append((m["weight"], rank_accuracy(model, m["rank"], cfg["rank_eval_batch_size"] or cfg["batch_size"],
                                                             cfg["prefixlm"])))
            if losses:
                metrics[f"loss/{split}/{g['name']}"] = _weighted_mean(losses)
            if ranks:
                metrics[f"rank_acc/{tag}{g['name']}"] = accs[g["name"]] = _weighted_mean([(w, r["acc"]) for w, r in ranks])
                metrics[f"rank_acc_norm/{tag}{g['name']}"] = _weighted_mean([(w, r["acc_norm"]) for w, r in ranks])
        return metrics, accs

    def __call__(self, model, iter_num, generations):
        cfg = self.cfg
        metrics, accs = self._evaluate(model, self.groups, "valid", eval_position(iter_num, cfg["eval_interval"]))
        losses = [v for k, v in metrics.items() if k.startswith("loss/valid/")]
        if losses:
            metrics["loss/valid"] = float(np.mean(losses))
        if self.pretrain_text and self.cfg["eval_iters"] > 0:  # after the mean: it tracks forgetting, not the finetuning tasks
            metrics["loss/valid/pretrain_text"] = self.pretrain_text_loss(model)
        held = {g["name"] for g in self.groups if g["held_out"]}
        metrics.update(summarize(accs, held, {g["name"]: g["dataset"] for g in self.groups}))
        if self.test_groups and (iter_num >= cfg["max_iters"] or cfg["eval_only"]):  # once, at the end (Megatron's test)
            test, _ = self._evaluate(model, self.test_groups, "test")
            metrics.update(test)
            losses = [v for k, v in test.items() if k.startswith("loss/test/")]
            if losses:
                metrics["loss/test"] = float(np.mean(losses))
        if self.stream.rows:
            metrics["fill_rate/train"] = self.stream.fill_rate()
        return metrics


def _weighted_mean(pairs):
    """sum(w * v) / sum(w) over (weight, value) pairs; one pair's value exactly."""
    if len(pairs) == 1:
        return pairs[0][1]
    return float(sum(w * v for w, v in pairs) / sum(w for w, _ in pairs))
