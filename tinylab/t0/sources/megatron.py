"""A Megatron indexed prefix (<path>_inputs_document.{bin,idx} and <path>_targets_document.{bin,idx},
tinylab/t0/megatron.py): token ids as stored (BOS / EOS are whatever the files hold), no text, so
no rank classification. Any path no other kind reads (one that names no file) is such a prefix."""
import os

from tinylab.t0 import megatron as megatron_data
from tinylab.t0.overlap import ids_hash
from tinylab.t0.sources.registry import T0_SOURCES, SourceData, SourceReader


def read_indexed(src, vocab_size):
    """(input ids, target ids) views of a Megatron source's items [round(START n), round(END n))
    (Megatron's get_split_by_range_ rounds; json sources floor), checked by megatron_data.open_pair."""
    inputs, targets = megatron_data.open_pair(src.path, vocab_size, what=f"source {src.describe()}")
    n = len(targets)
    return [(inputs[i], targets[i]) for i in range(round(src.start * n), round(src.end * n))]


def read(src, encoder):
    """The range's items with a non-empty input and target, hashed by their ids."""
    pairs = read_indexed(src, encoder.tok.vocab_size)
    items = [k for k, (a, b) in enumerate(pairs) if len(a) and len(b)]
    return SourceData(pairs=[(pairs[k][0].tolist(), pairs[k][1].tolist()) for k in items],
                      hashes=[(ids_hash(*pairs[k]), None) for k in items], n_rows=len(pairs),
                      show=lambda i: f"item {items[i]} of its range")


T0_SOURCES.register("megatron", SourceReader(
    title="Megatron prefix", handles=lambda src: bool(src.path) and not os.path.isfile(src.path), read=read, fallback=True,
    place=lambda src: f"Megatron prefix {src.path}"))
