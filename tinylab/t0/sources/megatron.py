"""A Megatron indexed prefix (<path>_inputs_document.{bin,idx} and <path>_targets_document.{bin,idx},
tinylab/t0/megatron.py): token ids as stored (BOS / EOS are whatever the files hold), no text, so
no rank classification. Any path no other kind reads (one that names no file) is such a prefix."""
import os

from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.t0 import megatron as megatron_data
from tinylab.t0.overlap import ids_hash
from tinylab.t0.sources.registry import T0_SOURCES, SourceData, SourceReader

RANGE_READING = Key("megatron_range_reading", "as_written", "a Megatron prefix's START:END (and --split part): "
                    "as_written = its items [round(START n), round(END n)) | from_first_item = as many items from item "
                    "0 (Megatron's MTFDataset: the START offset is lost, so 0.95:1 reads the first 5%)",
                    choices=("as_written", "from_first_item"))
declare_difference(RANGE_READING, original="from_first_item", family="t0",
                   behaviour="selects documents [round(START n), round(END n)) but MTFDataset then reads items "
                             "0 .. count-1: the START offset is lost",
                   source="bigscience-workshop/Megatron-DeepSpeed megatron/data/decoder_packed_mtf_dataset.py:292")


def item_range(src, n):
    """The items [lo, hi) a source reads of a prefix of n: [round(START n), round(END n)) (Megatron's
    get_split_by_range_ rounds; json sources floor), or --split's documents; with
    range_reading=from_first_item the same number of items from item 0, as MTFDataset reads them."""
    if src.split_part:
        fractions, k = src.split_part
        lo, hi = megatron_data.split_bounds(fractions, n)[k:k + 2]
    else:
        lo, hi = round(src.start * n), round(src.end * n)
    return (0, hi - lo) if src.range_reading == "from_first_item" else (lo, hi)


def read_indexed(src, vocab_size):
    """(input ids, target ids) views of a Megatron source's items (item_range), checked by
    megatron_data.open_pair."""
    inputs, targets = megatron_data.open_pair(src.path, vocab_size, what=f"source {src.describe()}")
    return [(inputs[i], targets[i]) for i in range(*item_range(src, len(targets)))]


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
