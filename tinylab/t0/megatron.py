"""Megatron-DeepSpeed's data, read and written as its code does (docs/t0.md, "Megatron-DeepSpeed's
data and arguments"): the memory-mapped indexed dataset format and the weighted-split arguments.

Indexed dataset (`megatron/data/indexed_dataset.py`, MMapIndexedDataset, `--dataset-impl mmap`):
a prefix P is two files, P.bin (the token ids of every item back to back, one dtype) and P.idx:

    magic    9 bytes  b"MMIDIDX\\x00\\x00"
    version  <Q       1
    dtype    <B       code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float, 7 double, 8 uint16
    len      <Q       number of items N
    docs     <Q       number of document-index entries D
    sizes    N x int32   tokens per item
    pointers N x int64   byte offset of each item in P.bin (exclusive scan of sizes * itemsize)
    doc_idx  D x int64   item index where each document starts ([0, ..., N])

T0 data is a pair of such datasets per prefix, `<prefix>_inputs_document` and
`<prefix>_targets_document` (tools/preprocess_data.py --json-keys inputs / targets); item i of
both is example i (mtf_dataset.py). Reading is zero-copy: items are numpy views into np.memmap.

Weighted-split arguments (`megatron/arguments.py`, parse_data_paths): a group is
"NAME: W1 START:END PREFIX1, W2 START:END PREFIX2"; the `-path` variants read a file holding one
line of space-separated quoted groups. This module parses them with a position for every mistake;
tinylab/t0/mixture.py turns them into mixture sources.
"""
import contextlib
import math
import os
import re
import struct
from dataclasses import dataclass

import numpy as np

from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.core.fileio import atomic_file, read_text

HDR_MAGIC = b"MMIDIDX\x00\x00"
OLD_MAGIC = b"TNTIDX\x00\x00"  # the 'lazy' / 'cached' IndexedDataset format
VERSION = 1
HEADER_BYTES = len(HDR_MAGIC) + 8 + 1 + 8 + 8
# Megatron's `dtypes` table (6 is `np.float`, i.e. Python's float: float64)
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.double, 8: np.uint16}
FIELDS = ("inputs", "targets")
SPLITS = ("train", "valid", "test")


def best_fitting_dtype(vocab_size):
    """Megatron's choice for token ids (indexed_dataset.best_fitting_dtype)."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def dtype_code(dtype):
    """The first code of the table whose dtype is `dtype` (Megatron's code(); float64 -> 7, as
    there: its 6 is Python's float, which never equals np.float64)."""
    for k, v in DTYPES.items():
        if k != 6 and np.dtype(v) == np.dtype(dtype):
            return k
    raise ValueError(f"dtype {dtype} has no MMapIndexedDataset code")


def _mmap(path):
    """A read-only uint8 memmap of `path` (an empty array for an empty file: mmap refuses those)."""
    if os.path.getsize(path) == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, mode="r", dtype=np.uint8, order="C")


