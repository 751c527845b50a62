"""The kinds of T0 sources, one module each, registered in T0_SOURCES (sources/registry.py):
importing this package fills the registry. A new kind is one module here plus its import line."""
from tinylab.t0.sources import file, hf, megatron  # noqa: F401  (each registers its kind)
from tinylab.t0.sources.registry import T0_SOURCES, SourceData, SourceReader, find_reader, read_records, reader_for  # noqa: F401
