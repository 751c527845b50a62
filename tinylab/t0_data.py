"""T0-style multitask data (docs/t0.md §1-6): a mixture file of prompted
datasets -> tokenised (input, target) examples -> rows packed greedily from the weighted mixture
-> model batches with block-diagonal (causal or prefix-LM) attention masks, per-example position
ids and target-only loss weights.

    train, valid = load_mixture("data/t0/mixture.json")           # Source lists
    enc = ExampleEncoder(tokenizer, add_bos=True, target_space=True, add_eos=True, ...)
    examples = [tokenize_rows(s.name, read_records(s), enc, row_len=L + 1) for s in train]
    stream = PackedStream([e.lengths() for e in examples], weights, row_len=L + 1, seed=1)
    rows = stream.next_rows(64)                                   # lists of (source, example)
    arrays = rows_to_arrays(rows, examples, L + 1)                 # token_ids, segment_ids, is_input
    batch, label_mask, label_seg = model_inputs(*arrays, prefixlm, device)
    T0Batches(stream, examples, ...)                               # the Trainer's batch source

Conventions (each a config key of finetune_t0.py, declared in schema.py):
  - input ids = [BOS] + encode(inputs); no EOS or separator after the inputs;
  - target ids = encode(target) + [EOS]; with target_space=True the target's leading whitespace is
    replaced by exactly one space (through the tokenizer's dummy prefix, or an explicit " " for a
    tokenizer without one); target_space=False appends the target text exactly as given;
  - too long: inputs keep their last max_input_len tokens (BOS stays first), targets their first
    max_target_len (EOS stays last); truncation="drop" drops such examples instead. Examples
    longer than the row are always dropped. Every case is counted per source.
"""
import hashlib
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from tinylab import hub
from tinylab.errors import UserError, first_line
from tinylab.fileio import read_text

# the config keys (schema.py) that ExampleEncoder takes, by name
TOKENIZATION_KEYS = ("add_bos", "target_space", "add_eos", "max_input_len", "max_target_len", "truncation")
NORMALIZATIONS = ("token", "example", "token_microbatch")
MIXINGS = ("example", "row")
TRUNCATIONS = ("truncate", "drop")
SOURCE_KEYS = {"name", "path", "hf", "config", "split", "weight", "range", "dataset"}
FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


# ---------------------------------------------------------------------- mixture file

@dataclass
class Source:
    name: str
    path: str = ""  # a local json / jsonl / parquet file
    hf: str = ""  # or a hub dataset (with config and split)
    config: str = ""
    split: str = "train"
    weight: object = 1.0  # a number > 0, or "examples": T0's examples-proportional weight (capped)
    cap: int = 500_000  # "examples" weighting: MAX_EXAMPLES_PER_DATASET
    start: float = 0.0  # the rows [start * n, end * n) of the file
    end: float = 1.0
    dataset: str = ""  # the dataset this prompt belongs to (per-dataset medians); default: name

    def describe(self):
        where = self.path or f"{self.hf}" + (f"/{self.config}" if self.config else "") + f" [{self.split}]"
        rng = "" if (self.start, self.end) == (0.0, 1.0) else f" rows {self.start:g}:{self.end:g}"
        return f"'{self.name}' ({where}{rng})"


def _parse_range(text, where):
    try:
        a, b = (float(x) for x in str(text).split(":"))
    except ValueError:
        raise UserError(f"{where}: field 'range' must be 'START:END' fractions such as '0:0.95', got {text!r}")
    if not 0.0 <= a < b <= 1.0:
        raise UserError(f"{where}: field 'range' {text!r} needs 0 <= START < END <= 1")
    return a, b


def _resolve(path, base_dir):
    """Relative paths are looked up next to the mixture file first, then from the working dir."""
    if os.path.isabs(path):
        return path
    beside = os.path.join(base_dir, path)
    return beside if os.path.exists(beside) else path


