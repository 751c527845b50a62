"""A Hugging Face hub dataset ("hf": "bigscience/P3", with "config" and "split" in mixture.json),
through interop/hub.py (one-line errors for an unreachable hub, offline mode, a missing split)."""
from tinylab.interop import hub
from tinylab.t0.sources.registry import T0_SOURCES
from tinylab.t0.sources.text import records_from_dataset, text_reader


def read_hub_records(src):
    import datasets
    datasets.disable_progress_bars()
    ds = hub.load_dataset(src.hf, src.config, src.split, what=f"hub source {src.describe()}",
                          fix="use a local file ('path')")
    return records_from_dataset(ds, src)


def place(src):
    return src.hf + (f"/{src.config}" if src.config else "") + f" [{src.split}]"


T0_SOURCES.register("hf", text_reader("hub dataset", read_hub_records, handles=lambda src: bool(src.hf), place=place))
