"""The T0 source kinds: one registry entry per kind of mixture source (a hub dataset, a local
file of records, a Megatron indexed prefix, ...), each registered by its own module in this
package. An entry says which sources it reads (`handles`) and reads one into SourceData, the same
for every kind: the (input ids, target ids) of each usable example before the length limits,
their content hashes for the overlap check, and the text records where the kind has text (rank
classification and --preprocess need those). finetune_t0.py, eval_rank.py and Source.kind ask
the registry; none of them names a kind.

    T0_SOURCES.register("file", text_reader("file", read_file_records, handles, extensions=(".jsonl", ...)))
    name, entry = find_reader(src)        # the kind that reads a Source; Source.kind is its name
"""
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from tinylab.core.errors import UserError
from tinylab.core.registry import Registry

T0_SOURCES = Registry("T0 source kind")


@dataclass
class SourceData:
    """One source as every kind gives it. pairs[i] are the (input ids, target ids) lists of usable
    example i (non-empty input and target), hashes[i] its (token-id hash, text hash) for the
    overlap check (None where the kind has no such content), show(i) how a message names it."""
    pairs: list
    hashes: list
    n_rows: int  # records / items read, the usable ones and the empty ones
    show: Callable
    records: list = field(default_factory=list)  # every text record read ([] for a kind without text)


@dataclass(frozen=True)
class SourceReader:
    """One kind of T0 source. `title`: what such a source is, in messages ("Megatron prefix");
    `handles(src)`: whether this kind reads the mixture source `src` (a Source);
    `read(src, encoder)`: its SourceData; `records(src)`: its text records (inputs,
    targets, answer_choices), None for a kind that holds token ids only; `extensions`: the file
    types it reads (for messages and source names); `fallback`: asked only when no other kind
    handles the source; `place(src)`: where the source is, for messages (default: its path)."""
    title: str
    handles: Callable
    read: Callable
    records: Optional[Callable] = None
    extensions: tuple = ()
    fallback: bool = False
    place: Optional[Callable] = None

    @property
    def gives_records(self) -> bool:
        """Whether the kind has text records (rank classification needs their answer_choices)."""
        return self.records is not None


def find_reader(src):
    """(name, entry) of the kind that reads `src`, or (None, None): the kinds that recognise a
    source by its form first, in registration order, then the fallbacks."""
    entries = T0_SOURCES.items()
    for name, entry in [e for e in entries if not e[1].fallback] + [e for e in entries if e[1].fallback]:
        if entry.handles(src):
            return name, entry
    return None, None


def reader_for(src) -> SourceReader:
    """The entry reading `src`; a path no kind reads is an unsupported file type."""
    entry = find_reader(src)[1]
    if entry is None:
        ext = os.path.splitext(src.path)[1].lower()
        raise UserError(f"source {src.describe()}: unsupported file type '{ext}' ({file_types()})")
    return entry


def file_extensions() -> set:
    """Every file extension a registered kind reads (".json", ".parquet", ...)."""
    return {ext for entry in T0_SOURCES for ext in entry.extensions}


def file_types() -> str:
    """The readable file types in words: "json, jsonl or parquet"."""
    names = sorted(ext.lstrip(".") for ext in file_extensions())
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def read_records(src):
    """The text records of a source of any kind that has them (dicts with 'inputs' and 'targets'
    strings and, when present, 'answer_choices')."""
    entry = reader_for(src)
    if not entry.gives_records:
        raise UserError(f"source {src.describe()} holds token ids, not text records")
    return entry.records(src)