def parse_source(entry, where, base_dir, need_weight):
    if not isinstance(entry, dict):
        raise UserError(f"{where}: each source must be an object with 'name' and 'path' or 'hf', got {entry!r}")
    unknown = sorted(set(entry) - SOURCE_KEYS)
    if unknown:
        raise UserError(f"{where}: unknown field '{unknown[0]}' (fields: {', '.join(sorted(SOURCE_KEYS))})")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise UserError(f"{where}: field 'name' must be a non-empty string without '/', got {name!r}")
    where = f"{where} ('{name}')"
    path, hf = entry.get("path", ""), entry.get("hf", "")
    if bool(path) == bool(hf) or not isinstance(path or hf, str):
        raise UserError(f"{where}: give exactly one of the fields 'path' (local file) or 'hf' (hub dataset)")
    weight = entry.get("weight", 1.0)
    if need_weight and weight != "examples" and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                                                 or not math.isfinite(weight) or weight <= 0):
        raise UserError(f"{where}: field 'weight' must be a number > 0 or \"examples\", got {weight!r}")
    start, end = _parse_range(entry["range"], where) if "range" in entry else (0.0, 1.0)
    for key in ("config", "split", "dataset"):
        if key in entry and not isinstance(entry[key], str):
            raise UserError(f"{where}: field '{key}' must be a string, got {entry[key]!r}")
    return Source(name=name, path=_resolve(path, base_dir) if path else "", hf=hf, config=entry.get("config", ""),
                  split=entry.get("split", "train"), weight=weight if weight == "examples" else float(weight), start=start, end=end,
                  dataset=entry.get("dataset") or name)


def parse_megatron_line(text, where):
    """Megatron's one-line form "NAME: W1 START:END PATH1, W2 START:END PATH2" as source dicts."""
    _, _, body = text.partition(":") if ":" in text.split(" ")[0] else ("", "", text)
    entries = []
    for k, part in enumerate(p for p in body.split(",") if p.strip()):
        bits = part.split()
        if len(bits) != 3:
            raise UserError(f"{where}: item {k + 1} of the one-line form must be 'WEIGHT START:END PATH', got {part.strip()!r}")
        try:
            weight = float(bits[0])
        except ValueError:
            raise UserError(f"{where}: item {k + 1}: weight {bits[0]!r} is not a number")
        name = os.path.splitext(os.path.basename(bits[2]))[0]
        if any(e["name"] == name for e in entries):
            name = f"{name}_{k + 1}"  # the same file twice (two ranges)
        entries.append({"name": name, "weight": weight, "range": bits[1], "path": bits[2]})
    return entries


def load_mixture(path):
    """(train sources, validation sources) of a mixture file; every mistake is one UserError line
    naming the file and the field."""
    if not path:
        raise UserError("no mixture given: pass --mixture=PATH/mixture.json (python finetune_t0.py "
                        "--make_demo_data=DIR writes a built-in one)")
    text = read_text(path, "mixture file")
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"mixture file {path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
    if not isinstance(spec, dict) or "train" not in spec:
        raise UserError(f"mixture file {path}: needs a top-level object with field 'train' (and 'valid')")
    unknown = sorted(set(spec) - {"train", "valid", "max_examples_per_dataset"})
    if unknown:
        raise UserError(f"mixture file {path}: unknown top-level field '{unknown[0]}' (fields: train, valid, "
                        f"max_examples_per_dataset)")
    cap = spec.get("max_examples_per_dataset", 500_000)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise UserError(f"mixture file {path}: field 'max_examples_per_dataset' must be an integer >= 1, got {cap!r}")
    base = os.path.dirname(os.path.abspath(path))
    train_spec = spec["train"]
    if isinstance(train_spec, str):
        train_spec = parse_megatron_line(train_spec, f"{path}: train")
    if not isinstance(train_spec, list) or not train_spec:
        raise UserError(f"mixture file {path}: field 'train' must be a non-empty list of sources")
    valid_spec = spec.get("valid", [])
    if not isinstance(valid_spec, list):
        raise UserError(f"mixture file {path}: field 'valid' must be a list of sources")
    train = [parse_source(e, f"{path}: train[{i}]", base, True) for i, e in enumerate(train_spec)]
    for src in train:
        src.cap = cap
    valid = [parse_source(e, f"{path}: valid[{i}]", base, False) for i, e in enumerate(valid_spec)]
    for kind, group in (("train", train), ("valid", valid)):
        names = [s.name for s in group]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise UserError(f"mixture file {path}: {kind} name '{dup}' is used twice (names must be unique)")
    return train, valid


