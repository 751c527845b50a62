"""Megatron-DeepSpeed's indexed datasets and weighted-split arguments (tinylab/t0/megatron.py),
against Megatron's own logic transcribed here from bigscience-workshop/Megatron-DeepSpeed
(branch t0loading): megatron/data/indexed_dataset.py (MMapIndexedDatasetBuilder, Index.writer,
MMapIndexedDataset) and megatron/arguments.py (parse_data_paths, parse_data_paths_path).
Bytes go both ways: Megatron's builder -> our reader, our writer -> Megatron's reader, and the
two writers' files are byte-identical."""
import struct

import numpy as np
import pytest

from tinylab.core.errors import UserError
from tinylab.schema import FINETUNE_T0
from tinylab.t0 import megatron as M

# ---------------------------------------------------------------------- Megatron's code, transcribed

MEG_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: float, 7: np.double, 8: np.uint16}


def meg_code(dtype):
    for k in MEG_DTYPES.keys():
        if MEG_DTYPES[k] == dtype:
            return k
    raise ValueError(dtype)


class MegBuilder:
    """MMapIndexedDatasetBuilder + MMapIndexedDataset.Index.writer (torch tensors -> lists)."""

    def __init__(self, out_file, dtype=np.int64):
        self._data_file = open(out_file, "wb")
        self._dtype = dtype
        self._sizes = []
        self._doc_idx = [0]

    def add_item(self, tensor):
        np_array = np.array(tensor, dtype=self._dtype)
        self._data_file.write(np_array.tobytes(order="C"))
        self._sizes.append(np_array.size)

    def end_document(self):
        self._doc_idx.append(len(self._sizes))

    def finalize(self, index_file):
        self._data_file.close()
        with open(index_file, "wb") as fout:
            fout.write(b"MMIDIDX\x00\x00")
            fout.write(struct.pack("<Q", 1))
            fout.write(struct.pack("<B", meg_code(self._dtype)))
            fout.write(struct.pack("<Q", len(self._sizes)))
            fout.write(struct.pack("<Q", len(self._doc_idx)))
            fout.write(np.array(self._sizes, dtype=np.int32).tobytes(order="C"))
            pointers = np.array(self._sizes, dtype=np.int64)  # get_pointers_with_total
            pointers *= self._dtype().itemsize
            np.cumsum(pointers, axis=0, out=pointers)
            if pointers.size > 1:  # exscan_from_cumsum_
                pointers[1:] = pointers[:-1]
            if pointers.size > 0:
                pointers[0] = 0
            fout.write(pointers.tobytes(order="C"))
            fout.write(np.array(self._doc_idx, dtype=np.int64).tobytes(order="C"))


def meg_write(prefix, docs, dtype):
    """docs: lists of items (lists of ids), as preprocess_data.py with --split-sentences writes them."""
    b = MegBuilder(prefix + ".bin", dtype=dtype)
    for doc in docs:
        for item in doc:
            b.add_item(item)
        b.end_document()
    b.finalize(prefix + ".idx")


def meg_read(prefix):
    """MMapIndexedDataset.Index.__init__ and MMapIndexedDataset.__getitem__(int)."""
    with open(prefix + ".idx", "rb") as stream:
        assert stream.read(9) == b"MMIDIDX\x00\x00"
        assert (1,) == struct.unpack("<Q", stream.read(8))
        dtype_code, = struct.unpack("<B", stream.read(1))
        dtype = MEG_DTYPES[dtype_code]
        length = struct.unpack("<Q", stream.read(8))[0]
        doc_count = struct.unpack("<Q", stream.read(8))[0]
        offset = stream.tell()
    buf = memoryview(np.memmap(prefix + ".idx", mode="r", order="C"))
    sizes = np.frombuffer(buf, dtype=np.int32, count=length, offset=offset)
    pointers = np.frombuffer(buf, dtype=np.int64, count=length, offset=offset + sizes.nbytes)
    doc_idx = np.frombuffer(buf, dtype=np.int64, count=doc_count, offset=offset + sizes.nbytes + pointers.nbytes)
    data = memoryview(np.memmap(prefix + ".bin", mode="r", order="C"))
    items = [np.frombuffer(data, dtype=dtype, count=int(s), offset=int(p)) for p, s in zip(pointers, sizes)]
    return dtype, sizes, pointers, doc_idx, items


