"""T0-style multitask data (docs/t0.md §1-6): a mixture file of prompted
datasets -> tokenised (input, target) examples -> rows packed from the weighted mixture (best-fit
decreasing over chunks of drawn examples, in a weight-balanced row order; or greedy next-fit)
-> model batches with segment ids (the model attends within each example, causal or prefix-LM;
tinylab.nn.attention.document_mask), per-example position ids and target-only loss weights.

    train, valid = load_mixture("data/t0/mixture.json")           # Source lists
    mixture = mixture_from_config(cfg)                            # or Megatron's --*-weighted-split-paths
    enc = ExampleEncoder(tokenizer, add_bos=True, target_space=True, add_eos=True, ...)
    examples = [tokenize_rows(s.name, read_records(s), enc, row_len=L + 1) for s in train]
    stream = PackedStream([e.lengths() for e in examples], weights, row_len=L + 1, seed=1)  # packing="best_fit"
    rows = stream.next_rows(64)                                   # lists of (source, example)
    arrays = rows_to_arrays(rows, examples, L + 1)                 # token_ids, segment_ids, is_input
    batch, label_mask, label_seg = model_inputs(*arrays, prefixlm, device)
    T0Batches(stream, examples, ...)                               # the Trainer's batch source

Conventions (each a config key of finetune_t0.py, declared in schema.py):
  - input ids = [BOS] + encode(inputs); no EOS or separator after the inputs;
  - target ids = encode(target) + [EOS]; with target_space=True the target's leading whitespace is
    replaced by exactly one space (through the tokenizer's dummy prefix, or an explicit " " for a
    tokenizer without one); target_space=False appends the target text exactly as given;
  - too long: inputs keep their last max_input_len tokens (BOS stays first; truncate_side="right":
    their first max_input_len, as Mesh-TF / seqio cut T0's inputs), targets their first
    max_target_len (EOS stays last); truncation="drop" drops such examples instead. Examples
    longer than the row are always dropped. Every case is counted per source.
"""
import bisect
import hashlib
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from tinylab.core.errors import UserError, first_line
from tinylab.core.fileio import read_text
from tinylab.interop import hub
from tinylab.t0 import megatron as megatron_data

# the config keys (schema.py) that ExampleEncoder takes, by name
TOKENIZATION_KEYS = ("add_bos", "target_space", "add_eos", "max_input_len", "max_target_len", "truncation",
                     "truncate_side")
NORMALIZATIONS = ("token", "example", "token_microbatch")
MIXINGS = ("example", "row")
TRUNCATIONS = ("truncate", "drop")
TRUNCATE_SIDES = ("left", "right")  # which end of a too-long input is cut (right = Mesh-TF / seqio, T0)
PACKINGS = ("best_fit", "next_fit")
MAX_PACK_BUFFER = 20_000  # balanced_order's integer sums stay exact far beyond this
SOURCE_KEYS = {"name", "path", "hf", "config", "split", "weight", "range", "dataset"}
GROUP_KEYS = {"name", "sources", "dataset"}  # a validation / test group blending several sources
SPLITS = ("train", "valid", "test")
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

    @property
    def kind(self):
        """'hf' (a hub dataset), 'file' (json / jsonl / parquet) or 'megatron': a path that is not
        such a file is a Megatron indexed prefix (<path>_inputs_document.{bin,idx}, ..._targets_...)."""
        if self.hf:
            return "hf"
        return "file" if is_file_path(self.path) else "megatron"

    def describe(self):
        where = self.path or f"{self.hf}" + (f"/{self.config}" if self.config else "") + f" [{self.split}]"
        if self.kind == "megatron":
            where = f"Megatron prefix {self.path}"
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
    return beside if os.path.exists(beside) or megatron_data.is_pair(beside) else path


def is_file_path(path):
    """A json / jsonl / parquet file (by extension), or any existing file; else a Megatron prefix."""
    return os.path.splitext(path)[1].lower() in FORMATS or os.path.isfile(path)


