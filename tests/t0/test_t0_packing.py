"""The best-fit packer of tinylab/t0/packing.py (packing="best_fit", docs/t0.md §4) without a model: best-fit
decreasing and the balanced row order against naive re-implementations, each chunk holding exactly
the next drawn examples, fill rates >= 0.95 on a long-tailed length distribution and on the demo
mixture, the mixture's proportions over every window of rows measured against next-fit, exact
resume at any row boundary (the stream and T0Batches), and its errors."""
import json
from fractions import Fraction

import numpy as np
import pytest
import torch
from conftest import TOK8192

from tinylab.core.errors import UserError
from tinylab.schema import FINETUNE_T0
from tinylab.t0.batches import T0Batches
from tinylab.t0.encode import Examples
from tinylab.t0.mixture import Source
from tinylab.t0.packing import PackedStream, _EpochOrder, balanced_order, best_fit_decreasing


def lognormal_lengths(n, row_len, seed, mean=None, sigma=1.0):
    """Long-tailed example lengths: lognormal with the given mean (default row_len / 6), cut at the row."""
    mean = mean or row_len / 6
    rng = np.random.default_rng(seed)
    x = np.ceil(rng.lognormal(np.log(mean) - sigma ** 2 / 2, sigma, n)).astype(np.int64)
    return np.clip(x, 1, row_len)


def mixed_sources(row_len=513, seed=1):
    """Three sources of very different lengths: long, short and long-tailed."""
    rng = np.random.default_rng(seed)
    return [rng.integers(150, 300, 3000), rng.integers(5, 40, 5000),
            np.clip(np.ceil(rng.lognormal(np.log(60), 1.0, 8000)), 1, row_len).astype(np.int64)]


# ---------------------------------------------------------------------- the two algorithms

def naive_best_fit_decreasing(sizes, row_len):
    """Textbook BFD: items longest first (stable), each into the open row with the least room that
    still holds it (the first such row on ties), else a new row."""
    order = sorted(range(len(sizes)), key=lambda j: -sizes[j])
    rows, room = [], []
    for j in order:
        fits = [r for r in range(len(rows)) if room[r] >= sizes[j]]
        if fits:
            r = min(fits, key=lambda r: (room[r], r))
            rows[r].append(j)
            room[r] -= sizes[j]
        else:
            rows.append([j])
            room.append(row_len - sizes[j])
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_best_fit_decreasing_equals_the_textbook_algorithm(seed):
    rng = np.random.default_rng(seed)
    row_len = int(rng.integers(20, 80))
    sizes = rng.integers(1, row_len + 1, int(rng.integers(1, 120)))
    rows, used = best_fit_decreasing(sizes, row_len)
    assert rows == naive_best_fit_decreasing(sizes.tolist(), row_len)
    assert sorted(j for r in rows for j in r) == list(range(len(sizes)))  # every item exactly once
    assert used == [int(sizes[r].sum()) for r in rows] and max(used) <= row_len
    assert best_fit_decreasing(np.zeros(0, dtype=np.int64), 10) == ([], [])


def exact_score(c, n, row, q):
    """|c + m_r - (n + n_r) q|^2 - |c - n q|^2 in exact fractions."""
    n_r = sum(row)
    new = sum((ci + mi - (n + n_r) * qi) ** 2 for ci, mi, qi in zip(c, row, q))
    old = sum((ci - n * qi) ** 2 for ci, qi in zip(c, q))
    return new - old


@pytest.mark.parametrize("seed", range(8))
def test_balanced_order_is_the_exact_greedy(seed):
    """Each row balanced_order places minimises the prefix's squared discrepancy exactly (in
    fractions; float rounding may only pick among rows tied to 1e-9), and it is a permutation."""
    rng = np.random.default_rng(seed)
    R, S = int(rng.integers(2, 40)), int(rng.integers(1, 7))
    m = rng.integers(0, 9, (R, S)) * (rng.random((R, S)) < 0.5)
    m[m.sum(1) == 0, 0] = 1
    order = balanced_order(m)
    assert sorted(order) == list(range(R))
    rows = m.tolist()
    tot = m.sum(0).tolist()
    q = [Fraction(t, sum(tot)) for t in tot]
    c, n, left = [0] * S, 0, set(range(R))
    for j in order:
        scores = {r: exact_score(c, n, rows[r], q) for r in left}
        best = min(scores.values())
        assert scores[j] - best <= Fraction(1, 10 ** 9) * max(1, abs(best)), (seed, j)
        left.remove(j)
        c = [ci + mi for ci, mi in zip(c, rows[j])]
        n += sum(rows[j])
    # a single column: nothing to balance, the given order stays
    assert balanced_order(np.ones((5, 1), dtype=np.int64)) == list(range(5))


