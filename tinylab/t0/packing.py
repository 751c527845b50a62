"""Packing T0 examples into rows (docs/t0.md §4): rows of `row_len` tokens from the weighted
mixture, best-fit decreasing over chunks of drawn examples in a weight-balanced row order (or
greedy next-fit), with exact resume from plain-int state; one seeded pass for validation rows;
rows to the token / segment / is-input arrays the batches are made of.

    stream = PackedStream([e.lengths() for e in examples], weights, row_len=L + 1, seed=1)
    rows = stream.next_rows(64)                                   # lists of (source, example)
    arrays = rows_to_arrays(rows, examples, L + 1)                 # token_ids, segment_ids, is_input
"""
import bisect

import numpy as np

from tinylab.core.errors import UserError

MIXINGS = ("example", "row")
PACKINGS = ("best_fit", "next_fit")
TOO_LONG = ("drop", "close_row")  # what next-fit packing does with an example longer than a row
MAX_PACK_BUFFER = 20_000  # balanced_order's integer sums stay exact far beyond this


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
    the row; the example that did not fit opens the next row (and may cross into a new epoch).
    With close_row (Megatron's _build_sample_idx), an example longer than a row closes the open
    row and is skipped; otherwise the stream holds no such example."""

    def __init__(self, next_example, length, row_len, close_row=False):
        self.next_example, self.length, self.row_len = next_example, length, row_len
        self.close_row = close_row
        self.carry, self.used = None, 0  # the example that opens the next row; tokens of the last row

    def next_row(self):
        items, used = [], 0
        while True:
            ex = self.carry if self.carry is not None else self.next_example()
            self.carry = None
            n = self.length(ex)
            if self.close_row and n > self.row_len:
                if items:
                    self.used = used
                    return items
                continue
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
    too_long="drop": no example may be longer than a row (the caller dropped them); "close_row"
    (next_fit only, Megatron's): such examples stay in the shuffled order, and each one met closes
    the open row and is skipped.
    Deterministic in (lengths, weights, row_len, seed, mixing, packing, buffer, too_long);
    state_dict() is plain ints.
    """

    def __init__(self, lengths, weights, row_len, seed, mixing="example", packing="best_fit", buffer=2000,
                 too_long="drop"):
        if mixing not in MIXINGS:
            raise UserError(f"mixing must be one of {', '.join(MIXINGS)}, not '{mixing}'")
        if packing not in PACKINGS:
            raise UserError(f"packing must be one of {', '.join(PACKINGS)}, not '{packing}'")
        if isinstance(buffer, bool) or not isinstance(buffer, int) or not 1 <= buffer <= MAX_PACK_BUFFER:
            raise UserError(f"pack_buffer must be an integer in [1, {MAX_PACK_BUFFER}], got {buffer!r}")
        if any(len(l) == 0 for l in lengths):
            raise UserError("every training source needs at least one example that fits the row")
        _check_lengths(lengths, row_len, packing, too_long)
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
            self.packers = [_NextFit(st.next, length, row_len, too_long == "close_row") for st in streams]
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


def _check_lengths(lengths, row_len, packing, too_long):
    if too_long not in TOO_LONG:
        raise UserError(f"too_long_examples must be one of {', '.join(TOO_LONG)}, not '{too_long}'")
    if too_long == "drop":
        longest = max(int(np.max(l)) for l in lengths)
        if longest > row_len:
            raise UserError(f"an example of {longest} tokens does not fit a row of {row_len}")
        return
    if packing != "next_fit":
        raise UserError("too_long_examples=close_row is next-fit packing's (Megatron's); set packing=next_fit, "
                        "or too_long_examples=drop")
    if any(int(np.min(l)) > row_len for l in lengths):
        raise UserError(f"every training source needs at least one example that fits a row of {row_len}")


def pack_once(lengths, row_len, seed):
    """One pass over one source's examples in a seeded order, next-fit packed (validation rows);
    an example longer than a row is left out."""
    rows, row, used = [], [], 0
    for i in np.random.default_rng([seed, 13]).permutation(len(lengths)).tolist():
        if lengths[i] > row_len:
            continue
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