def meg_parse_data_paths(values):
    """arguments.py parse_data_paths.__call__ (asserts and all)."""
    for v in values:
        prefix = ":".join(v.split(":")[1:])
        for d in prefix.split(","):
            assert len(d.split()) == 3
            start, end = d.split()[1].split(":")
            assert float(start) < float(end)
    names = [v.split(":")[0] for v in values]
    prefixes = [":".join(v.split(":")[1:]).strip() for v in values]
    weights = [[d.split()[0] for d in p.split(",")] for p in prefixes]
    splits = [[d.split()[1] for d in p.split(",")] for p in prefixes]
    paths = [[d.split()[2] for d in p.split(",")] for p in prefixes]
    return names, weights, splits, paths


def meg_parse_data_paths_path(path):
    with open(path) as fi:
        lines = fi.readlines()
        assert len(lines) == 1
        assert lines[0][-2:] == "\"\n" and lines[0][0] == "\""
        return lines[0][1:-2].split("\" \"")


# ---------------------------------------------------------------------- the format

DOCS = [[[5, 6, 7], [8]], [[9, 10, 11, 12]], [[]], [[1, 2], [3], [4, 4, 4, 4, 4]]]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint8])
def test_reader_reads_megatron_builder_bytes(tmp_path, dtype):
    prefix = str(tmp_path / "d")
    meg_write(prefix, DOCS, dtype)
    ds = M.IndexedDataset(prefix)
    items = [item for doc in DOCS for item in doc]
    _, sizes, pointers, doc_idx, _ = meg_read(prefix)
    assert len(ds) == len(items) == 7 and ds.dtype == np.dtype(dtype)
    assert ds.sizes.tolist() == sizes.tolist() == [len(i) for i in items]
    assert ds.pointers.tolist() == pointers.tolist() and ds.doc_idx.tolist() == doc_idx.tolist() == [0, 2, 3, 4, 7]
    assert [ds[i].tolist() for i in range(len(ds))] == items
    assert [x.tolist() for x in ds[1:4]] == items[1:4]
    assert ds.get(6, offset=1, length=3).tolist() == [4, 4, 4] and ds.get(2, offset=2).tolist() == [11, 12]
    # zero-copy: read-only views into the memory-mapped .bin
    assert not ds[0].flags.writeable and np.shares_memory(ds[0], ds._bin)
    assert ds.id_range() == (1, 12)


def test_writer_bytes_equal_megatrons_and_read_back_by_megatrons_reader(tmp_path):
    items = [[7, 8, 9], [1], [8191, 0, 3, 3], [2, 2]]
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    with open(ours + ".bin", "wb") as b, open(ours + ".idx", "wb") as i:
        M.write_items(b, i, items, M.best_fitting_dtype(8192))
    meg_write(theirs, [[it] for it in items], np.uint16)  # preprocess_data.py: one item per document
    for ext in (".bin", ".idx"):
        assert open(ours + ext, "rb").read() == open(theirs + ext, "rb").read()
    dtype, sizes, _, doc_idx, read = meg_read(ours)
    assert dtype == np.uint16 and [r.tolist() for r in read] == items and doc_idx.tolist() == [0, 1, 2, 3, 4]
    assert M.best_fitting_dtype(65499) == np.uint16 and M.best_fitting_dtype(65500) == np.int32


def _damage(prefix, fix):
    idx, bin_ = bytearray(open(prefix + ".idx", "rb").read()), bytearray(open(prefix + ".bin", "rb").read())
    idx, bin_ = fix(idx, bin_)
    open(prefix + ".idx", "wb").write(bytes(idx))
    open(prefix + ".bin", "wb").write(bytes(bin_))


@pytest.mark.parametrize("fix, file, fragment", [
    (lambda i, b: (b"XXIDIDX\x00\x00" + i[9:], b), ".idx", "not a Megatron MMapIndexedDataset index"),
    (lambda i, b: (b"TNTIDX\x00\x00" + i[8:], b), ".idx", "--dataset-impl mmap"),
    (lambda i, b: (i[:9] + struct.pack("<Q", 2) + i[17:], b), ".idx", "index version 2"),
    (lambda i, b: (i[:17] + bytes([9]) + i[18:], b), ".idx", "unknown dtype code 9"),
    (lambda i, b: (i[:17] + bytes([6]) + i[18:], b), ".idx", "float type"),
    (lambda i, b: (i[:-5], b), ".idx", "is truncated"),
    (lambda i, b: (i[:20], b), ".idx", "shorter than the 34-byte header"),
    (lambda i, b: (i, b[:-3]), ".bin", "shorter than its index says"),
])
def test_bad_index_or_data_file_is_one_error_naming_it(tmp_path, fix, file, fragment):
    prefix = str(tmp_path / "d")
    meg_write(prefix, DOCS, np.uint16)
    _damage(prefix, fix)
    with pytest.raises(UserError) as e:
        M.IndexedDataset(prefix)
    msg = str(e.value)
    assert fragment in msg and prefix + file in msg and "\n" not in msg


