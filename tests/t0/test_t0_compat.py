"""compat=original for finetune_t0.py (docs/originals.md, T0 table): each difference against the
original's code path re-implemented here from Megatron-DeepSpeed t0loading (quoted line numbers)."""
import numpy as np
import pytest
from test_megatron_data import meg_write

from tinylab.core.errors import UserError
from tinylab.schema import FINETUNE_T0
from tinylab.t0.megatron import check_weighted_splits
from tinylab.t0.mixture import Source
from tinylab.t0.packing import PackedStream
from tinylab.t0.sources.megatron import read_indexed


def test_compat_original_sets_the_t0_keys(capsys):
    cfg = FINETUNE_T0.prepare(dict(FINETUNE_T0.defaults(), compat="original"))
    assert (cfg["megatron_range_reading"], cfg["overlap_check"], cfg["train_groups"], cfg["packing"],
            cfg["mixing"]) == ("from_first_item", False, "one", "next_fit", "row")
    assert "compat=original (bigscience-workshop/Megatron-DeepSpeed" in capsys.readouterr().err


def megatron_items(n, start, end):
    """get_split_by_range_ (dataset_utils.py:610-623) -> documents = np.arange(lo, hi)
    (decoder_packed_mtf_dataset.py:199); MTFDataset reads items 0 .. len(documents) - 1
    (_build_shuffle_idx over np.arange(nb_documents), mtf_dataset.py:53-54)."""
    lo, hi = [round(s * float(n)) for s in (start, end)]
    documents = np.arange(start=lo, stop=hi, step=1, dtype=np.int32)
    return list(range(len(documents)))


@pytest.mark.parametrize("n,start,end", [(1000, 0.95, 1.0), (10, 0.95, 1.0), (37, 0.2, 0.7), (8, 0.0, 0.5)])
def test_range_reads_from_the_first_item(tmp_path, n, start, end):
    prefix = str(tmp_path / "p")
    for field in ("inputs", "targets"):
        meg_write(f"{prefix}_{field}_document", [[[i + 1]] for i in range(n)], np.uint16)
    src = Source(name="p", path=prefix, start=start, end=end, range_reading="from_first_item")
    got = [int(b[0]) - 1 for _, b in read_indexed(src, 8192)]
    assert got == megatron_items(n, start, end)
    src.range_reading = "as_written"
    assert [int(b[0]) - 1 for _, b in read_indexed(src, 8192)] == list(range(round(start * n), round(end * n)))


def test_one_train_group():
    """arguments.py:791-793: `assert len(values) == 1` for --train-weighted-split-paths."""
    groups = ["A: 1 0:1 x", "B: 1 0:1 y"]

    def megatron_parse(values):
        assert len(values) == 1, "Only 1 dataset group is allowed to"
    with pytest.raises(AssertionError):
        megatron_parse(groups)
    base = dict(FINETUNE_T0.defaults(), train_weighted_split_paths=groups)
    with pytest.raises(UserError, match="Megatron asserts one training group"):
        check_weighted_splits(dict(base, train_groups="one"))
    megatron_parse(groups[:1])
    check_weighted_splits(dict(base, train_groups="one", train_weighted_split_paths=groups[:1]))
    check_weighted_splits(base)  # blend (the default): both groups are one blend


def build_sample_idx(sizes, document_ids, seq_length):
    """decoder_packed_mtf_dataset.py:464-497 (one epoch, row_offset 0): [start, end) of each full row."""
    row_length, full, start = 0, [], 0
    for end, doc in enumerate(document_ids):
        tok_len = sizes[doc]
        row_length = row_length + tok_len
        if row_length > seq_length:
            if end > start:
                full.append((start, end))
            start = end
            row_length = tok_len
            if tok_len > seq_length:
                start = end + 1
                row_length = 0
                continue
    return full


def blending_indices(weights, size):
    """helpers.cpp build_blending_indices: position i -> the source maximising w * max(i, 1) - taken."""
    w = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    taken, out = np.zeros(len(w), dtype=np.int64), []
    for i in range(size):
        d = int(np.argmax(w * max(i, 1) - taken))
        out.append(d)
        taken[d] += 1
    return out


def test_packing_and_blend_as_megatron():
    """packing=next_fit, mixing=row: each source's rows are Megatron's next-fit rows over the same
    shuffled order (ours: numpy default_rng, documented), blended row by row as BlendableDataset."""
    rng = np.random.default_rng(0)
    lengths = [rng.integers(5, 60, size=200), rng.integers(20, 120, size=150)]
    weights, row_len, seed = [1.0, 3.0], 129, 5
    stream = PackedStream(lengths, weights, row_len, seed, mixing="row", packing="next_fit")
    rows = stream.next_rows(120)
    per_source = []
    for s, ls in enumerate(lengths):
        order = np.random.default_rng([seed, 11, s, 0]).permutation(len(ls)).tolist()  # _EpochOrder, epoch 0
        per_source.append([[(s, order[k]) for k in range(a, b)] for a, b in build_sample_idx(ls, order, row_len)])
    taken = [0, 0]
    for row, d in zip(rows, blending_indices(weights, len(rows))):
        assert row == per_source[d][taken[d]]
        taken[d] += 1