# ---------------------------------------------------------------------- the stream

def chunks_of(stream, n_chunks):
    """The rows of the first n_chunks best-fit chunks of a one-packer stream."""
    packer, out = stream.packers[0], []
    while True:
        row = stream.next_row()
        if packer.chunk == n_chunks:
            return out
        if len(out) <= packer.chunk:
            out.append([])
        out[packer.chunk].append(row)


@pytest.mark.parametrize("mixing", ["example", "row"])
def test_each_chunk_holds_the_next_drawn_examples(mixing):
    """The best-fit chunks are the draw sequence cut into buffers: the same (source, example)
    pairs, in the same multiset, as next-fit's stream, which packs them in draw order."""
    lengths = [np.random.default_rng(s).integers(5, 60, n) for s, n in ((1, 13), (2, 70), (3, 200))]
    row_len, buffer = 100, 97
    best = PackedStream(lengths, [1, 3, 2], row_len, seed=5, mixing=mixing, buffer=buffer)
    nxt = PackedStream(lengths, [1, 3, 2], row_len, seed=5, mixing=mixing, packing="next_fit")
    if mixing == "example":
        got = chunks_of(best, 4)
        drawn = [ex for row in nxt.next_rows(400) for ex in row][:4 * buffer]
        for k, chunk in enumerate(got):
            assert sorted(ex for row in chunk for ex in row) == sorted(drawn[k * buffer:(k + 1) * buffer])
    else:  # each source packed on its own, rows single-source, row counts still Megatron's blend
        rows = best.next_rows(600)
        assert all(len({s for s, _ in row}) == 1 for row in rows)
        assert (np.abs(best.rows_used - best.weights * 600) <= 1).all()
        per_source = [[ex for row in rows for ex in row if ex[0] == s] for s in range(3)]
        for s, packer in enumerate(best.packers):  # whole chunks of the source's own epoch order
            order = _EpochOrder(len(lengths[s]), 5, s)
            whole = [(s, i) for i in order.take(packer.chunk * buffer).tolist()]
            current = [ex for row in packer.rows[:packer.given] for ex in row]  # a chunk under way
            assert sorted(per_source[s]) == sorted(whole + current)
            assert set(current) <= {(s, i) for i in order.take(buffer).tolist()}
    for row in best.next_rows(50):
        assert sum(int(lengths[s][i]) for s, i in row) <= row_len


def test_fill_rate_on_long_tailed_lengths():
    """>= 0.95 real tokens (measured ~0.998) on lognormal lengths with mean T/6, where next-fit
    reaches ~0.85; a larger buffer only fills better."""
    for row_len in (257, 1025):
        lengths = [lognormal_lengths(20000, row_len, seed=row_len)]
        fills = {}
        for packing, buffer in (("next_fit", 1), ("best_fit", 500), ("best_fit", 2000)):
            stream = PackedStream(lengths, [1.0], row_len, seed=0, packing=packing, buffer=buffer)
            stream.next_rows(3000)
            fills[packing, buffer] = stream.fill_rate()
        assert fills["best_fit", 2000] >= 0.99 and fills["best_fit", 500] >= 0.95, fills
        assert fills["best_fit", 2000] >= fills["best_fit", 500] > fills["next_fit", 1] + 0.08, fills


def test_fill_rate_on_the_demo_mixture(t0_setup):
    from tinylab.data.tokenizer import Tokenizer
    from tinylab.t0.encode import ExampleEncoder, tokenize_rows
    from tinylab.t0.mixture import load_mixture
    from tinylab.t0.sources import read_records
    mixture, _ = t0_setup
    sources, _ = load_mixture(mixture)
    enc = ExampleEncoder(Tokenizer(TOK8192))
    lengths = [tokenize_rows(s.name, read_records(s), enc, 257).lengths() for s in sources]
    weights = [s.weight for s in sources]
    fills = {}
    for packing in ("next_fit", "best_fit"):
        for mixing in ("example", "row"):
            stream = PackedStream(lengths, weights, 257, seed=0, mixing=mixing, packing=packing)
            stream.next_rows(1000)
            fills[packing, mixing] = stream.fill_rate()
    assert min(fills["best_fit", m] for m in ("example", "row")) >= 0.95, fills
    assert fills["best_fit", "example"] > fills["next_fit", "example"], fills


