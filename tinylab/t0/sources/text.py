"""What the kinds of text sources share: records from a `datasets` table (P3's field names and
score-eval rows, the source's row range) and SourceData from records (encoded as training
encodes them, with their token-id and text hashes)."""
import math

from tinylab.core.errors import UserError
from tinylab.t0.encode import ExampleEncoder, encode_records, usable
from tinylab.t0.overlap import example_hash, ids_hash, show_text
from tinylab.t0.sources.registry import SourceData, SourceReader

FIELDS = (("inputs", "targets"), ("inputs_pretokenized", "targets_pretokenized"))  # P3's *_pretokenized


def records_from_dataset(ds, src):
    """The rows [floor(start n), floor(end n)) of a datasets.Dataset as records with 'inputs' and
    'targets' strings (P3's *_pretokenized fields accepted) and, when present, 'answer_choices'."""
    cols = set(ds.column_names)
    fields = next((f for f in FIELDS if set(f) <= cols and _is_text(ds, f[0])), None)
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


def text_source_data(rows, encoder: ExampleEncoder) -> SourceData:
    """SourceData of text records: the usable ones encoded, hashed by ids and by text."""
    ok, _ = usable(rows)
    pairs = encode_records(ok, encoder)
    hashes = [(ids_hash(a, b), example_hash(r["inputs"], r["targets"])) for (a, b), r in zip(pairs, ok)]
    return SourceData(pairs, hashes, len(rows), lambda i: show_text(ok[i]), rows)


def text_reader(title, records, handles, extensions=(), place=None) -> SourceReader:
    """The entry of a kind of text records: `records(src)` reads them, the rest is shared."""
    return SourceReader(title=title, handles=handles, read=lambda src, encoder: text_source_data(records(src), encoder),
                        records=records, extensions=extensions, place=place)
