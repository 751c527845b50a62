"""Tokenisation of T0 examples (docs/t0.md §2): (inputs, targets) strings -> (input ids, target
ids) -> Examples within the length limits and the row, every case counted per source.

Conventions (each a config key of finetune_t0.py, declared in tinylab/t0/options.py):
  - input ids = [BOS] + encode(inputs); no EOS or separator after the inputs;
  - target ids = encode(target) + [EOS]; with target_space=True the target's leading whitespace is
    replaced by exactly one space (through the tokenizer's dummy prefix, or an explicit " " for a
    tokenizer without one); target_space=False appends the target text exactly as given;
  - too long: inputs keep their last max_input_len tokens (BOS stays first; truncate_side="right":
    their first max_input_len, as Mesh-TF / seqio cut T0's inputs), targets their first
    max_target_len (EOS stays last); truncation="drop" drops such examples instead. Examples
    longer than the row are dropped (or, with too_long_examples=close_row, skipped where packing
    meets them). Every case is counted per source.
"""
from dataclasses import dataclass, field

import numpy as np

from tinylab.core.errors import UserError

TRUNCATIONS = ("truncate", "drop")
TRUNCATE_SIDES = ("left", "right")  # which end of a too-long input is cut (right = Mesh-TF / seqio, T0)


class ExampleEncoder:
    """Turns (inputs, targets) strings into (input ids, target ids) by the module's conventions."""

    def __init__(self, tokenizer, add_bos=True, target_space=True, add_eos=True, max_input_len=1024,
                 max_target_len=256, truncation="truncate", truncate_side="left"):
        if truncation not in TRUNCATIONS:
            raise UserError(f"truncation must be 'truncate' or 'drop', not '{truncation}'")
        if truncate_side not in TRUNCATE_SIDES:
            raise UserError(f"truncate_side must be 'left' or 'right', not '{truncate_side}'")
        if max_input_len < 1 + add_bos or max_target_len < 1 + add_eos:
            raise UserError(f"max_input_len={max_input_len} / max_target_len={max_target_len} leave no room for text")
        self.tok, self.add_bos, self.target_space, self.add_eos = tokenizer, add_bos, target_space, add_eos
        self.max_input_len, self.max_target_len, self.truncation = max_input_len, max_target_len, truncation
        self.truncate_side = truncate_side
        # a sentencepiece dummy prefix puts the one space before the target's first piece for us;
        # without one a " " is prepended (Megatron's --prepend-space), or the bare "▁" piece
        # where the normalizer strips leading whitespace
        sp = tokenizer.sp
        self.dummy_prefix = sp.encode("a", out_type=str)[0].startswith("\u2581")
        self.space_id = None
        if not self.dummy_prefix and not sp.encode(" a", out_type=str)[0].startswith("\u2581"):
            self.space_id = sp.piece_to_id("\u2581")
            if self.space_id == sp.unk_id():
                raise UserError(f"tokenizer {tokenizer.model_path} has neither a dummy prefix nor a '\u2581' piece: "
                                f"it cannot put a space before targets; use target_space=False")
        self._glued = None

    def _glue_processor(self):
        """A copy of the tokenizer without the dummy prefix, for targets appended with no space."""
        if self._glued is None:
            if not self.dummy_prefix:
                self._glued = self.tok.sp
                return self._glued
            import sentencepiece as spm
            try:
                from sentencepiece import sentencepiece_model_pb2
            except ImportError:
                raise UserError("target_space=False with a dummy-prefix tokenizer needs the protobuf package (pip install protobuf)")
            proto = sentencepiece_model_pb2.ModelProto()
            proto.ParseFromString(self.tok.sp.serialized_model_proto())
            proto.normalizer_spec.add_dummy_prefix = False
            self._glued = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        return self._glued

    def encode_inputs(self, texts):
        return self.tok.encode_batch(texts, bos=self.add_bos, eos=False)

    def encode_targets(self, texts, eos=None):
        """Target ids (with EOS unless eos=False), before truncation. With target_space=False a
        target that starts with whitespace still gets exactly one space, one that does not is
        glued to the input."""
        eos = self.add_eos if eos is None else eos
        spaced = [i for i, t in enumerate(texts) if self.target_space or t[:1].isspace()]
        out = [None] * len(texts)
        texts_sp = [texts[i].lstrip() for i in spaced]
        if not self.dummy_prefix and self.space_id is None:
            texts_sp = [" " + t for t in texts_sp]
        for i, ids in zip(spaced, self.tok.encode_batch(texts_sp, bos=False, eos=eos)):
            out[i] = ([self.space_id] if self.space_id is not None else []) + ids
        glued = [i for i in range(len(texts)) if out[i] is None]
        if glued:
            for i, ids in zip(glued, self._glue_processor().encode([texts[i] for i in glued], add_eos=eos)):
                out[i] = ids
        return out

    def clip_input(self, inp):
        """At most max_input_len tokens. left (default): BOS + the last tokens (the end of a prompt
        holds the question); right: the first max_input_len tokens, BOS included (Mesh-TF's and
        seqio's v[:length], which cut T0's inputs; docs/t0.md §2)."""
        if len(inp) <= self.max_input_len:
            return inp
        if self.truncate_side == "right":
            return inp[:self.max_input_len]
        return inp[:self.add_bos] + inp[len(inp) - self.max_input_len + self.add_bos:]

    def fit(self, inp, tgt, stats):
        """Apply the length limits; None when the example is dropped."""
        over_in, over_tgt = len(inp) > self.max_input_len, len(tgt) > self.max_target_len
        if (over_in or over_tgt) and self.truncation == "drop":
            stats["dropped_too_long"] += 1
            return None
        if over_in:
            inp = self.clip_input(inp)
            stats["truncated_inputs"] += 1
        if over_tgt:
            keep = self.max_target_len - self.add_eos  # keep the start of the answer, then EOS
            tgt = tgt[:keep] + tgt[len(tgt) - self.add_eos:]
            stats["truncated_targets"] += 1
        return inp, tgt