def window_deviations(rows, lengths, p_examples, p_tokens, window):
    """Per window of `window` consecutive rows: the largest |share - expected share| over the
    sources, of the window's examples and of its tokens."""
    ex_dev, tok_dev = [], []
    S = len(lengths)
    for start in range(0, len(rows) - window + 1, window):
        items = [ex for row in rows[start:start + window] for ex in row]
        src = np.array([s for s, _ in items])
        toks = np.array([lengths[s][i] for s, i in items], dtype=np.float64)
        ex = np.bincount(src, minlength=S) / len(items)
        tok = np.bincount(src, weights=toks, minlength=S) / toks.sum()
        ex_dev.append(np.abs(ex - p_examples).max())
        tok_dev.append(np.abs(tok - p_tokens).max())
    return np.array(ex_dev), np.array(tok_dev)


@pytest.mark.parametrize("seed", [0, 1])
def test_mixture_weights_hold_over_every_window_of_rows(seed):
    """The definition (docs/t0.md §4): over each window of 64 consecutive rows, the largest
    deviation of a source's share of the window's examples from its weight, and of its share of
    the tokens from w_s * mean length_s / sum, is no worse than next-fit's (whose rows are
    independent draws): in the mean over windows and in the worst window. Sources of very
    different lengths (long, short, long-tailed), where best-fit's rows are most unlike each other."""
    lengths = mixed_sources(seed=seed + 1)
    w = np.array([1.0, 2.0, 5.0])
    p = w / w.sum()
    mean_len = np.array([l.mean() for l in lengths])
    p_tok = p * mean_len / (p * mean_len).sum()
    dev = {}
    for packing in ("next_fit", "best_fit"):
        rows = PackedStream(lengths, w, 513, seed=seed, packing=packing).next_rows(64 * 100)
        dev[packing] = window_deviations(rows, lengths, p, p_tok, 64)
    (nf_ex, nf_tok), (bf_ex, bf_tok) = dev["next_fit"], dev["best_fit"]
    assert bf_ex.mean() <= nf_ex.mean() and bf_tok.mean() <= nf_tok.mean(), (bf_ex.mean(), nf_ex.mean(),
                                                                              bf_tok.mean(), nf_tok.mean())
    assert bf_ex.max() <= nf_ex.max() and bf_tok.max() <= nf_tok.max(), (bf_ex.max(), nf_ex.max(),
                                                                         bf_tok.max(), nf_tok.max())
    assert bf_ex.max() < 0.1 and bf_tok.max() < 0.1  # the stated tolerance
    # without the balanced order (the chunk's rows in a random order) the example shares are
    # worse than next-fit's: the order is what keeps the weights
    stream = PackedStream(lengths, w, 513, seed=seed)
    packer, shuffled = stream.packers[0], []
    while len(shuffled) < 64 * 100:
        stream.next_row()
        chunk = packer.rows
        perm = np.random.default_rng(packer.chunk).permutation(len(chunk))
        shuffled += [chunk[r] for r in perm]
        packer.given = len(chunk)
    assert window_deviations(shuffled, lengths, p, p_tok, 64)[0].mean() > nf_ex.mean()