def _named_object(entry, allowed, where, kind):
    """(name, where naming it) of a mixture object (a source or a group): only `allowed` fields,
    and a 'name' usable in metric names."""
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise UserError(f"{where}: unknown {kind}field '{unknown[0]}' (fields: {', '.join(sorted(allowed))})")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise UserError(f"{where}: field 'name' must be a non-empty string without '/', got {name!r}")
    return name, f"{where} ('{name}')"


def parse_source(entry, where, base_dir, need_weight):
    if not isinstance(entry, dict):
        raise UserError(f"{where}: each source must be an object with 'name' and 'path' or 'hf', got {entry!r}")
    name, where = _named_object(entry, SOURCE_KEYS, where, "")
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


@dataclass
class Group:
    """A named validation or test group: one loss (and rank accuracy) over its weighted sources."""
    name: str
    sources: list
    split: str = "valid"
    dataset: str = ""  # per-dataset medians; default: the sources' common dataset, else the name

    def __post_init__(self):
        if not self.dataset:
            datasets = {s.dataset for s in self.sources}
            self.dataset = datasets.pop() if len(datasets) == 1 else self.name


@dataclass
class Mixture:
    """Everything a run reads: the training sources (all train groups blended into one stream)
    and the validation and test groups."""
    train: list
    valid: list = field(default_factory=list)
    test: list = field(default_factory=list)


def _file_stem(path):
    stem = os.path.basename(path.rstrip("/"))
    return os.path.splitext(stem)[0] if os.path.splitext(stem)[1].lower() in FORMATS else stem


def group_from_string(text, where, base_dir, split, taken=None, implicit_name=None):
    """A Group from Megatron's "NAME: W1 START:END PATH1, W2 START:END PATH2" (megatron_data.parse_group);
    its sources are named after their files or prefixes (a repeated one gets _<item number>),
    also unique against `taken` (the names already used in the split)."""
    name, items = megatron_data.parse_group(text, where, implicit_name)
    taken = set() if taken is None else taken
    sources = []
    for k, item in enumerate(items):
        stem = src_name = _file_stem(item.path)
        j = k + 1
        while src_name in taken:  # the same file twice (two ranges, or two train groups)
            src_name, j = f"{stem}_{j}", j + 1
        taken.add(src_name)
        sources.append(parse_source({"name": src_name, "weight": item.weight, "range": item.range_text,
                                     "path": item.path}, f"{where} item {k + 1}", base_dir, True))
    return Group(name, sources, split)


def _group_from_object(entry, where, base_dir, split):
    name, where = _named_object(entry, GROUP_KEYS, where, "group ")
    members = entry["sources"]
    if not isinstance(members, list) or not members:
        raise UserError(f"{where}: field 'sources' must be a non-empty list of sources")
    if "dataset" in entry and not isinstance(entry["dataset"], str):
        raise UserError(f"{where}: field 'dataset' must be a string, got {entry['dataset']!r}")
    sources = [parse_source(e, f"{where}: sources[{j}]", base_dir, True) for j, e in enumerate(members)]
    _check_unique([s.name for s in sources], f"{where}: source")
    return Group(name, sources, split, entry.get("dataset", ""))


def _parse_groups(spec, split, path, base_dir):
    """A mixture file's list for `split`: each entry a source (its own group, named after it), a
    group object {"name", "sources": [...]} or a Megatron group string."""
    if not isinstance(spec, list) or (split == "train" and not spec):
        raise UserError(f"mixture file {path}: field '{split}' must be a {'non-empty ' * (split == 'train')}list of "
                        f"sources (or groups)")
    groups, taken = [], set()
    for i, e in enumerate(spec):
        where = f"{path}: {split}[{i}]"
        if isinstance(e, str):
            groups.append(group_from_string(e, where, base_dir, split, taken if split == "train" else None))
        elif isinstance(e, dict) and "sources" in e:
            groups.append(_group_from_object(e, where, base_dir, split))
        else:
            src = parse_source(e, where, base_dir, need_weight=split == "train")
            groups.append(Group(src.name, [src], split))
    return groups