def resolve_weights(train, sizes):
    """Numeric weights: given ones as they are; "examples" (T0, docs/t0.md §3): the source's number of
    examples, but a dataset with more than `cap` examples gives each of its k prompts cap // k."""
    prompts = {}
    for src in train:
        if src.weight == "examples":
            prompts[src.dataset] = prompts.get(src.dataset, 0) + 1
    return [float(src.weight) if src.weight != "examples" else
            float(n if n <= src.cap else src.cap // prompts[src.dataset]) for src, n in zip(train, sizes)]


def is_held_out(src, train):
    """A validation group is held out when no training source has its dataset (or name)."""
    seen = {s.dataset for s in train} | {s.name for s in train}
    return src.dataset not in seen and src.name not in seen


def check_range_overlap(train, valid):
    """The same file with overlapping row ranges in train and valid (Megatron's 0.95:1 trap)."""
    for v in valid:
        for t in train:
            same = (v.path and t.path and os.path.abspath(v.path) == os.path.abspath(t.path)) or \
                   (v.hf and (v.hf, v.config, v.split) == (t.hf, t.config, t.split))
            if same and v.start < t.end and t.start < v.end:
                raise UserError(f"validation {v.describe()} overlaps training {t.describe()}: the same file with "
                                f"overlapping row ranges; give disjoint 'range' fractions")


# ---------------------------------------------------------------------- reading records

def read_records(src):
    """The rows of a source as dicts with 'inputs' and 'targets' strings (P3's *_pretokenized
    fields accepted) and, when present, 'answer_choices'; plus the number of rows of the file."""
    import datasets
    datasets.disable_progress_bars()
    if src.hf:
        ds = hub.load_dataset(src.hf, src.config, src.split, what=f"hub source {src.describe()}",
                              fix="use a local file ('path')")
    else:
        ext = os.path.splitext(src.path)[1].lower()
        if ext not in FORMATS:
            raise UserError(f"source {src.describe()}: unsupported file type '{ext}' (json, jsonl or parquet)")
        if not os.path.isfile(src.path):
            raise UserError(f"source {src.describe()}: file {src.path} not found")
        try:
            ds = datasets.load_dataset(FORMATS[ext], data_files=src.path, split="train")
        except Exception as e:
            raise UserError(f"source {src.describe()}: cannot read {src.path} ({first_line(e)})")
    cols = set(ds.column_names)
    fields = next((f for f in (("inputs", "targets"), ("inputs_pretokenized", "targets_pretokenized"))
                   if set(f) <= cols and _is_text(ds, f[0])), None)
    if fields is None:
        raise UserError(f"source {src.describe()} has no string fields 'inputs' and 'targets' (nor P3's "
                        f"'inputs_pretokenized' / 'targets_pretokenized'); its fields: {sorted(cols)}")
    n = len(ds)
    lo, hi = math.floor(src.start * n), math.floor(src.end * n)
    if (lo, hi) != (0, n):
        ds = ds.select(range(lo, hi))  # the rows really in the range (not 0..len, Megatron's bug)
    wanted = list(fields) + [c for c in ("answer_choices", "is_correct") if c in cols]
    data = ds.select_columns(wanted).to_dict()
    rows = []
    for i in range(len(data[fields[0]])):
        if "is_correct" in data and not data["is_correct"][i]:
            continue  # P3 *_score_eval: one row per choice; the correct one stands for the example
        row = {"inputs": data[fields[0]][i], "targets": data[fields[1]][i]}
        if "answer_choices" in data:
            row["answer_choices"] = data["answer_choices"][i]
        rows.append(row)
    return rows


def _is_text(ds, column):
    return getattr(ds.features.get(column), "dtype", None) in ("string", "large_string")


def example_hash(inputs, targets):
    return hashlib.sha1((inputs.strip() + "\x00" + targets.strip()).encode()).hexdigest()


def check_hash_overlap(train_hashes, valid_name, valid_rows):
    shared = [r for r in valid_rows if example_hash(r["inputs"], r["targets"]) in train_hashes]
    if shared:
        first = shared[0]["inputs"].strip().replace("\n", " ")[:60]
        raise UserError(f"validation group '{valid_name}' shares {len(shared)} of {len(valid_rows)} examples with "
                        f"the training data (same inputs + targets, e.g. {first!r}); validation must be held out")


# ---------------------------------------------------------------------- tokenisation

class ExampleEncoder:
    """Turns (inputs, targets) strings into (input ids, target ids) by the module's conventions."""

    def __init__(self, tokenizer, add_bos=True, target_space=True, add_eos=True, max_input_len=1024,
                 max_target_len=256, truncation="truncate"):
        if truncation not in ("truncate", "drop"):
            raise UserError(f"truncation must be 'truncate' or 'drop', not '{truncation}'")
        if max_input_len < 1 + add_bos or max_target_len < 1 + add_eos:
            raise UserError(f"max_input_len={max_input_len} / max_target_len={max_target_len} leave no room for text")
        self.tok, self.add_bos, self.target_space, self.add_eos = tokenizer, add_bos, target_space, add_eos
        self.max_input_len, self.max_target_len, self.truncation = max_input_len, max_target_len, truncation
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
        """The last max_input_len tokens (the end of a prompt holds the question), BOS kept first."""
        if len(inp) <= self.max_input_len:
            return inp
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


def tokenize_rows(name, rows, encoder: ExampleEncoder, row_len=None):
    """Examples of one source; examples longer than `row_len` (when given) are dropped."""
    stats = new_stats(len(rows))
    rows, stats["skipped_empty"] = usable(rows)
    inputs = encoder.encode_inputs([r["inputs"] for r in rows])
    targets = encoder.encode_targets([r["targets"] for r in rows])
    out = Examples(name, stats=stats)
    for inp, tgt in zip(inputs, targets):
        fitted = encoder.fit(inp, tgt, stats)
        if fitted is None:
            continue
        inp, tgt = fitted
        out.shortest = min(out.shortest or len(inp) + len(tgt), len(inp) + len(tgt))
        if row_len is not None and len(inp) + len(tgt) > row_len:
            stats["dropped_longer_than_row"] += 1
            continue
        out.ids.append(np.asarray(inp + tgt, dtype=np.int32))
        out.n_input.append(len(inp))
    stats["examples"] = len(out)
    stats["tokens"] = int(sum(len(x) for x in out.ids))
    return out


# ---------------------------------------------------------------------- packing

class _EpochOrder:
    """A source's example indices in a new seeded shuffle every epoch (seed + epoch)."""

    def __init__(self, n, seed, source_index):
        self.n, self.seed, self.source_index = n, seed, source_index
        self.epoch, self.index, self._perm = 0, 0, None

    def next(self):
        if self.index == self.n:
            self.epoch, self.index, self._perm = self.epoch + 1, 0, None
        if self._perm is None:
            self._perm = np.random.default_rng([self.seed, 11, self.source_index, self.epoch]).permutation(self.n)
        self.index += 1
        return int(self._perm[self.index - 1])

    def state(self):
        return [self.epoch, self.index]

    def load(self, st):
        self.epoch, self.index, self._perm = int(st[0]), int(st[1]), None


class _WeightedDraws:
    """Source index of the k-th mixed example: seeded blocks of uniform draws, so the position is
    a single counter (exact resume without pickling generator state)."""
    BLOCK = 4096

    def __init__(self, weights, seed):
        self.cum = np.cumsum(np.asarray(weights, dtype=np.float64) / np.sum(weights))
        self.cum[-1] = 1.0
        self.seed, self.k, self._block, self._draws = seed, 0, -1, None

    def next(self):
        b = self.k // self.BLOCK
        if b != self._block:
            u = np.random.default_rng([self.seed, 7, b]).random(self.BLOCK)
            self._block, self._draws = b, np.searchsorted(self.cum, u, side="right")
        self.k += 1
        return int(self._draws[(self.k - 1) % self.BLOCK])


class _NextFit:
    """Greedy next-fit packing of a stream of examples: append while the next one fits, else close
    the row; the example that did not fit opens the next row (and may cross into a new epoch)."""

    def __init__(self, next_example, length, row_len):
        self.next_example, self.length, self.row_len = next_example, length, row_len
        self.carry = None

    def next_row(self):
        items, used = [], 0
        while True:
            ex = self.carry if self.carry is not None else self.next_example()
            self.carry = None
            n = self.length(ex)
            if items and used + n > self.row_len:
                self.carry = ex
                return items
            items.append(ex)
            used += n


class PackedStream:
    """Rows of `row_len` tokens from several sources, each row a list of (source, example index).

    mixing="example" (default): examples are drawn from the sources in proportion to `weights`
    (seeded), each source in a new shuffled order every epoch, and packed in that order.
    mixing="row" (Megatron-DeepSpeed's blend): each source is packed on its own and row i comes
    from the source maximising w_s * max(i, 1) - rows_used_s, so every row is single-source and
    the row counts follow the weights exactly.
    Deterministic in (lengths, weights, row_len, seed, mixing); state_dict() is plain ints.
    """

    def __init__(self, lengths, weights, row_len, seed, mixing="example"):
        if mixing not in MIXINGS:
            raise UserError(f"mixing must be one of {', '.join(MIXINGS)}, not '{mixing}'")
        if any(len(l) == 0 for l in lengths):
            raise UserError("every training source needs at least one example that fits the row")
        w = np.asarray(weights, dtype=np.float64)
        self.weights = w / w.sum()
        self.lengths, self.row_len, self.mixing = [np.asarray(l) for l in lengths], row_len, mixing
        self.orders = [_EpochOrder(len(l), seed, i) for i, l in enumerate(lengths)]
        length = lambda ex: int(self.lengths[ex[0]][ex[1]])  # noqa: E731
        if mixing == "example":
            self.draws = _WeightedDraws(self.weights, seed)

            def next_example():
                s = self.draws.next()
                return s, self.orders[s].next()
            self.packers = [_NextFit(next_example, length, row_len)]
        else:
            self.packers = [_NextFit(lambda s=s: (s, self.orders[s].next()), length, row_len)
                            for s in range(len(lengths))]
            self.rows_used = np.zeros(len(lengths), dtype=np.int64)
        self.rows, self.tokens = 0, 0

    def next_row(self):
        if self.mixing == "example":
            row = self.packers[0].next_row()
        else:
            s = int(np.argmax(self.weights * max(self.rows, 1) - self.rows_used))
            self.rows_used[s] += 1
            row = self.packers[s].next_row()
        self.rows += 1
        self.tokens += sum(int(self.lengths[s][i]) for s, i in row)
        return row

    def next_rows(self, n):
        return [self.next_row() for _ in range(n)]

    def fill_rate(self):
        """Non-pad fraction of all rows produced so far."""
        return self.tokens / max(1, self.rows * self.row_len)

    def state_dict(self):
        st = {"orders": [o.state() for o in self.orders], "rows": self.rows, "tokens": self.tokens,
              "carry": [None if p.carry is None else list(p.carry) for p in self.packers]}
        if self.mixing == "example":
            st["draws"] = self.draws.k
        else:
            st["rows_used"] = self.rows_used.tolist()
        return st

    def load_state_dict(self, st):
        for o, s in zip(self.orders, st["orders"]):
            o.load(s)
        for p, c in zip(self.packers, st["carry"]):
            p.carry = None if c is None else (int(c[0]), int(c[1]))
        self.rows, self.tokens = int(st["rows"]), int(st["tokens"])
        if self.mixing == "example":
            self.draws.k = int(st["draws"])
        else:
            self.rows_used = np.asarray(st["rows_used"], dtype=np.int64)


def pack_once(lengths, row_len, seed):
    """One pass over one source's examples in a seeded order, next-fit packed (validation rows)."""
    rows, row, used = [], [], 0
    for i in np.random.default_rng([seed, 13]).permutation(len(lengths)).tolist():
        if row and used + lengths[i] > row_len:
            rows.append(row)
            row, used = [], 0
        row.append((0, i))
        used += int(lengths[i])
    return rows + ([row] if row else [])


def rows_to_arrays(rows, examples, row_len, pad_id=0):
    """token_ids, segment_ids (1..k per row, 0 = padding) and is_input, each (R, row_len)."""
    R = len(rows)
    token_ids = np.full((R, row_len), pad_id, dtype=np.int64)
    seg = np.zeros((R, row_len), dtype=np.int64)
    is_input = np.zeros((R, row_len), dtype=bool)
    for r, row in enumerate(rows):
        pos = 0
        for k, (s, i) in enumerate(row, start=1):
            ids, n_in = examples[s].ids[i], examples[s].n_input[i]
            token_ids[r, pos:pos + len(ids)] = ids
            seg[r, pos:pos + len(ids)] = k
            is_input[r, pos:pos + n_in] = True
            pos += len(ids)
    return token_ids, seg, is_input


# ---------------------------------------------------------------------- masks, positions, loss

def attention_mask(seg, is_input, prefixlm=False):
    """allowed[b, q, k] = same non-pad segment and (k <= q or, with prefixlm, both inputs);
    a padding query attends to itself only, so no softmax row is empty (NaN)."""
    T = seg.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=seg.device).tril()
    allowed = causal[None]
    if prefixlm:
        allowed = allowed | (is_input[:, :, None] & is_input[:, None, :])
    mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0) & allowed
    eye = torch.eye(T, dtype=torch.bool, device=seg.device)[None]
    return mask | (eye & (seg == 0)[:, :, None])


