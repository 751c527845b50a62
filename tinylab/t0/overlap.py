"""The train / evaluation overlap check, one for every kind of source: validation and test
examples must be held out, so an evaluation example whose content hash is among the training
examples' is refused, whatever files, hub datasets or Megatron prefixes the two come from.

Each example has a token-id hash (its input and target ids before the length limits: what
--preprocess writes into a Megatron prefix, so a prefix made from a jsonl file matches the file)
and, where the source has text, a text hash (inputs and targets up to surrounding whitespace).
The training hashes are the union of both kinds.
"""
import hashlib

import numpy as np

from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.core.errors import UserError

OVERLAP_CHECK = Key("overlap_check", True, "refuse validation / test data that shares examples or row ranges with "
                    "the training data (False: Megatron's behaviour, no check)")
declare_difference(OVERLAP_CHECK, original=False, family="t0",
                   behaviour="no check: its BLOOMZ validation files (0.950:1 of each training file) were scored on "
                             "training examples",
                   source="bigscience-workshop/Megatron-DeepSpeed megatron/data/decoder_packed_mtf_dataset.py:175")


def example_hash(inputs, targets):
    """The text hash of an example: its inputs and targets, surrounding whitespace ignored."""
    return hashlib.sha1((inputs.strip() + "\x00" + targets.strip()).encode()).hexdigest()


def ids_hash(inputs, targets):
    """The token-id hash of an example (independent of the ids' dtype)."""
    return hashlib.sha1(np.asarray(inputs, dtype=np.int64).tobytes() + b"|" +
                        np.asarray(targets, dtype=np.int64).tobytes()).hexdigest()


def check_overlap(train_hashes, where, hashes, show):
    """Refuse an evaluation source sharing examples with the training data. `hashes[i]` is the
    (token-id hash, text hash) of its example i (None where a source has no such content),
    `show(i)` how a message names that example, `where` the source."""
    shared = [i for i, hs in enumerate(hashes) if any(h is not None and h in train_hashes for h in hs)]
    if shared:
        first = shared[0]
        same = "inputs + targets" if hashes[first][1] in train_hashes else "input and target token ids"
        raise UserError(f"{where} shares {len(shared)} of {len(hashes)} examples with the training data (the same "
                        f"{same}, e.g. {show(first)}); it must be held out")


def check_hash_overlap(train_hashes, valid_name, valid_rows, what="validation group"):
    """check_overlap for plain text records ({"inputs", "targets"}), by their text hashes."""
    hashes = [(None, example_hash(r["inputs"], r["targets"])) for r in valid_rows]
    check_overlap(train_hashes, f"{what} '{valid_name}'", hashes, lambda i: show_text(valid_rows[i]))


def show_text(record):
    """An example in an overlap message: the start of its inputs."""
    return repr(record["inputs"].strip().replace("\n", " ")[:60])
