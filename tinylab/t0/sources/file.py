"""A local json / jsonl / parquet file of records ("path": "rte_train.jsonl" in mixture.json)."""
import os

from tinylab.core.errors import UserError, first_line
from tinylab.t0.sources.registry import T0_SOURCES
from tinylab.t0.sources.text import records_from_dataset, text_reader

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}  # extension -> datasets' builder


def handles(src):
    return not src.hf and os.path.splitext(src.path)[1].lower() in FORMATS


def read_file_records(src):
    import datasets
    datasets.disable_progress_bars()
    if not os.path.isfile(src.path):
        raise UserError(f"source {src.describe()}: file {src.path} not found")
    if os.path.getsize(src.path) == 0:  # (the datasets library's own message is a bare StopIteration)
        raise UserError(f"source {src.describe()}: file {src.path} is empty")
    try:
        ds = datasets.load_dataset(FORMATS[os.path.splitext(src.path)[1].lower()], data_files=src.path, split="train")
    except Exception as e:
        raise UserError(f"source {src.describe()}: cannot read {src.path} ({first_line(e)})")
    return records_from_dataset(ds, src)


T0_SOURCES.register("file", text_reader("file", read_file_records, handles, extensions=tuple(FORMATS)))