def position_ids(seg):
    """pos[t] = t - first index of t's segment (0 on padding): each packed example starts at 0."""
    T = seg.shape[-1]
    t = torch.arange(T, device=seg.device).expand_as(seg)
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    start_idx = torch.where(starts, t, torch.zeros_like(t)).cummax(dim=1).values
    return (t - start_idx) * (seg != 0)


def shift(token_ids, seg, is_input):
    """Model view of full rows (length L + 1): tokens, labels, the label mask (the label is a
    target token: input->first target and the EOS included, inputs and padding excluded), the
    label's segment, and the segment / is-input arrays aligned with the tokens."""
    tokens, labels = token_ids[:, :-1], token_ids[:, 1:]
    label_mask = ~is_input[:, 1:] & (seg[:, 1:] != 0)
    return tokens, labels, label_mask, seg[:, 1:], seg[:, :-1], is_input[:, :-1]


def loss_weights(label_mask, label_seg, normalization, n_groups=1):
    """Per-label weights for a whole global batch (rows in micro-batch order; n_groups =
    micro-batches x ranks), such that sum(weights * CE) is the loss:
      token             sum CE / N, N = target labels of the global batch
      example           mean over the batch's examples of each example's mean target CE
                        (counts by segment id, per row; BLOOMZ's --norm-target-loss)
      token_microbatch  each micro-batch's token mean, averaged over micro-batches (Megatron)
    """
    m = label_mask.to(torch.float64)
    if normalization == "token":
        return m / m.sum().clamp_min(1)
    if normalization == "example":
        n_seg = int(label_seg.max()) + 1 if label_seg.numel() else 1
        counts = torch.zeros(m.shape[0], n_seg, dtype=torch.float64).scatter_add_(1, label_seg.long(), m)
        counts[:, 0] = 0  # padding is no example
        n_examples = (counts > 0).sum().clamp_min(1)
        return m / counts.gather(1, label_seg.long()).clamp_min(1) / n_examples
    if normalization == "token_microbatch":
        g = m.view(n_groups, -1, m.shape[-1])
        return (g / g.sum((1, 2), keepdim=True).clamp_min(1) / n_groups).view_as(m)
    raise UserError(f"loss_normalization must be one of {', '.join(NORMALIZATIONS)}, not '{normalization}'")


