"""What a raw TinyStories record is, where records and datasets live, and the per-shard RNG.

    <data_cache_dir>/TinyStories_all_data/dataNN.json    raw shards (a JSON list of records)
    <data_cache_dir>/tok{V}/<dataset_name>/             a pretokenized dataset (llama2/ for V = 0)

A record is {story, summary, instruction: {words, features}} (+ an optional sentence); every
shard is checked record by record when it is read, so a malformed one is a one-line error that
names the shard and the record instead of a confusing failure later.
"""
import difflib
import glob
import json
import os
import random

import numpy as np

from tinylab.core.errors import UserError

# the six feature names exactly as spelled in the raw data (case-sensitive)
FEATURES = ("Dialogue", "Twist", "BadEnding", "MoralValue", "Foreshadowing", "Conflict")
# lower-case names in the fixed order used for probe label indices 0..5
STORY_FEATURES = ("twist", "foreshadowing", "dialogue", "badending", "moralvalue", "conflict")
LIST_KEYS = ("features", "words")  # the instruction's lists (the transforms edit them)
RECORD_SCHEMA = "{story, summary, instruction: {words, features}}"
RAW_DIR_NAME = "TinyStories_all_data"

# stream tags keep the RNGs of different stages independent for the same (seed, shard)
STREAM_PRETOKENIZE, STREAM_SYNTH, STREAM_VOCAB_TEXT = 0, 1, 2


def shard_rng(seed: int, shard_index: int, stream: int = STREAM_PRETOKENIZE) -> random.Random:
    """The RNG of one shard: depends only on (seed, shard, stage), never on worker scheduling,
    which is what makes output byte-identical for any --workers."""
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    state = np.random.SeedSequence([seed, shard_index, stream]).generate_state(2, dtype=np.uint64)
    return random.Random(int(state[0]) << 64 | int(state[1]))


def closest(value, choices) -> str:
    """' (did you mean ...?)' for a near miss of `choices`, '' when nothing is close."""
    lower = {c.lower(): c for c in choices}
    if value.lower() in lower:
        return f" (names are case-sensitive: did you mean '{lower[value.lower()]}'?)"
    match = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


def check_feature(flag, value):
    if value not in FEATURES:
        raise UserError(f"{flag}: '{value}' is not a feature{closest(value, FEATURES)}; "
                        f"features are {', '.join(FEATURES)}")


# ----------------------------------------------------------------------------------------------
# raw shards

def raw_data_dir(data_cache_dir: str) -> str:
    return os.path.join(data_cache_dir, RAW_DIR_NAME)


def raw_shards(data_cache_dir: str) -> list:
    folder = raw_data_dir(data_cache_dir)
    shards = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not shards:
        raise UserError(f"no raw shards in {folder}: run: python tinystories.py download "
                        f"--data_cache_dir={data_cache_dir} (real TinyStories) or python tinystories.py "
                        f"synthesize --data_cache_dir={data_cache_dir} (built-in procedural corpus)")
    return shards


def load_raw_shard(path: str) -> list:
    """The records of a raw shard (a JSON list), each checked by check_record."""
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except ValueError as e:  # (a UnicodeDecodeError is a ValueError too)
        raise UserError(f"corrupt JSON shard {path}: {' '.join(str(e).split())[:120]}") from None
    if not isinstance(data, list):
        raise UserError(f"corrupt JSON shard {path}: expected a list of stories, got {type(data).__name__}")
    for i, record in enumerate(data):
        check_record(record, path, i)
    return data


def check_record(record, path, i):
    """A one-line UserError naming the shard and record when a raw record does not follow the
    TinyStories schema (a `features` string would otherwise be read letter by letter)."""
    def bad(what):
        return UserError(f"{path}: record {i}: {what} (TinyStories records are {RECORD_SCHEMA})")
    if not isinstance(record, dict):
        raise bad(f"expected an object, got {type(record).__name__}")
    for key in ("story", "summary"):
        if not isinstance(record.get(key), str):
            raise bad(f"'{key}' should be a string, not {type(record.get(key)).__name__}")
    if "sentence" in record and not isinstance(record["sentence"], str):
        raise bad(f"'sentence' should be a string, not {type(record['sentence']).__name__}")
    instruction = record.get("instruction")
    if not isinstance(instruction, dict):
        raise bad(f"'instruction' should be an object, not {type(instruction).__name__}")
    for key in LIST_KEYS:
        value = instruction.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad(f"'instruction.{key}' should be a list of strings, not {value!r:.40}")


# ----------------------------------------------------------------------------------------------
# pretokenized datasets

MAX_VOCAB = 65536  # dataset .bin files store token ids as uint16


def dataset_dir(data_cache_dir: str, vocab_size: int, dataset_name: str) -> str:
    """<cache>/tok{V}/<name>; vocab 0 (Llama 2) -> <cache>/llama2/<name>, never the raw folder
    (the original wrote vocab-0 .bin files next to the JSON shards, each dataset overwriting the
    previous one)."""
    return os.path.join(data_cache_dir, "llama2" if vocab_size == 0 else f"tok{vocab_size}", dataset_name)


def check_dataset_name(name: str) -> str:
    """A dataset name becomes one folder: refuse anything that would escape or nest."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise UserError(f"dataset name '{name}' must be a plain folder name (no '/', not starting with '.')")
    if len(name.encode()) > 255:
        raise UserError(f"dataset name is {len(name.encode())} bytes, the file system allows 255: "
                        f"pass a shorter --dataset_name")
    return name