def test_pair_checks_files_counts_and_vocabulary(tmp_path):
    p = str(tmp_path / "rte")
    meg_write(p + "_inputs_document", [[[1, 2]], [[3]]], np.uint16)
    with pytest.raises(UserError, match="rte_targets_document.bin, .*rte_targets_document.idx not found"):
        M.open_pair(p)
    meg_write(p + "_targets_document", [[[4]]], np.uint16)
    with pytest.raises(UserError, match="has 2 items but .*has 1"):
        M.open_pair(p)
    meg_write(p + "_targets_document", [[[4]], [[9000]]], np.uint16)
    inputs, targets = M.open_pair(p, vocab_size=9001)
    assert targets[1].tolist() == [9000]
    with pytest.raises(UserError, match=r"rte_targets_document.bin holds token id 9000, outside the tokenizer's "
                                        r"vocabulary of 8192"):
        M.open_pair(p, vocab_size=8192)


# ---------------------------------------------------------------------- weighted-split groups

GOOD_GROUPS = ["NAME_ABC: 0.6 0:0.6 A, 0.3 0:1 B, 0.1 0:1 C", "B: 1 0.9:1 data/p2, 1 0:1 data/p3",
               "x:1 0.25:0.75 /abs/prefix"]


def test_groups_parse_as_megatron_parses_them(tmp_path):
    names, weights, splits, paths = meg_parse_data_paths(GOOD_GROUPS)
    for text, n, w, s, p in zip(GOOD_GROUPS, names, weights, splits, paths):
        name, items = M.parse_group(text, "--valid-weighted-split-paths")
        assert name == n.strip()
        assert [it.weight for it in items] == [float(x) for x in w]
        assert [it.range_text for it in items] == s
        assert [(it.start, it.end) for it in items] == [tuple(float(v) for v in r.split(":")) for r in s]
        assert [it.path for it in items] == p
    # the -path file: one line of quoted groups (Megatron needs the final newline; we accept both)
    f = tmp_path / "groups.txt"
    f.write_text('"' + '" "'.join(GOOD_GROUPS) + '"\n')
    assert M.read_groups_file(str(f), "--valid-weighted-split-paths-path") == meg_parse_data_paths_path(str(f))
    f.write_text('"' + '" "'.join(GOOD_GROUPS) + '"')
    assert M.read_groups_file(str(f), "--valid-weighted-split-paths-path") == GOOD_GROUPS


@pytest.mark.parametrize("text, pos, fragment", [
    ("A 1 0:1 P", 1, "no ':' after the group name"),
    ("A1 0:1 P", 1, "the text before the first ':' is 'A1 0'"),
    (": 1 0:1 P", 1, "name before ':' is empty"),
    ("A/B: 1 0:1 P", 1, "must not contain '/'"),
    ("A: x 0:1 P", 4, "weight 'x' is not a number"),
    ("A: 0 0:1 P", 4, "weight '0' must be a number > 0"),
    ("A: 1 0:1 P, -2 0:1 Q", 13, "weight '-2' must be a number > 0"),
    ("A: nan 0:1 P", 4, "must be a number > 0"),
    ("A: 1 0.5:0.2 P", 6, "needs 0 <= START < END <= 1"),
    ("A: 1 0:1.5 P", 6, "needs 0 <= START < END <= 1"),
    ("A: 1 0.5:0.5 P", 6, "needs 0 <= START < END <= 1"),
    ("A: 1 0-1 P", 6, "START:END fractions"),
    ("A: 1 a:b P", 6, "START:END fractions"),
    ("A: 1 0:1", 4, "item 1 must be 'WEIGHT START:END PATH', got 2 fields"),
    ("A: 1 0:1 P, 2 0:1", 13, "item 2 must be"),
    ("A: 1 0:1 P Q", 12, "got 4 fields"),
    ("A: 1 0:1 P,", 12, "item 2 must be 'WEIGHT START:END PATH', got 0 fields"),
])
def test_bad_group_names_the_character(text, pos, fragment):
    with pytest.raises(UserError) as e:
        M.parse_group(text, "--train-weighted-split-paths")
    assert str(e.value).startswith(f"--train-weighted-split-paths {text!r}: character {pos}: ")
    assert fragment in str(e.value)