@pytest.mark.parametrize("mixing", ["example", "row"])
def test_best_fit_resumes_exactly_at_any_row(mixing):
    lengths = [np.random.default_rng(s).integers(5, 40, n) for s, n in ((1, 13), (2, 29), (3, 300))]
    kwargs = dict(row_len=60, seed=9, mixing=mixing, buffer=50)
    ref = PackedStream(lengths, [1, 3, 2], **kwargs)
    first = len(chunks_of(PackedStream(lengths, [1, 3, 2], **kwargs), 1)[0]) if mixing == "example" else 5
    for cut in (0, 1, first - 1, first, first + 1, 57, 200):
        a = PackedStream(lengths, [1, 3, 2], **kwargs)
        a.next_rows(cut)
        state = json.loads(json.dumps(a.state_dict()))  # plain values only
        want = a.next_rows(120)
        b = PackedStream(lengths, [1, 3, 2], **kwargs)
        b.load_state_dict(state)
        assert b.next_rows(120) == want and b.fill_rate() == a.fill_rate() and b.rows == a.rows, cut
    assert ref.next_rows(10) == PackedStream(lengths, [1, 3, 2], **kwargs).next_rows(10)  # seeded
    assert PackedStream(lengths, [1, 3, 2], **{**kwargs, "seed": 10}).next_rows(10) != ref.next_rows(10)


def test_t0_batches_resume_exactly_with_best_fit():
    rng = np.random.default_rng(0)
    examples = []
    for name, n in (("a", 40), ("b", 90)):
        ex = Examples(name)
        for k in rng.integers(4, 30, n):
            ex.ids.append(rng.integers(3, 100, k).astype(np.int32))
            ex.n_input.append(int(rng.integers(1, k)))
        examples.append(ex)

    def batches():
        stream = PackedStream([e.lengths() for e in examples], [1, 2], 41, seed=3, buffer=64)
        return T0Batches(stream, examples, 2, 3, 0, 1, "example", True, "cpu", identity="x")

    ref = batches()
    for _ in range(7 * 3):  # 7 iterations of 3 micro-batches: the trainer saves at such a boundary
        next(ref)
    assert not ref.queue
    state = ref.state_dict()
    want = [next(ref) for _ in range(9)]
    resumed = batches()
    resumed.load_state_dict(state)
    for a, b in zip(want, [next(resumed) for _ in range(9)]):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k], k


def test_bad_packing_settings():
    lengths = [np.array([3, 4, 5])]
    with pytest.raises(UserError, match="packing must be one of best_fit, next_fit"):
        PackedStream(lengths, [1], 10, 0, packing="first_fit")
    with pytest.raises(UserError, match="pack_buffer must be an integer in"):
        PackedStream(lengths, [1], 10, 0, buffer=0)
    with pytest.raises(UserError, match="an example of 5 tokens does not fit a row of 4"):
        PackedStream(lengths, [1], 4, 0)
    base = ["--model_dir=m", "--mixture=x.json"]
    with pytest.raises(UserError, match="packing"):
        FINETUNE_T0.parse(base + ["--packing=first_fit"])
    for bad in ("0", "20001", "1.5"):
        with pytest.raises(UserError, match="pack_buffer"):
            FINETUNE_T0.parse(base + [f"--pack_buffer={bad}"])
    cfg = FINETUNE_T0.parse(base)
    assert (cfg["packing"], cfg["pack_buffer"]) == ("best_fit", 2000)


def test_stream_identity_of_earlier_runs_is_unchanged():
    """A checkpoint's data position is refused unless the stream identity matches: the keys added
    with best-fit (packing, pack_buffer, truncate_side) enter it only off their earlier behaviour,
    so a run started before them resumes with --packing=next_fit, and the default is refused."""
    import hashlib

    from tinylab.t0.finetune import T0Data
    data = T0Data.__new__(T0Data)  # only what identity() reads
    ex = Examples("a", ids=[np.zeros(10, dtype=np.int32)], n_input=[4], stats={"tokens": 10})
    data.train_sources, data.weights, data.train = [Source(name="a", path="a.jsonl")], [1.0], [ex]
    cfg = {**FINETUNE_T0.defaults(), "max_seq_len": 128, "packing": "next_fit"}
    earlier_keys = ["seed", "mixing", "max_seq_len", "pad_id", "add_bos", "target_space", "add_eos", "max_input_len",
                    "max_target_len", "truncation"]  # the identity's keys before this option existed
    earlier = hashlib.sha1(json.dumps({"cfg": {k: cfg[k] for k in earlier_keys}, "sources": [["a", 1.0, 1, 10]]},
                                      sort_keys=True).encode()).hexdigest()
    assert data.identity(cfg) == earlier
    others = [data.identity({**cfg, **over}) for over in (
        {"packing": "best_fit"}, {"packing": "best_fit", "pack_buffer": 1000}, {"truncate_side": "right"})]
    assert len({earlier, *others}) == 4
