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
            cfg["mixing"], cfg["too_long_examples"], cfg["valid_groups"], cfg["loss_normalization"]) == (
        "from_first_item", False, "one", "next_fit", "row", "close_row", "blended", "token_microbatch")
    # --norm-target-loss (BLOOMZ) is the user's choice: compat keeps it
    assert FINETUNE_T0.prepare(dict(FINETUNE_T0.defaults(), compat="original", megatron_norm_target_loss=True))[
        "loss_normalization"] == "example"
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


def megatron_rows(lengths, weights, row_len, seed, n_rows):
    """Each source's rows as _build_sample_idx makes them over our epoch-0 shuffle (all its
    examples, too-long ones included), blended as BlendableDataset."""
    per_source = []
    for s, ls in enumerate(lengths):
        order = np.random.default_rng([seed, 11, s, 0]).permutation(len(ls)).tolist()  # _EpochOrder, epoch 0
        per_source.append([[(s, order[k]) for k in range(a, b)] for a, b in build_sample_idx(ls, order, row_len)])
    taken, out = [0] * len(lengths), []
    for d in blending_indices(weights, n_rows):
        out.append(per_source[d][taken[d]])
        taken[d] += 1
    return out


def test_too_long_examples_close_the_open_row_as_megatron():
    """too_long_examples=close_row: an example longer than the row stays in the shuffled order; met,
    it closes the open row (decoder_packed_mtf_dataset.py:481-485, even with room left) and is
    skipped (488-495). Dropping them before packing (the default) gives other rows."""
    rng = np.random.default_rng(1)
    row_len, seed, weights = 97, 3, [2.0, 1.0]
    lengths = [rng.integers(5, 60, size=300), rng.integers(10, 90, size=200)]
    for ls in lengths:  # about one example in eight is longer than the row
        ls[rng.random(len(ls)) < 0.125] = rng.integers(row_len + 1, 3 * row_len, size=1)
    ours = PackedStream(lengths, weights, row_len, seed, mixing="row", packing="next_fit", too_long="close_row")
    rows = ours.next_rows(150)
    want = megatron_rows(lengths, weights, row_len, seed, 150)
    assert rows == want
    assert all(lengths[s][i] <= row_len for row in rows for s, i in row)
    # rows closed by a too-long example (the next in their source's shuffle) with room for more
    order = np.random.default_rng([seed, 11, 0, 0]).permutation(len(lengths[0])).tolist()
    after = {a: b for a, b in zip(order, order[1:])}
    closed = [r for r in want if r[0][0] == 0 and lengths[0][after[r[-1][1]]] > row_len
              and sum(lengths[0][i] for _, i in r) + min(lengths[0]) <= row_len]
    assert closed, "the data must hold rows closed early"
    kept = [np.asarray(ls)[np.asarray(ls) <= row_len] for ls in lengths]
    assert PackedStream(kept, weights, row_len, seed, mixing="row", packing="next_fit").next_rows(150) != rows


def test_close_row_needs_next_fit_and_a_fitting_example():
    lengths = [np.array([5, 200, 7])]
    with pytest.raises(UserError, match="close_row is next-fit packing's"):
        PackedStream(lengths, [1], 64, 0, packing="best_fit", too_long="close_row")
    with pytest.raises(UserError, match="does not fit a row of 64"):
        PackedStream(lengths, [1], 64, 0, packing="next_fit")  # drop: the caller left them out
    with pytest.raises(UserError, match="at least one example that fits"):
        PackedStream([np.array([70, 80])], [1], 64, 0, packing="next_fit", too_long="close_row")
    with pytest.raises(UserError, match="close_row is next-fit packing's"):
        FINETUNE_T0.parse(["--model_dir=m", "--too_long_examples=close_row"])
    assert FINETUNE_T0.parse(["--model_dir=m", "--compat=original"])["too_long_examples"] == "close_row"


def test_too_long_examples_are_kept_for_the_packer(tmp_path):
    """close_row: T0Data keeps a too-long example in its place (counted as dropped_longer_than_row,
    not in examples / tokens); the stream meets it and never puts it in a row."""
    import json

    from conftest import TOK8192

    from tinylab.data.tokenizer import Tokenizer
    from tinylab.t0.encode import ExampleEncoder
    from tinylab.t0.finetune import T0Data
    records = [{"inputs": f"Question {i}?", "targets": "yes"} for i in range(6)]
    records[2]["inputs"] = " ".join(["word"] * 80)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    enc = ExampleEncoder(Tokenizer(TOK8192))
    kept, dropped = (T0Data([Source("t", path=str(path))], [], enc, 40, log=lambda *a: None, too_long=t).train[0]
                     for t in ("close_row", "drop"))
    assert len(kept) == 6 and len(dropped) == 5 and len(kept.ids[2]) > 40
    assert kept.stats == dropped.stats and (kept.stats["examples"], kept.stats["dropped_longer_than_row"]) == (5, 1)
    rows = PackedStream([kept.lengths()], [1], 40, 0, packing="next_fit", too_long="close_row").next_rows(12)
    assert all(i != 2 for row in rows for _, i in row)


def test_close_row_is_part_of_the_stream_identity():
    """A checkpoint's data position made with one too_long_examples does not resume with the other;
    drop (the earlier behaviour) leaves the identity as it was."""
    from tinylab.t0.options import PackingOptions
    cfg = {**FINETUNE_T0.defaults(), "max_seq_len": 128, "packing": "next_fit"}
    drop = PackingOptions.from_config(cfg).identity()
    assert "too_long_examples" not in drop
    assert PackingOptions.from_config(dict(cfg, too_long_examples="close_row")).identity() == dict(
        drop, too_long_examples="close_row")