def _check_unique(names, what):
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise UserError(f"{what} name '{dup}' is used twice (names must be unique)")


def read_mixture(path):
    """The Mixture of a mixture file; every mistake is one UserError line naming the file and the field.
    "train" is a list of sources / groups, or one Megatron group string; "valid" and "test" are lists."""
    if not path:
        raise UserError("no mixture given: pass --mixture=PATH/mixture.json (python finetune_t0.py "
                        "--make_demo_data=DIR writes a built-in one) or --train-weighted-split-paths")
    text = read_text(path, "mixture file")
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"mixture file {path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
    if not isinstance(spec, dict) or "train" not in spec:
        raise UserError(f"mixture file {path}: needs a top-level object with field 'train' (and 'valid')")
    unknown = sorted(set(spec) - {*SPLITS, "max_examples_per_dataset"})
    if unknown:
        raise UserError(f"mixture file {path}: unknown top-level field '{unknown[0]}' (fields: train, valid, test, "
                        f"max_examples_per_dataset)")
    cap = spec.get("max_examples_per_dataset", 500_000)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise UserError(f"mixture file {path}: field 'max_examples_per_dataset' must be an integer >= 1, got {cap!r}")
    base = os.path.dirname(os.path.abspath(path))
    train_spec = spec["train"]
    if isinstance(train_spec, str):  # Megatron's one-line form (its NAME: optional here)
        train = [group_from_string(train_spec, f"{path}: train", base, "train", implicit_name="train")]
    else:
        train = _parse_groups(train_spec, "train", path, base)
    mixture = Mixture([s for g in train for s in g.sources],
                      *(_parse_groups(spec.get(split, []), split, path, base) for split in ("valid", "test")))
    for src in mixture.train:
        src.cap = cap
    _check_unique([s.name for s in mixture.train], f"mixture file {path}: train")
    for split in ("valid", "test"):
        _check_unique([g.name for g in getattr(mixture, split)], f"mixture file {path}: {split}")
    return mixture


def load_mixture(path):
    """(train sources, every validation source) of a mixture file (evaluation/eval_rank.py)."""
    mixture = read_mixture(path)
    return mixture.train, [s for g in mixture.valid for s in g.sources]


def mixture_from_config(cfg):
    """finetune_t0.py's data: the weighted-split arguments (Megatron's spelling; paths relative to
    the working folder, as there) when given, else the mixture file. Several train groups are one
    blend: every item's weight as given, as if all were in one group."""
    texts = megatron_data.group_texts(cfg)
    if not texts:
        return read_mixture(cfg["mixture"])
    taken, groups = set(), {}
    for split in SPLITS:
        groups[split] = [group_from_string(t, where, "", split, taken if split == "train" else None)
                         for where, t in texts.get(split, [])]
    return Mixture([s for g in groups["train"] for s in g.sources], groups["valid"], groups["test"])


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