@dataclass
class Examples:
    """Tokenised examples of one source: ids = input ids + target ids, n_input = len(input ids)."""
    name: str
    ids: list = field(default_factory=list)
    n_input: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    shortest: int = 0  # tokens of the shortest example within the length limits (for messages)

    def __len__(self):
        return len(self.ids)

    def lengths(self):
        return np.array([len(x) for x in self.ids], dtype=np.int64)


def new_stats(n_rows=0):
    return {"rows": n_rows, "skipped_empty": 0, "truncated_inputs": 0, "truncated_targets": 0,
            "dropped_too_long": 0, "dropped_longer_than_row": 0, "examples": 0, "tokens": 0}


def usable(rows):
    """Rows whose inputs and targets are non-empty strings after stripping; and the skip count."""
    ok = [r for r in rows if isinstance(r.get("inputs"), str) and isinstance(r.get("targets"), str)
          and r["inputs"].strip() and r["targets"].strip()]
    return ok, len(rows) - len(ok)


def encode_records(rows, encoder: ExampleEncoder):
    """(input ids, target ids) of text records, before the length limits (what --preprocess writes)."""
    inputs = encoder.encode_inputs([r["inputs"] for r in rows])
    targets = encoder.encode_targets([r["targets"] for r in rows])
    return list(zip(inputs, targets))


def tokenize_rows(name, rows, encoder: ExampleEncoder, row_len=None):
    """Examples of one source's text records; examples longer than `row_len` (when given) are dropped."""
    stats = new_stats(len(rows))
    rows, stats["skipped_empty"] = usable(rows)
    return fit_examples(name, encode_records(rows, encoder), encoder, row_len, stats)


def fit_examples(name, pairs, encoder: ExampleEncoder, row_len, stats, keep_too_long=False):
    """Examples from (input ids, target ids) lists: the encoder's length limits (fit), then the
    row limit; every kind of source alike. An example longer than the row is counted as
    dropped_longer_than_row and left out, or with keep_too_long kept in place (next-fit packing's
    too_long_examples=close_row skips it where it is met); "examples" / "tokens" count the
    examples that fit."""
    out = Examples(name, stats=stats)
    fits = tokens = 0
    for inp, tgt in pairs:
        fitted = encoder.fit(inp, tgt, stats)
        if fitted is None:
            continue
        inp, tgt = fitted
        out.shortest = min(out.shortest or len(inp) + len(tgt), len(inp) + len(tgt))
        if row_len is not None and len(inp) + len(tgt) > row_len:
            stats["dropped_longer_than_row"] += 1
            if not keep_too_long:
                continue
        else:
            fits, tokens = fits + 1, tokens + len(inp) + len(tgt)
        out.ids.append(np.asarray(inp + tgt, dtype=np.int32))
        out.n_input.append(len(inp))
    stats["examples"], stats["tokens"] = fits, int(tokens)
    return out