def model_inputs(token_ids, seg, is_input, prefixlm, device):
    """forward() keyword arguments of packed rows (numpy or torch (R, L + 1)), on `device`, and
    the label mask / label segments (on the CPU) for loss weights."""
    token_ids, seg, is_input = (torch.as_tensor(a) for a in (token_ids, seg, is_input))
    tokens, labels, label_mask, label_seg, tok_seg, tok_inp = shift(token_ids, seg, is_input)
    tok_seg, tok_inp = tok_seg.to(device), tok_inp.to(device)
    batch = {"tokens": tokens.to(device), "targets": labels.to(device),
             "attn_mask": attention_mask(tok_seg, tok_inp, prefixlm), "position_ids": position_ids(tok_seg)}
    return batch, label_mask, label_seg


# ---------------------------------------------------------------------- training batches

class T0Batches:
    """The Trainer's batch source for packed multitask finetuning.

    Each iteration's global batch (micro_steps x world x batch_size rows) is packed at once by
    every rank from the same seeded stream, so the loss normaliser (target labels or examples of
    the whole global batch) is known in advance without communication; this rank then yields its
    micro-batches. Loss weights make sum(weights * CE) over the global batch the loss, and
    loss_scale = world undoes DDP's gradient averaging. state_dict() is the stream position at
    an iteration boundary (exact resume, also with another world size).
    """
    VERSION = 1

    def __init__(self, stream: PackedStream, examples, batch_size, micro_steps, rank, world,
                 normalization, prefixlm, device, param_dtype=torch.float32, pad_id=0, identity=""):
        self.stream, self.examples = stream, examples
        self.batch_size, self.micro_steps, self.rank, self.world = batch_size, micro_steps, rank, world
        self.normalization, self.prefixlm, self.device = normalization, prefixlm, device
        self.param_dtype, self.pad_id, self.identity = param_dtype, pad_id, identity
        self.queue = []

    def __iter__(self):
        return self

    def _fill(self):
        n_groups = self.micro_steps * self.world
        rows = self.stream.next_rows(n_groups * self.batch_size)
        arrays = [torch.as_tensor(a) for a in rows_to_arrays(rows, self.examples, self.stream.row_len, self.pad_id)]
        _, _, label_mask, label_seg, _, _ = shift(*arrays)
        weights = loss_weights(label_mask, label_seg, self.normalization, n_groups)
        B = self.batch_size
        for m in range(self.micro_steps):
            g = m * self.world + self.rank  # micro-batch m of every rank, then the next m
            part = slice(g * B, (g + 1) * B)
            batch, _, _ = model_inputs(*(a[part] for a in arrays), self.prefixlm, self.device)
            batch["loss_weights"] = weights[part].to(device=self.device, dtype=self.param_dtype)
            batch["loss_scale"] = float(self.world)
            self.queue.append(batch)

    def __next__(self):
        if not self.queue:
            self._fill()
        return self.queue.pop(0)

    def state_dict(self):
        return {"version": self.VERSION, "identity": self.identity, "stream": self.stream.state_dict()}

    def load_state_dict(self, state):
        if state.get("version") != self.VERSION or state.get("identity") != self.identity:
            raise UserError("the checkpoint's data position belongs to another mixture (sources, weights, "
                            "tokenisation, max_seq_len, mixing or seed changed); cannot resume it exactly")
        self.stream.load_state_dict(state["stream"])
        self.queue = []