class IndexedDataset:
    """A Megatron MMapIndexedDataset at `prefix` (prefix.idx + prefix.bin), memory-mapped and
    validated: a bad magic / version / dtype code, a truncated .idx, an index whose pointers
    run past the end of the .bin or go backwards are one UserError naming the file. ds[i] and
    ds.get(i, offset, length) are zero-copy read-only views (Megatron's API)."""

    def __init__(self, prefix):
        self.prefix, self.idx_path, self.bin_path = prefix, prefix + ".idx", prefix + ".bin"
        for p in (self.idx_path, self.bin_path):
            if not os.path.isfile(p):
                raise UserError(f"indexed dataset file {p} not found")
        self._index = _mmap(self.idx_path)
        self._read_index(memoryview(self._index))
        self._bin = _mmap(self.bin_path)
        self._check_pointers()

    def _read_index(self, buf):
        idx = self.idx_path
        head = bytes(buf[:len(HDR_MAGIC)])
        if head[:len(OLD_MAGIC)] == OLD_MAGIC:
            raise UserError(f"{idx} is Megatron's 'lazy'/'cached' IndexedDataset format, not mmap: run "
                            f"tools/preprocess_data.py with --dataset-impl mmap")
        if len(buf) >= len(HDR_MAGIC) and head != HDR_MAGIC:
            raise UserError(f"{idx} is not a Megatron MMapIndexedDataset index (magic {head!r}, expected {HDR_MAGIC!r})")
        if len(buf) < HEADER_BYTES:
            raise UserError(f"{idx} is truncated: {len(buf)} bytes, shorter than the {HEADER_BYTES}-byte header")
        at = len(HDR_MAGIC)
        version, = struct.unpack_from("<Q", buf, at)
        if version != VERSION:
            raise UserError(f"{idx}: index version {version}, only version {VERSION} exists")
        code, = struct.unpack_from("<B", buf, at + 8)
        if code not in DTYPES:
            raise UserError(f"{idx}: unknown dtype code {code} (codes: {', '.join(map(str, DTYPES))})")
        if code in (6, 7):
            raise UserError(f"{idx}: dtype code {code} is a float type; token ids are integers")
        self.dtype = np.dtype(DTYPES[code])
        n, docs = struct.unpack_from("<QQ", buf, at + 9)
        need = HEADER_BYTES + n * 4 + n * 8 + docs * 8
        if len(buf) < need:
            raise UserError(f"{idx} is truncated: {len(buf)} bytes, but its header lists {n} items and {docs} "
                            f"document-index entries ({need} bytes)")
        self.sizes = np.frombuffer(buf, dtype=np.int32, count=n, offset=HEADER_BYTES)
        self.pointers = np.frombuffer(buf, dtype=np.int64, count=n, offset=HEADER_BYTES + n * 4)
        self.doc_idx = np.frombuffer(buf, dtype=np.int64, count=docs, offset=HEADER_BYTES + n * 12)

    def _check_pointers(self):
        n, item = len(self.sizes), self.dtype.itemsize
        if n and (self.sizes.min() < 0 or self.pointers.min() < 0):
            raise UserError(f"{self.idx_path}: negative sizes or pointers (a damaged index)")
        ends = self.pointers + self.sizes.astype(np.int64) * item
        self.nbytes = int(ends.max()) if n else 0
        if self.nbytes > len(self._bin):
            last = int(np.argmax(ends > len(self._bin)))
            raise UserError(f"{self.bin_path} is shorter than its index says: {len(self._bin)} bytes, but item {last} "
                            f"of {self.idx_path} ends at byte {int(ends[last])} (a truncated or mismatched .bin)")
        if len(self.doc_idx) and (np.any(np.diff(self.doc_idx) < 0) or self.doc_idx.min() < 0 or self.doc_idx.max() > n):
            raise UserError(f"{self.idx_path}: its document index is not a non-decreasing list of item positions in [0, {n}]")

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                raise ValueError("slices into an indexed dataset must be contiguous")
            return [self.get(k) for k in range(start, stop)]
        return self.get(i)

    def get(self, i, offset=0, length=None):
        """Item i (from token `offset`, `length` tokens), a read-only view into the .bin."""
        size = int(self.sizes[i])
        length = size - offset if length is None else length
        return np.frombuffer(self._bin, dtype=self.dtype, count=length,
                             offset=int(self.pointers[i]) + offset * self.dtype.itemsize)

    def id_range(self):
        """(min, max) token id over all items (None for an empty dataset); one pass over the .bin."""
        if self.nbytes == 0:
            return None
        start = int(self.pointers.min())
        ids = np.frombuffer(self._bin, dtype=self.dtype, count=(self.nbytes - start) // self.dtype.itemsize, offset=start)
        return int(ids.min()), int(ids.max())


def write_index(f, dtype, sizes, doc_idx):
    """An .idx file's bytes (Megatron's MMapIndexedDataset.Index.writer)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    f.write(HDR_MAGIC)
    f.write(struct.pack("<Q", VERSION))
    f.write(struct.pack("<B", dtype_code(dtype)))
    f.write(struct.pack("<Q", len(sizes)))
    f.write(struct.pack("<Q", len(doc_idx)))
    f.write(sizes.astype(np.int32).tobytes(order="C"))
    pointers = np.zeros(len(sizes), dtype=np.int64)
    pointers[1:] = np.cumsum(sizes * np.dtype(dtype).itemsize)[:-1]
    f.write(pointers.tobytes(order="C"))
    f.write(np.asarray(doc_idx, dtype=np.int64).tobytes(order="C"))


def write_items(bin_f, idx_f, items, dtype):
    """One item per document, as tools/preprocess_data.py writes a json key without
    --split-sentences (MMapIndexedDatasetBuilder: add_item, end_document, finalize)."""
    sizes = []
    for ids in items:
        arr = np.asarray(ids, dtype=np.int64)
        bin_f.write(arr.astype(dtype).tobytes(order="C"))
        sizes.append(len(arr))
    write_index(idx_f, dtype, sizes, list(range(len(sizes) + 1)))


# ---------------------------------------------------------------------- <prefix>_{inputs,targets}_document

def pair_prefixes(prefix, fields=FIELDS):
    """{field: <prefix>_<field>_document} (tools/preprocess_data.py's "{}_{}_{}" of prefix, json key, level)."""
    return {f: f"{prefix}_{f}_document" for f in fields}


def pair_files(prefix, fields=FIELDS):
    return [p + ext for p in pair_prefixes(prefix, fields).values() for ext in (".bin", ".idx")]


def is_pair(prefix):
    return any(os.path.exists(p) for p in pair_files(prefix))


def open_pair(prefix, vocab_size=None, what=None):
    """(inputs, targets) IndexedDatasets of a T0 prefix: all four files present, the same number
    of items in both halves, and (given vocab_size) every id in [0, vocab_size)."""
    what = what or f"Megatron prefix {prefix}"
    missing = [p for p in pair_files(prefix) if not os.path.isfile(p)]
    if missing:
        raise UserError(f"{what}: {', '.join(missing)} not found (a prefix needs {prefix}_inputs_document.{{bin,idx}} "
                        f"and {prefix}_targets_document.{{bin,idx}}: tools/preprocess_data.py --json-keys inputs / "
                        f"targets, or python finetune_t0.py --preprocess)")
    halves = [IndexedDataset(p) for p in pair_prefixes(prefix).values()]
    if len(halves[0]) != len(halves[1]):
        raise UserError(f"{what}: {halves[0].idx_path} has {len(halves[0])} items but {halves[1].idx_path} has "
                        f"{len(halves[1])}; item i of both must be example i (was an empty input or target skipped "
                        f"by preprocess_data.py?)")
    if vocab_size is not None:
        for ds in halves:
            lo_hi = ds.id_range()
            if lo_hi and (lo_hi[0] < 0 or lo_hi[1] >= vocab_size):
                bad = lo_hi[1] if lo_hi[1] >= vocab_size else lo_hi[0]
                raise UserError(f"{ds.bin_path} holds token id {bad}, outside the tokenizer's vocabulary of "
                                f"{vocab_size} (made with another tokenizer?)")
    return tuple(halves)


def check_outputs(prefix):
    """Before any work: `prefix` names files in an existing folder (whether its files may be
    replaced is the output guard's rule, outputs.guard_prefix)."""
    if not prefix or prefix.endswith(("/", os.sep)):
        raise UserError(f"--output_prefix={prefix!r} must name a file prefix (e.g. data/rte), not a folder")
    parent = os.path.dirname(os.path.abspath(prefix))
    if not os.path.isdir(parent):
        raise UserError(f"--output_prefix={prefix}: folder {parent} does not exist")


def write_fields(prefix, items, vocab_size):
    """Write <prefix>_<field>_document.{bin,idx} for each field of `items` ({field: [ids of each
    example]}: one item per example, dtype by vocabulary as Megatron's). Each file is written to a
    temp name and all are renamed only once all are complete, so a failure leaves none of them."""
    if len({len(v) for v in items.values()}) > 1:
        raise ValueError("the fields differ in length")
    dtype = best_fitting_dtype(vocab_size)
    with contextlib.ExitStack() as stack:
        for field, ids in items.items():
            p = pair_prefixes(prefix, (field,))[field]
            bin_f = stack.enter_context(atomic_file(p + ".bin"))
            idx_f = stack.enter_context(atomic_file(p + ".idx"))
            write_items(bin_f, idx_f, ids, dtype)
    return pair_files(prefix, tuple(items))


# ---------------------------------------------------------------------- weighted-split arguments

@dataclass
class SplitItem:
    weight: float
    start: float
    end: float
    path: str
    range_text: str


def parse_group(text, where, implicit_name=None):
    """(name, [SplitItem]) of one group "NAME: W1 START:END PATH1, W2 START:END PATH2" as
    Megatron's parse_data_paths reads it (the name is everything before the first ':'; items are
    separated by ','; each is exactly three whitespace-separated fields); stricter: weights are
    finite numbers > 0 and 0 <= START < END <= 1. Every mistake is one UserError giving the
    character position (1-based). `implicit_name`: the name when the text has none (the mixture
    file's one-line "train" form)."""
    def fail(pos, problem):
        raise UserError(f"{where} {text!r}: character {pos + 1}: {problem}")

    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{where}: empty group (write \"NAME: WEIGHT START:END PATH, ...\")")
    first = text.split()[0]
    if implicit_name is not None and ":" not in first:
        name, body_at = implicit_name, 0
    else:
        colon = text.find(":")
        if colon < 0:
            fail(0, "no ':' after the group name (write \"NAME: WEIGHT START:END PATH, ...\"; config files go "
                    "before the flags)")
        name, body_at = text[:colon].strip(), colon + 1
        if not name:
            fail(0, "the group name before ':' is empty")
        if re.search(r"\s", name):
            fail(text.find(name), f"no ':' after the group name (the text before the first ':' is {name!r}; write "
                                  f"\"NAME: WEIGHT START:END PATH, ...\")")
        if "/" in name:
            fail(text.find(name), f"group name {name!r} must not contain '/' (it names metrics)")
    items, at = [], body_at
    for part in text[body_at:].split(","):
        fields = [(m.group(), at + m.start()) for m in re.finditer(r"\S+", part)]
        if len(fields) != 3:
            pos = fields[3][1] if len(fields) > 3 else fields[0][1] if fields else at
            got = f"{len(fields)} field{'s' * (len(fields) != 1)}" + (f" {part.strip()!r}" if fields else "")
            fail(pos, f"item {len(items) + 1} must be 'WEIGHT START:END PATH', got {got}")
        (w, w_at), (rng, r_at), (path, _) = fields
        try:
            weight = float(w)
        except ValueError:
            fail(w_at, f"weight {w!r} is not a number")
        if not math.isfinite(weight) or weight <= 0:
            fail(w_at, f"weight {w!r} must be a number > 0")
        bounds = rng.split(":")
        try:
            start, end = (float(b) for b in bounds) if len(bounds) == 2 else (None, None)
        except ValueError:
            start = end = None
        if start is None:
            fail(r_at, f"range {rng!r} must be START:END fractions such as 0:0.95")
        if not 0.0 <= start < end <= 1.0:
            fail(r_at, f"range {rng!r} needs 0 <= START < END <= 1")
        items.append(SplitItem(weight, start, end, path, rng))
        at += len(part) + 1
    return name, items


def read_groups_file(path, flag):
    """The groups of a `--*-weighted-split-paths-path` file: one line of space-separated
    double-quoted groups ("A: 1 0:1 P" "B: ..."), as Megatron's parse_data_paths_path reads it
    (a final newline is optional here)."""
    text = read_text(path, f"{flag} file")
    lines = text.splitlines()
    if len(lines) != 1:
        raise UserError(f"{flag} file {path}: holds {len(lines)} lines; Megatron's format is one line of "
                        f"space-separated quoted groups: \"NAME: W START:END PATH, ...\" \"NAME2: ...\"")
    line = lines[0]
    if len(line) < 2 or line[0] != '"' or line[-1] != '"':
        raise UserError(f"{flag} file {path}: the line must start and end with '\"' (quoted groups separated by "
                        f"single spaces), got {line[:60]!r}")
    return line[1:-1].split('" "')


def split_flag(split, path=False):
    return f"--{split}-weighted-split-paths" + ("-path" if path else "")


def group_texts(cfg):
    """{split: [(where, group text)]} of the weighted-split keys that are set (the -path files
    read); the keys are train/valid/test_weighted_split_paths[_path] (schema.py)."""
    out = {}
    for split in SPLITS:
        texts = cfg[f"{split}_weighted_split_paths"]
        file = cfg[f"{split}_weighted_split_paths_path"]
        if texts and file:
            raise UserError(f"give {split_flag(split)} or {split_flag(split, True)}, not both")
        if file:
            texts = read_groups_file(file, split_flag(split, True))
            label = f"{split_flag(split, True)} {file}"
        else:
            label = split_flag(split)
        if texts:
            out[split] = [(f"{label} group {i + 1}" if len(texts) > 1 else label, t) for i, t in enumerate(texts)]
    return out


TRAIN_GROUPS = Key("train_groups", "blend", "several --train-weighted-split-paths groups: blend = one blend of all their "
                   "items, each weight as given | one = refused, as Megatron asserts one train group",
                   choices=("blend", "one"))
declare_difference(TRAIN_GROUPS, original="one", family="t0",
                   behaviour="asserts exactly one training group ('Only 1 dataset group is allowed')",
                   source="bigscience-workshop/Megatron-DeepSpeed megatron/arguments.py:791")


def check_weighted_splits(cfg):
    """The weighted-split keys' rules: each group parses, names are unique per split, and they
    replace --mixture (Megatron: its two data-loading modes are mutually exclusive)."""
    texts = group_texts(cfg)
    if cfg["megatron_data_path"]:
        if texts or cfg["mixture"]:
            raise UserError("--data-path (with --split) is a third way to give the data: not with --mixture or the "
                            "--*-weighted-split-paths arguments (Megatron: they exclude each other)")
        data_path_items(cfg["megatron_data_path"])
        split_fractions(cfg["megatron_split"] or "969,30,1")
    elif cfg["megatron_split"]:
        raise UserError("--split goes with --data-path")
    if not texts:
        return
    if cfg["mixture"]:
        raise UserError("--mixture and the --*-weighted-split-paths arguments are two ways to give the data; use one")
    if "train" not in texts:
        raise UserError(f"{split_flag('valid')} / {split_flag('test')} need {split_flag('train')} "
                        f"(or {split_flag('train', True)})")
    if cfg["train_groups"] == "one" and len(texts["train"]) > 1:
        raise UserError(f"{split_flag('train')}: {len(texts['train'])} groups, but train_groups=one (Megatron "
                        f"asserts one training group: 'Only 1 dataset group is allowed'); put the items in one group")
    for split, entries in texts.items():
        names = [parse_group(t, where)[0] for where, t in entries]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise UserError(f"{split_flag(split)}: group name '{dup}' is used twice (names must be unique)")


# ---------------------------------------------------------------------- --data-path with --split (Megatron's option 1)

def split_fractions(text):
    """--split "969,30,1" (or "969/30/1") as Megatron reads it (dataset_utils.get_train_valid_test_split_):
    up to three numbers, padded with 0, normalised to sum 1."""
    parts = [p for p in text.replace("/", ",").split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise UserError(f"--split {text!r}: write up to three numbers, e.g. 969,30,1")
    if len(values) > 3 or any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise UserError(f"--split {text!r}: up to three numbers >= 0 with a positive sum, e.g. 969,30,1")
    values += [0.0] * (3 - len(values))
    return tuple(v / sum(values) for v in values)


def split_bounds(fractions, n):
    """The documents [b0, b1), [b1, b2), [b2, b3) of train / valid / test among n: cumulative
    int(round(f n)), then shifted so that the last bound is n (Megatron's rounding, exactly)."""
    bounds = [0]
    for f in fractions:
        bounds.append(bounds[-1] + int(round(f * float(n))))
    diff = bounds[-1] - n
    return [bounds[0]] + [b - diff for b in bounds[1:]]


def data_path_items(values):
    """(weight, prefix) pairs of --data-path: one PREFIX, or W1 PREFIX1 W2 PREFIX2 ..."""
    if len(values) == 1:
        return [(1.0, values[0])]
    if len(values) % 2:
        raise UserError(f"--data-path takes one PREFIX or pairs W1 PREFIX1 W2 PREFIX2 ..., got {len(values)} values")
    items = []
    for w, p in zip(values[::2], values[1::2]):
        try:
            weight = float(w)
        except ValueError:
            weight = -1.0
        if not math.isfinite(weight) or weight <= 0:
            raise UserError(f"--data-path: weight {w!r} (before {p}) must be a number > 0")
        items.append((weight, p))
    return items