def check_range_overlap(train, valid, test=()):
    """The same file or Megatron prefix with overlapping row ranges in two splits (train / valid /
    test; Megatron's 0.95:1 trap). Groups of one split may share rows (an overall group and a
    per-dataset one)."""
    splits = (("training", train), ("validation", valid), ("test", test))
    for i, (name_a, a) in enumerate(splits):
        for name_b, b in splits[i + 1:]:
            for v in b:
                for t in a:
                    same = (v.path and t.path and os.path.abspath(v.path) == os.path.abspath(t.path)) or \
                           (v.hf and (v.hf, v.config, v.split) == (t.hf, t.config, t.split))
                    if same and v.start < t.end and t.start < v.end:
                        raise UserError(f"{name_b} {v.describe()} overlaps {name_a} {t.describe()}: the same file with "
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
        if os.path.getsize(src.path) == 0:  # (the datasets library's own message is a bare StopIteration)
            raise UserError(f"source {src.describe()}: file {src.path} is empty")
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


def check_hash_overlap(train_hashes, valid_name, valid_rows, what="validation group"):
    shared = [r for r in valid_rows if example_hash(r["inputs"], r["targets"]) in train_hashes]
    if shared:
        first = shared[0]["inputs"].strip().replace("\n", " ")[:60]
        raise UserError(f"{what} '{valid_name}' shares {len(shared)} of {len(valid_rows)} examples with "
                        f"the training data (same inputs + targets, e.g. {first!r}); validation must be held out")


# ---------------------------------------------------------------------- tokenisation

class ExampleEncoder:
    """Turns (inputs, targets) strings into (input ids, target ids) by the module's conventions."""

    def __init__(self, tokenizer, add_bos=True, target_space=True, add_eos=True, max_input_len=1024,
                 max_target_len=256, truncation="truncate", truncate_side="left"):
        if truncation not in ("truncate", "drop"):
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


def tokenize_rows(name, rows, encoder: ExampleEncoder, row_len=None):
    """Examples of one source; examples longer than `row_len` (when given) are dropped."""
    stats = new_stats(len(rows))
    rows, stats["skipped_empty"] = usable(rows)
    inputs = encoder.encode_inputs([r["inputs"] for r in rows])
    targets = encoder.encode_targets([r["targets"] for r in rows])
    return fit_examples(name, zip(inputs, targets), encoder, row_len, stats)


def fit_examples(name, pairs, encoder: ExampleEncoder, row_len, stats):
    """Examples from (input ids, target ids) lists: the encoder's length limits (fit), then the
    row limit; json and Megatron sources alike."""
    out = Examples(name, stats=stats)
    for inp, tgt in pairs:
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


# ---------------------------------------------------------------------- Megatron indexed sources

def read_indexed(src, vocab_size):
    """(input ids, target ids) views of a Megatron source's items [round(START n), round(END n))
    (Megatron's get_split_by_range_ rounds; json sources floor), checked by megatron_data.open_pair."""
    inputs, targets = megatron_data.open_pair(src.path, vocab_size, what=f"source {src.describe()}")
    n = len(targets)
    return [(inputs[i], targets[i]) for i in range(round(src.start * n), round(src.end * n))]


def indexed_examples(name, pairs, encoder: ExampleEncoder, row_len=None):
    """Examples of a Megatron source: its ids as stored (BOS / EOS are whatever the files hold),
    through the same length and row limits as tokenised text; empty items are skipped and counted."""
    stats = new_stats(len(pairs))
    ok = [(a, b) for a, b in pairs if len(a) and len(b)]
    stats["skipped_empty"] = len(pairs) - len(ok)
    return fit_examples(name, ((a.tolist(), b.tolist()) for a, b in ok), encoder, row_len, stats)


def ids_hash(inputs, targets):
    """example_hash's counterpart for token ids (independent of the files' dtype)."""
    return hashlib.sha1(np.asarray(inputs, dtype=np.int64).tobytes() + b"|" +
                        np.asarray(targets, dtype=np.int64).tobytes()).hexdigest()


def check_ids_overlap(train_hashes, name, pairs):
    shared = [i for i, (a, b) in enumerate(pairs) if ids_hash(a, b) in train_hashes]
    if shared:
        raise UserError(f"{name} shares {len(shared)} of {len(pairs)} examples with the training data (the same input "
                        f"and target token ids, e.g. item {shared[0]} of its range); it must be held out")


# ---------------------------------------------------------------------- packing

class _EpochOrder:
    """A source's example indices in a new seeded shuffle every epoch (seed + epoch)."""

    def __init__(self, n, seed, source_index):
        self.n, self.seed, self.source_index = n, seed, source_index
        self.epoch, self.index, self._perm = 0, 0, None

    def _perm_now(self):
        """The current epoch's permutation, moving to the next epoch once this one is used up."""
        if self.index == self.n:
            self.epoch, self.index, self._perm = self.epoch + 1, 0, None
        if self._perm is None:
            self._perm = np.random.default_rng([self.seed, 11, self.source_index, self.epoch]).permutation(self.n)
        return self._perm

    def next(self):
        perm = self._perm_now()
        self.index += 1
        return int(perm[self.index - 1])

    def take(self, n):
        """The next n indices, exactly what n calls of next() return, as one array."""
        parts = []
        while n > 0:
            perm = self._perm_now()
            k = min(n, self.n - self.index)
            parts.append(perm[self.index:self.index + k])
            self.index, n = self.index + k, n - k
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

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

    def _block_now(self):
        """The draws of the block holding position k."""
        b = self.k // self.BLOCK
        if b != self._block:
            u = np.random.default_rng([self.seed, 7, b]).random(self.BLOCK)
            self._block, self._draws = b, np.searchsorted(self.cum, u, side="right")
        return self._draws

    def next(self):
        draws = self._block_now()
        self.k += 1
        return int(draws[(self.k - 1) % self.BLOCK])

    def take(self, n):
        """The next n source indices, exactly what n calls of next() return."""
        parts = []
        while n > 0:
            draws, off = self._block_now(), self.k % self.BLOCK
            m = min(n, self.BLOCK - off)
            parts.append(draws[off:off + m])
            self.k, n = self.k + m, n - m
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class _MixedExamples:
    """The weighted mixture as a stream of (source, example index): a seeded draw picks the source,
    its epoch order the example. take(n) gives the same pairs as n calls of next()."""

    def __init__(self, draws, orders):
        self.draws, self.orders = draws, orders

    def next(self):
        s = self.draws.next()
        return s, self.orders[s].next()

    def take(self, n):
        src = self.draws.take(n)
        idx = np.empty(n, dtype=np.int64)
        for k, order in enumerate(self.orders):
            pick = src == k
            idx[pick] = order.take(int(pick.sum()))  # each source's examples in draw order
        return src, idx

    def state(self):
        return {"draws": self.draws.k, "orders": [o.state() for o in self.orders]}

    def load(self, st):
        self.draws.k = int(st["draws"])
        for o, s in zip(self.orders, st["orders"]):
            o.load(s)


class _SourceExamples:
    """One source's examples in its epoch order (mixing="row": every source packed on its own)."""

    def __init__(self, source, order):
        self.source, self.order = source, order

    def next(self):
        return self.source, self.order.next()

    def take(self, n):
        return np.full(n, self.source, dtype=np.int64), self.order.take(n)

    def state(self):
        return self.order.state()

    def load(self, st):
        self.order.load(st)


def best_fit_decreasing(lengths, row_len):
    """Rows (lists of positions into `lengths`) by best-fit decreasing: longest item first, each
    into the open row with the least room that still holds it, else a new row. The open rows are
    one sorted list of (room << 32 | row) keys, so a fit is one bisect; a row with less room than
    the shortest item is closed for good. O(n log n), per item not per token. Returns the rows
    and their token counts."""
    order = np.argsort(-np.asarray(lengths), kind="stable").tolist()
    sizes = np.asarray(lengths).tolist()
    if not order:
        return [], []
    shortest, rows, used, keys = sizes[order[-1]], [], [], []
    for j in order:
        n = sizes[j]
        at = bisect.bisect_left(keys, n << 32)
        if at == len(keys):
            r, room = len(rows), row_len - n
            rows.append([j])
            used.append(n)
        else:
            key = keys.pop(at)
            r, room = key & 0xFFFFFFFF, (key >> 32) - n
            rows[r].append(j)
            used[r] += n
        if room >= shortest:
            bisect.insort(keys, (room << 32) | r)
    return rows, used


def balanced_order(mass):
    """An order of the rows of `mass` (rows x columns of non-negative integers, e.g. examples and
    tokens of each source in each row) in which every prefix holds each column in close to its
    share of the whole: greedily the row r minimising |d + e_r|^2, where d = c - n q is the
    prefix's discrepancy (c its column sums, n their total, q = the columns' shares of all rows)
    and e_r = m_r - n_r q the row's own. Ties go to the lowest index.
    |d + e_r|^2 - |d|^2 = 2 e_r.d + |e_r|^2 = 2 (m_r.c - n m_r.q - n_r q.c + n n_r q.q) + |e_r|^2,
    kept from P_r = m_r.c, which only the chosen row's nonzero columns change. Dot products are
    of integers (exact whatever the summation order), the rest element-wise float64: every
    machine and rank computes the same order."""
    m = np.asarray(mass, dtype=np.int64)
    R = m.shape[0]
    n_r, tot = m.sum(1), m.sum(0)
    N = int(n_r.sum())
    b = (m @ tot) / N  # m_r . q
    qq = sum(int(t) ** 2 for t in tot.tolist()) / N ** 2  # q . q
    base = (m * m).sum(1) - 2 * n_r * b + n_r * n_r * qq  # |e_r|^2; inf once placed
    rows, cols = np.nonzero(m)
    nonzero = np.split(cols, np.searchsorted(rows, np.arange(1, R)))
    m, n_r = m.astype(np.float64), n_r.astype(np.float64)
    P2, score = np.zeros(R), np.empty(R)  # 2 m_r.c
    qc, n, order = 0.0, 0.0, []  # q.c, total of c
    for _ in range(R):
        np.multiply(b, -2.0 * n, out=score)
        score += base
        score += P2
        score += (2.0 * (n * qq - qc)) * n_r
        j = int(score.argmin())
        order.append(j)
        base[j] = np.inf
        k = nonzero[j]
        P2 += m[:, k] @ (2.0 * m[j, k])
        qc += b[j]
        n += n_r[j]
    return order


class _BestFit:
    """Best-fit decreasing over successive chunks of `buffer` examples of a stream (docs/t0.md §4).
    A chunk's rows come out in balanced_order of their examples and tokens per source (over a
    seeded shuffle, which breaks its ties), so every window of rows holds each source's examples
    and tokens in close to the chunk's proportions (the draws'), not the chunk's longest examples
    first. State: the stream's position at the chunk's start, the chunk's number and the rows
    already given (plain ints); a resume packs that chunk again."""

    def __init__(self, examples, lengths, offsets, row_len, buffer, seed, salt):
        self.examples, self.lengths, self.offsets = examples, lengths, offsets
        self.row_len, self.buffer, self.seed, self.salt = row_len, buffer, seed, salt
        self.chunk, self.start, self.rows, self.given = 0, None, None, 0
        self.used = 0  # tokens of the row last given

    def _pack(self):
        self.start = self.examples.state()
        src, idx = self.examples.take(self.buffer)
        sizes = self.lengths[self.offsets[src] + idx]
        rows, used = best_fit_decreasing(sizes, self.row_len)
        perm = np.random.default_rng([self.seed, 17, self.salt, self.chunk]).permutation(len(rows)).tolist()
        rows, used = [rows[r] for r in perm], [used[r] for r in perm]
        sources, local = np.unique(src, return_inverse=True)
        if len(sources) > 1:  # examples and tokens per (row, source) -> the balanced order
            R, S = len(rows), len(sources)
            items = np.fromiter((j for r in rows for j in r), dtype=np.int64, count=len(src))
            cell = np.repeat(np.arange(R), [len(r) for r in rows]) * S + local[items]
            examples = np.bincount(cell, minlength=R * S).reshape(R, S)
            tokens = np.bincount(cell, weights=sizes[items], minlength=R * S).reshape(R, S).astype(np.int64)
            per_example = max(1, round(int(tokens.sum()) / int(examples.sum())))  # both in token units
            order = balanced_order(np.hstack([examples * per_example, tokens]))
            rows, used = [rows[r] for r in order], [used[r] for r in order]
        src, idx = src.tolist(), idx.tolist()
        self.rows = [[(src[j], idx[j]) for j in r] for r in rows]
        self.row_used = used
        self.given = 0

    def next_row(self):
        if self.rows is None:
            self._pack()
        elif self.given == len(self.rows):
            self.chunk += 1
            self._pack()
        self.given += 1
        self.used = self.row_used[self.given - 1]
        return self.rows[self.given - 1]

    def state(self):
        return None if self.rows is None else {"chunk": self.chunk, "start": self.start, "given": self.given}

    def load(self, st):
        self.chunk, self.rows, self.given = 0, None, 0
        if st is not None:
            self.chunk = int(st["chunk"])
            self.examples.load(st["start"])
            self._pack()  # the same chunk again; leaves the stream where the saved one was
            self.given = int(st["given"])


class _NextFit:
    """Greedy next-fit packing of a stream of examples: append while the next one fits, else close
    the row; the example that did not fit opens the next row (and may cross into a new epoch)."""

    def __init__(self, next_example, length, row_len):
        self.next_example, self.length, self.row_len = next_example, length, row_len
        self.carry, self.used = None, 0  # the example that opens the next row; tokens of the last row

    def next_row(self):
        items, used = [], 0
        while True:
            ex = self.carry if self.carry is not None else self.next_example()
            self.carry = None
            n = self.length(ex)
            if items and used + n > self.row_len:
                self.carry, self.used = ex, used
                return items
            items.append(ex)
            used += n

    def state(self):
        return None if self.carry is None else list(self.carry)

    def load(self, st):
        self.carry = None if st is None else (int(st[0]), int(st[1]))


class PackedStream:
    """Rows of `row_len` tokens from several sources, each row a list of (source, example index).

    mixing="example" (default): examples are drawn from the sources in proportion to `weights`
    (seeded), each source in a new shuffled order every epoch.
    mixing="row" (Megatron-DeepSpeed's blend): each source is packed on its own and row i comes
    from the source maximising w_s * max(i, 1) - rows_used_s, so every row is single-source and
    the row counts follow the weights exactly.
    packing="best_fit" (default): best-fit decreasing over chunks of `buffer` drawn examples, rows
    in a weight-balanced order (_BestFit; >= 0.99 full on long-tailed lengths); "next_fit": the examples
    in draw order, a row closed when the next one does not fit (the earlier packer, ~0.85).
    Deterministic in (lengths, weights, row_len, seed, mixing, packing, buffer); state_dict() is
    plain ints.
    """

    def __init__(self, lengths, weights, row_len, seed, mixing="example", packing="best_fit", buffer=2000):
        if mixing not in MIXINGS:
            raise UserError(f"mixing must be one of {', '.join(MIXINGS)}, not '{mixing}'")
        if packing not in PACKINGS:
            raise UserError(f"packing must be one of {', '.join(PACKINGS)}, not '{packing}'")
        if isinstance(buffer, bool) or not isinstance(buffer, int) or not 1 <= buffer <= MAX_PACK_BUFFER:
            raise UserError(f"pack_buffer must be an integer in [1, {MAX_PACK_BUFFER}], got {buffer!r}")
        if any(len(l) == 0 for l in lengths):
            raise UserError("every training source needs at least one example that fits the row")
        longest = max(int(np.max(l)) for l in lengths)
        if longest > row_len:
            raise UserError(f"an example of {longest} tokens does not fit a row of {row_len}")
        w = np.asarray(weights, dtype=np.float64)
        self.weights = w / w.sum()
        self.lengths, self.row_len, self.mixing = [np.asarray(l) for l in lengths], row_len, mixing
        self.packing = packing
        self.orders = [_EpochOrder(len(l), seed, i) for i, l in enumerate(lengths)]
        if mixing == "example":
            self.draws = _WeightedDraws(self.weights, seed)
            streams = [_MixedExamples(self.draws, self.orders)]
        else:
            streams = [_SourceExamples(s, o) for s, o in enumerate(self.orders)]
            self.rows_used = np.zeros(len(lengths), dtype=np.int64)
        if packing == "next_fit":
            length = lambda ex: int(self.lengths[ex[0]][ex[1]])  # noqa: E731
            self.packers = [_NextFit(st.next, length, row_len) for st in streams]
        else:
            flat = np.concatenate(self.lengths)  # lengths of (s, i) at offsets[s] + i
            offsets = np.concatenate([[0], np.cumsum([len(l) for l in self.lengths])[:-1]]).astype(np.int64)
            self.packers = [_BestFit(st, flat, offsets, row_len, buffer, seed, salt)
                            for salt, st in enumerate(streams)]
        self.rows, self.tokens = 0, 0

    def next_row(self):
        if self.mixing == "example":
            packer = self.packers[0]
        else:
            s = int(np.argmax(self.weights * max(self.rows, 1) - self.rows_used))
            self.rows_used[s] += 1
            packer = self.packers[s]
        row = packer.next_row()
        self.rows += 1
        self.tokens += packer.used
        return row

    def next_rows(self, n):
        return [self.next_row() for _ in range(n)]

    def fill_rate(self):
        """Non-pad fraction of all rows produced so far."""
        return self.tokens / max(1, self.rows * self.row_len)

    def state_dict(self):
        # next_fit keeps its earlier layout ("carry"), so its checkpoints still resume
        key = "carry" if self.packing == "next_fit" else "packers"
        st = {"orders": [o.state() for o in self.orders], "rows": self.rows, "tokens": self.tokens,
              key: [p.state() for p in self.packers]}
        if self.mixing == "example":
            st["draws"] = self.draws.k
        else:
            st["rows_used"] = self.rows_used.tolist()
        return st

    def load_state_dict(self, st):
        for o, s in zip(self.orders, st["orders"]):
            o.load(s)
        self.rows, self.tokens = int(st["rows"]), int(st["tokens"])
        if self.mixing == "example":
            self.draws.k = int(st["draws"])
        else:
            self.rows_used = np.asarray(st["rows_used"], dtype=np.int64)
        for p, c in zip(self.packers, st["carry" if self.packing == "next_fit" else "packers"]):
            p.load(c)  # after the orders: a best-fit packer rewinds them to its chunk and repacks it


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


# ---------------------------------------------------------------------- positions, loss

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
    the label mask / label segments (on the CPU) for loss weights. The batch carries segment ids
    (and, for prefix-LM, the input tokens' prefix_mask), not a (R, L, L) mask: the model builds
    its attention mask from them at each forward (model.Transformer.packed_attention)."""
    token_ids, seg, is_input = (torch.as_tensor(a) for a in (token_ids, seg, is_input))
    tokens, labels, label_mask, label_seg, tok_seg, tok_inp = shift(token_ids, seg, is_input)
    tok_seg = tok_seg.to(device)
    batch = {"tokens": tokens.to(device), "targets": labels.to(device), "segment_ids": tok_seg,
             "position_ids": position_ids(tok_seg)}
    if prefixlm:
        batch["prefix_mask"] = tok_inp.to(device)
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
                            "tokenisation, max_seq_len, mixing, packing or seed changed); cannot resume it exactly "
                            "(a run started before packing=best_fit existed resumes with --packing=next_fit)")
        self.stream.load_state_dict(state["stream"])
        self.queue = []