# ---------------------------------------------------------------------- the command line

def test_megatron_spelling_beside_key_value(tmp_path):
    f = tmp_path / "valid.txt"
    f.write_text('"V1: 1 0.9:1 P1" "V2: 1 0.9:1 P2, 2 0:1 P3"\n')
    cfg = FINETUNE_T0.parse(["--model_dir=m", "--train-weighted-split-paths", "T: 1 0:0.9 P1, 2 0:0.9 P2",
                             "--valid-weighted-split-paths-path", str(f), "--test-weighted-split-paths", "X: 1 0:1 P4",
                             "Y: 1 0:1 P5", "--max_iters=3", "--preprocess=False"])
    assert cfg["train_weighted_split_paths"] == ["T: 1 0:0.9 P1, 2 0:0.9 P2"] and cfg["max_iters"] == 3
    assert cfg["valid_weighted_split_paths_path"] == str(f)
    assert cfg["test_weighted_split_paths"] == ["X: 1 0:1 P4", "Y: 1 0:1 P5"]
    groups = M.group_texts(cfg)
    assert [t for _, t in groups["valid"]] == ["V1: 1 0.9:1 P1", "V2: 1 0.9:1 P2, 2 0:1 P3"]
    assert groups["valid"][1][0] == f"--valid-weighted-split-paths-path {f} group 2"
    # the configurator's form too: one string is one group (no comma splitting), or a list
    a = FINETUNE_T0.parse(["--model_dir=m", "--train_weighted_split_paths=T: 1 0:0.9 P1, 2 0:0.9 P2"])
    b = FINETUNE_T0.parse(["--model_dir=m", "--train-weighted-split-paths=['T: 1 0:0.9 P1, 2 0:0.9 P2']"])
    assert a["train_weighted_split_paths"] == b["train_weighted_split_paths"] == cfg["train_weighted_split_paths"]
    c = FINETUNE_T0.parse(["--preprocess", "--input", "x.jsonl", "--output-prefix", "out/x", "--tokenizer_model=t"])
    assert c["preprocess"] is True and (c["input"], c["output_prefix"]) == ("x.jsonl", "out/x")


@pytest.mark.parametrize("argv, fragment", [
    (["--train-weighted-split-paths"], "--train-weighted-split-paths needs a value"),
    (["--train-weighted-split-paths", "--max_iters=3"], "needs a value"),
    (["--train-weighted-split-paths", "T: 1 0:1 P", "--mixture=m.json"], "two ways to give the data"),
    (["--valid-weighted-split-paths", "V: 1 0:1 P"], "need --train-weighted-split-paths"),
    (["--train-weighted-split-paths", "T: 1 0:1 P", "--valid-weighted-split-paths", "V: 1 0:1 P", "V: 2 0:1 Q"],
     "group name 'V' is used twice"),
    (["--train-weighted-split-paths", "T: 1 0:1 P", "--valid-weighted-split-paths", "V: 1 0:1 P", "W: x 0:1 Q"],
     "--valid-weighted-split-paths group 2 'W: x 0:1 Q': character 4: weight 'x' is not a number"),
    (["--train-weighted-split-paths", "T: 1 0:1 P", "--train-weighted-split-paths-path", "f.txt"], "not both"),
    (["--train-weighted-split-paths-path", "nope.txt"], "--train-weighted-split-paths-path file not found: nope.txt"),
    (["--preprocess", "--input=x.jsonl"], "--preprocess needs --input=FILE.jsonl and --output_prefix=PREFIX"),
    (["--output_prefix=o"], "are for --preprocess"),
])
def test_bad_megatron_arguments(argv, fragment):
    with pytest.raises(UserError, match=None) as e:
        FINETUNE_T0.parse(["--model_dir=m", *argv])
    assert fragment in str(e.value), str(e.value)


def test_groups_file_format_errors(tmp_path):
    f = tmp_path / "g.txt"
    for content, fragment in [('"A: 1 0:1 P"\n"B: 1 0:1 Q"\n', "holds 2 lines"), ("A: 1 0:1 P\n", "start and end with"),
                              ('"A: 1 0:1 P" "B 1 0:1 Q"\n', "group 2 'B 1 0:1 Q': character 1: no ':'")]:
        f.write_text(content)
        with pytest.raises(UserError) as e:
            FINETUNE_T0.parse(["--model_dir=m", f"--train-weighted-split-paths-path={f}"])
        assert fragment in str(e.value), str(e.value)
