"""The T0 mixture (docs/t0.md §1, §3): a mixture file of prompted datasets, or Megatron's
weighted-split arguments, as training Sources and validation / test Groups; the training weights
("examples": T0's examples-proportional mixing); held-out groups; the same file used with
overlapping row ranges by two splits.

    mixture = read_mixture("data/t0/mixture.json")      # Mixture(train, valid, test)
    mixture = mixture_from_config(cfg)                  # or --*-weighted-split-paths
    train, valid = load_mixture("data/t0/mixture.json")  # Source lists

What a source is (a hub dataset, a local file, a Megatron prefix, ...) is decided by the source
kinds registered in tinylab/t0/sources/.
"""
import json
import math
import os
from dataclasses import dataclass, field

from tinylab.core.errors import UserError
from tinylab.core.fileio import read_text
from tinylab.t0 import megatron as megatron_data
from tinylab.t0.sources import find_reader, reader_for
from tinylab.t0.sources.registry import file_extensions

SOURCE_KEYS = {"name", "path", "hf", "config", "split", "weight", "range", "dataset"}
GROUP_KEYS = {"name", "sources", "dataset"}  # a validation / test group blending several sources
SPLITS = ("train", "valid", "test")


@dataclass
class Source:
    name: str
    path: str = ""  # a local file or a Megatron prefix
    hf: str = ""  # or a hub dataset (with config and split)
    config: str = ""
    split: str = "train"
    weight: object = 1.0  # a number > 0, or "examples": T0's examples-proportional weight (capped)
    cap: int = 500_000  # "examples" weighting: MAX_EXAMPLES_PER_DATASET
    start: float = 0.0  # the rows [start * n, end * n) of the file
    end: float = 1.0
    dataset: str = ""  # the dataset this prompt belongs to (per-dataset medians); default: name
    split_part: tuple = ()  # --data-path/--split: (train, valid, test fractions, part); its documents by Megatron's rounding
    range_reading: str = "as_written"  # a Megatron prefix's range: its own items, or Megatron's (sources/megatron.py)

    @property
    def reader(self):
        """The registered source kind that reads this source (tinylab/t0/sources/)."""
        return reader_for(self)

    @property
    def kind(self):
        """The name of that kind: 'hf' (a hub dataset), 'file' (json / jsonl / parquet), 'megatron'
        (a path that names no file: a Megatron indexed prefix), or another registered kind."""
        name, entry = find_reader(self)
        if entry is None:
            reader_for(self)  # an unsupported file type: its one-line error
        return name

    def describe(self):
        entry = find_reader(self)[1]
        where = entry.place(self) if entry is not None and entry.place is not None else self.path
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
    return os.path.splitext(stem)[0] if os.path.splitext(stem)[1].lower() in file_extensions() else stem


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
    if cfg.get("megatron_data_path"):
        mixture = _data_path_mixture(cfg)
    elif not texts:
        mixture = read_mixture(cfg["mixture"])
    else:
        mixture = _split_paths_mixture(texts)
    for src in mixture.train + [s for g in mixture.valid + mixture.test for s in g.sources]:
        src.range_reading = cfg.get("megatron_range_reading", "as_written")
    return mixture


def _split_paths_mixture(texts):
    taken, groups = set(), {}
    for split in SPLITS:
        groups[split] = [group_from_string(t, where, "", split, taken if split == "train" else None)
                         for where, t in texts.get(split, [])]
    return Mixture([s for g in groups["train"] for s in g.sources], groups["valid"], groups["test"])


def _data_path_mixture(cfg):
    """--data-path W1 P1 W2 P2 with --split a,b,c (Megatron's option 1): every prefix split into
    train / valid / test documents; the train parts blended by weight, the valid parts one group
    "valid", the test parts one group "test" (a part of size 0 is left out, as Megatron builds no
    dataset for it)."""
    fractions = megatron_data.split_fractions(cfg["megatron_split"] or "969,30,1")
    cum = [0.0, fractions[0], fractions[0] + fractions[1], 1.0]
    parts, taken = [[], [], []], set()
    for weight, path in megatron_data.data_path_items(cfg["megatron_data_path"]):
        stem = name = _file_stem(path)
        j = 2
        while name in taken:
            name, j = f"{stem}_{j}", j + 1
        taken.add(name)
        for k in range(3):
            if fractions[k] > 0:
                parts[k].append(Source(name=name, path=path, weight=weight, start=cum[k], end=min(1.0, cum[k + 1]),
                                       dataset=name, split_part=(fractions, k)))
    if not parts[0]:
        raise UserError("--split gives the training part no documents")
    return Mixture(parts[0], *([Group(split, members, split)] if members else [] for split, members in
                               (("valid", parts[1]), ("test", parts[2]))))


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

