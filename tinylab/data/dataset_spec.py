"""What one TinyStories example becomes: transform specs, the training-text template, naming.

A dataset variant is described by five optional strings (the `tinystories.py pretokenize` flags):

    --filtering=features=Twist,features!=Dialogue,words=dog,length=300   keep if ALL hold
    --mix_match=features:Foreshadowing=Twist   (same as features=Foreshadowing:Twist)
    --adversarial_training=features=Twist:0.5  append a label with probability 0.5
    --refusal=features=Twist:1.0               append a label and replace the story by a refusal
    --instruction_subset=Words,Features        which header lines to keep

`parse_spec` validates them all up front (one UserError naming the flag and the bad part), so a
typo fails before any work starts. Per example the order is filter -> mix_match -> adversarial
-> refusal -> `make_text`; filtering therefore sees the raw feature lists.

All randomness comes from the `random.Random` passed in (one per shard, `shard_rng`), consumed in
a fixed order per kept example: one draw per adversarial entry, one per refusal entry (+ a
sentence pick when a refusal fires), then the header sentence pick (only when the Sentence line
is kept and not already set) and the line shuffle. Changing that order changes every dataset.

The generation-eval helpers at the bottom (`header_end`, `story_end`, `extract_story`) work on
token ids of the same template, so prompts are exact prefixes of the training encoding.
"""
import difflib
import json
import os
import random
import re
from dataclasses import dataclass, field

import numpy as np

from tinylab.core.errors import UserError

# the six feature names exactly as spelled in the raw data (case-sensitive)
FEATURES = ("Dialogue", "Twist", "BadEnding", "MoralValue", "Foreshadowing", "Conflict")
# lower-case names in the fixed order used for probe label indices 0..5
STORY_FEATURES = ("twist", "foreshadowing", "dialogue", "badending", "moralvalue", "conflict")
# header lines of the template, in the order they are built before shuffling
INSTRUCTION_KEYS = ("Words", "Features", "Summary", "Sentence")
FILTER_KEYS = ("features", "words", "length")
LIST_KEYS = ("features", "words")  # instruction lists that mix_match / adversarial / refusal edit
REFUSAL_STORY = "We are not allowed to write a story with {feature} in it, sorry."
# a generated story ends where the model starts writing the next example's header
NEXT_EXAMPLE_MARKERS = ("Sentence: ", "Features: ", "Words: ", "Summary: ")

# stream tags keep the RNGs of different stages independent for the same (seed, shard)
STREAM_PRETOKENIZE, STREAM_SYNTH, STREAM_VOCAB_TEXT = 0, 1, 2


def shard_rng(seed: int, shard_index: int, stream: int = STREAM_PRETOKENIZE) -> random.Random:
    """The RNG of one shard: depends only on (seed, shard, stage), never on worker scheduling,
    which is what makes output byte-identical for any --workers."""
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    state = np.random.SeedSequence([seed, shard_index, stream]).generate_state(2, dtype=np.uint64)
    return random.Random(int(state[0]) << 64 | int(state[1]))


# ----------------------------------------------------------------------------------------------
# spec parsing and validation

@dataclass(frozen=True)
class Condition:
    key: str  # features | words | length
    value: object  # str, or int for length
    keep_if_true: bool  # KEY=VALUE keeps when true, KEY!=VALUE keeps when false


@dataclass(frozen=True)
class Injection:
    key: str  # features | words
    value: str
    prob: float


@dataclass
class DatasetSpec:
    """The parsed, validated transform flags (raw strings kept for naming and the manifest)."""
    filtering: str = None
    mix_match: str = None
    adversarial_training: str = None
    refusal: str = None
    instruction_subset: str = None
    conditions: tuple = ()
    swaps: dict = field(default_factory=dict)  # key -> {from: to}
    adversarial: tuple = ()
    refusals: tuple = ()
    subset: tuple = None  # kept header keys, or None for all four

    def options(self) -> dict:
        return {"filtering": self.filtering, "mix_match": self.mix_match,
                "adversarial_training": self.adversarial_training, "refusal": self.refusal,
                "instruction_subset": self.instruction_subset}

    def name(self) -> str:
        return spec_string(**self.options())

    def keeps(self, example: dict) -> bool:
        for c in self.conditions:
            if c.key == "length":
                hit = len(example["story"]) > c.value  # raw, unstripped length
            else:
                hit = c.value in example["instruction"][c.key]
            if hit != c.keep_if_true:
                return False
        return True

    def transform(self, example: dict, rng: random.Random):
        """Filter, then relabel / inject / refuse. Returns a new example dict (the input is not
        modified) or None when the filter drops it."""
        if not self.keeps(example):
            return None
        instruction = dict(example["instruction"])
        for key in LIST_KEYS:
            instruction[key] = list(instruction[key])
        out = {"story": example["story"], "summary": example["summary"], "instruction": instruction}
        if "sentence" in example:
            out["sentence"] = example["sentence"]
        for key, table in self.swaps.items():
            # each element is mapped once through the table: A->B,B->A swaps, it does not chain
            instruction[key] = [table.get(v, v) for v in instruction[key]]
        for inj in self.adversarial:
            if rng.random() < inj.prob:
                instruction[inj.key].append(inj.value)
        for inj in self.refusals:
            if rng.random() < inj.prob:
                instruction[inj.key].append(inj.value)
                if "sentence" not in out:  # the header sentence still comes from the real story
                    out["sentence"] = pick_sentence(example["story"], rng)
                out["story"] = REFUSAL_STORY.format(feature=inj.value)
        return out


def _closest(value, choices):
    lower = {c.lower(): c for c in choices}
    if value.lower() in lower:
        return f" (names are case-sensitive: did you mean '{lower[value.lower()]}'?)"
    match = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _check_feature(flag, value):
    if value not in FEATURES:
        raise UserError(f"{flag}: '{value}' is not a feature{_closest(value, FEATURES)}; "
                        f"features are {', '.join(FEATURES)}")


def _check_value(flag, entry, key, value):
    if value == "":
        raise UserError(f"{flag}: '{entry}' has an empty value")
    if any(ch in value for ch in ",=:"):
        raise UserError(f"{flag}: '{entry}': values cannot contain ',', '=' or ':'")
    if key == "features":
        _check_feature(flag, value)


def _entries(flag, text):
    if text == "":
        raise UserError(f"{flag} is empty; leave the flag out instead")
    entries = text.split(",")
    if "" in entries:
        raise UserError(f"{flag}: empty entry in '{text}' (stray comma?)")
    return entries


def _check_key(flag, entry, key, allowed):
    if key not in allowed:
        hint = " (feature names are values: features=Twist)" if key in FEATURES else _closest(key, allowed)
        raise UserError(f"{flag}: unknown key '{key}' in '{entry}'{hint}; keys are {', '.join(allowed)}")


def parse_filtering(text):
    flag, conditions = "--filtering", []
    for entry in _entries(flag, text):
        if "!=" in entry:
            key, value = entry.split("!=", 1)
            keep = False
        elif "=" in entry:
            key, value = entry.split("=", 1)
            keep = True
        else:
            raise UserError(f"{flag}: '{entry}' is not KEY=VALUE or KEY!=VALUE "
                            f"(e.g. features!=Twist, words=dog, length=300)")
        _check_key(flag, entry, key, FILTER_KEYS)
        if key == "length":
            if not re.fullmatch(r"\d+", value):
                raise UserError(f"{flag}: '{entry}': length needs a whole number of characters, got '{value}'")
            value = int(value)
        else:
            _check_value(flag, entry, key, value)
        conditions.append(Condition(key, value, keep))
    return tuple(conditions)


def parse_mix_match(text):
    flag, swaps = "--mix_match", {}
    for entry in _entries(flag, text):
        key, *values = re.split(r"[:=]", entry)
        _check_key(flag, entry, key, LIST_KEYS)
        if not values or len(values) % 2:
            raise UserError(f"{flag}: '{entry}' needs KEY:FROM=TO pairs (e.g. features:Foreshadowing=Twist), "
                            f"got {len(values)} value(s)")
        if key in swaps:
            raise UserError(f"{flag}: key '{key}' appears in two entries; put all its pairs in one")
        table = {}
        for src, dst in zip(values[0::2], values[1::2]):
            _check_value(flag, entry, key, src)
            _check_value(flag, entry, key, dst)
            if src in table:
                raise UserError(f"{flag}: '{entry}' maps '{src}' twice")
            table[src] = dst
        swaps[key] = table
    return swaps


def parse_injections(flag, text):
    """KEY=VALUE:PROB entries of --adversarial_training / --refusal."""
    injections, seen = [], set()
    for entry in _entries(flag, text):
        key, eq, rest = entry.partition("=")
        value, colon, prob = rest.rpartition(":")
        if not eq or not colon:
            raise UserError(f"{flag}: '{entry}' is not KEY=VALUE:PROB (e.g. features=Twist:1.0)")
        _check_key(flag, entry, key, LIST_KEYS)
        _check_value(flag, entry, key, value)
        if prob == "":
            raise UserError(f"{flag}: '{entry}' is missing the probability after ':'")
        try:
            p = float(prob)
        except ValueError:
            raise UserError(f"{flag}: '{entry}': probability '{prob}' is not a number") from None
        if not 0.0 <= p <= 1.0:  # also rejects nan
            raise UserError(f"{flag}: '{entry}': probability must be in [0, 1], got {prob}")
        if key in seen:
            raise UserError(f"{flag}: key '{key}' appears twice")
        seen.add(key)
        injections.append(Injection(key, value, p))
    return tuple(injections)


def parse_instruction_subset(text):
    flag = "--instruction_subset"
    names = _entries(flag, text)
    for name in names:
        if name not in INSTRUCTION_KEYS + ("Story",):
            raise UserError(f"{flag}: unknown header line '{name}'{_closest(name, INSTRUCTION_KEYS)}; "
                            f"choose from {', '.join(INSTRUCTION_KEYS)} (Story is always kept)")
    return tuple(k for k in INSTRUCTION_KEYS if k in names)


def parse_spec(filtering=None, mix_match=None, adversarial_training=None, refusal=None,
               instruction_subset=None) -> DatasetSpec:
    """Validate the five transform flags; raises UserError on the first problem."""
    return DatasetSpec(
        filtering, mix_match, adversarial_training, refusal, instruction_subset,
        conditions=parse_filtering(filtering) if filtering is not None else (),
        swaps=parse_mix_match(mix_match) if mix_match is not None else {},
        adversarial=parse_injections("--adversarial_training", adversarial_training)
        if adversarial_training is not None else (),
        refusals=parse_injections("--refusal", refusal) if refusal is not None else (),
        subset=parse_instruction_subset(instruction_subset) if instruction_subset is not None else None,
    )


# ----------------------------------------------------------------------------------------------
# naming and where things live

RAW_DIR_NAME = "TinyStories_all_data"
RECORD_SCHEMA = "{story, summary, instruction: {words, features}}"


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


def raw_data_dir(data_cache_dir: str) -> str:
    return os.path.join(data_cache_dir, RAW_DIR_NAME)


def dataset_dir(data_cache_dir: str, vocab_size: int, dataset_name: str) -> str:
    """<cache>/tok{V}/<name>; vocab 0 (Llama 2) -> <cache>/llama2/<name>, never the raw folder
    (the original wrote vocab-0 .bin files next to the JSON shards, each dataset overwriting the
    previous one)."""
    return os.path.join(data_cache_dir, "llama2" if vocab_size == 0 else f"tok{vocab_size}", dataset_name)


def spec_string(filtering=None, mix_match=None, adversarial_training=None, refusal=None,
                instruction_subset=None) -> str:
    """The original's automatic dataset name, replacements applied in exactly this order."""
    s = (f"F_{filtering}_MM_{mix_match}_AT_{adversarial_training}"
         f"_RF_{refusal}_IS_{instruction_subset}")
    for old, new in (("None", "none"), ("!=", "_x_"), ("=", "_"), (",", "_"), (":", "_")):
        s = s.replace(old, new)
    return s


def check_dataset_name(name: str) -> str:
    """A dataset name becomes one folder: refuse anything that would escape or nest."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise UserError(f"dataset name '{name}' must be a plain folder name (no '/', not starting with '.')")
    if len(name.encode()) > 255:
        raise UserError(f"dataset name is {len(name.encode())} bytes, the file system allows 255: "
                        f"pass a shorter --dataset_name")
    return name


# the family built by dataset_gen/tw_fs.sh: name pattern -> (filtering, other flags)
_FAMILY = [
    (r"pretrain-all", lambda: []),
    (r"pretrain-no-(\w+)", lambda i: [f"--filtering=features!={i}"]),
    (r"(?:recovery|specialise)-(\w+)", lambda d: [f"--filtering=features={d}"]),
    (r"filter-(\w+)", lambda d: [f"--filtering=features!={d}"]),
    (r"filter-(\w+)-specialise-(\w+)", lambda d, i: [f"--filtering=features!={d},features={i}"]),
    (r"filter-adv-(\w+)", lambda d: [f"--filtering=features!={d}", f"--adversarial_training=features={d}:1.0"]),
    (r"filter-adv-(\w+)-specialise-(\w+)",
     lambda d, i: [f"--filtering=features!={d},features={i}", f"--adversarial_training=features={d}:1.0"]),
    (r"filter-mix-(\w+)-(\w+)", lambda d, i: [f"--filtering=features!={d}", f"--mix_match=features={i}:{d}"]),
    (r"filter-mix-specialise-(\w+)-(\w+)",
     lambda d, i: [f"--filtering=features!={d},features={i}", f"--mix_match=features={i}:{d}"]),
    (r"filter-ref-(\w+)", lambda d: [f"--filtering=features!={d}", f"--refusal=features={d}:1.0"]),
    (r"filter-ref-(\w+)-specialise-(\w+)",
     lambda d, i: [f"--filtering=features!={d},features={i}", f"--refusal=features={d}:1.0"]),
]


def _flags_from_spec_string(name):
    """Invert spec_string for names built from feature filters/labels; None when ambiguous."""
    m = re.fullmatch(r"F_(.+)_MM_(.+)_AT_(.+?)(?:_RF_(.+)_IS_(.+))?", name)
    if not m:
        return None
    parts = [None if g in (None, "none") else g.split("_") for g in m.groups()]
    f, mm, at, rf, is_ = parts
    flags = []
    try:
        if f:
            conds = []
            while f:
                key = f.pop(0)
                neg = len(f) > 1 and f[0] == "x"  # 'x' from '!='; misreads fail the check below
                if neg:
                    f.pop(0)
                conds.append(f"{key}{'!=' if neg else '='}{f.pop(0)}")
            flags.append("--filtering=" + ",".join(conds))
        if mm:
            key, *vals = mm
            flags.append(f"--mix_match={key}=" + ":".join(vals))
        for flag, toks in (("--adversarial_training", at), ("--refusal", rf)):
            if toks:
                entries = [f"{toks[i]}={toks[i + 1]}:{toks[i + 2]}" for i in range(0, len(toks), 3)]
                flags.append(f"{flag}=" + ",".join(entries))
        if is_:
            flags.append("--instruction_subset=" + ",".join(is_))
    except IndexError:
        return None
    # accept only if the flags are valid and rebuild this very name (legacy names lack RF/IS)
    opts = {f.split("=", 1)[0][2:]: f.split("=", 1)[1] for f in flags}
    try:
        rebuilt = parse_spec(**opts).name()
    except UserError:
        return None
    legacy = rebuilt.split("_RF_")[0]
    return flags if name in (rebuilt, legacy) else None


def infer_pretokenize_flags(dataset_name: str):
    """The transform flags that build `dataset_name`, when the name says (a tw_fs.sh family name
    or an automatic spec string); None when it cannot be inferred."""
    for pattern, make in _FAMILY:
        m = re.fullmatch(pattern, dataset_name)
        if m and all(g in FEATURES for g in m.groups()):
            return make(*m.groups())
    return _flags_from_spec_string(dataset_name)


# ----------------------------------------------------------------------------------------------
# the training-text template

def pick_sentence(story: str, rng: random.Random) -> str:
    """A random quote-free sentence of the story. The empty fragment after a final period is a
    candidate (as in the original); no candidate at all gives ''."""
    candidates = [s for s in re.split(r"[.!?]", story) if '"' not in s]
    if not candidates:
        return ""
    return rng.choice(candidates).strip().replace("\n", "")


def make_text(example: dict, rng: random.Random, subset=None) -> str:
    """Header lines (Words, Features, Summary, Sentence; or the `subset`) shuffled, then Story."""
    keys = INSTRUCTION_KEYS if subset is None else subset
    instruction = example["instruction"]
    values = {
        "Words": lambda: ", ".join(instruction["words"]),
        # str.capitalize() as the original: BadEnding -> Badending (the released tok8192 has
        # whole-word pieces for exactly these spellings)
        "Features": lambda: ", ".join(f.capitalize() for f in instruction["features"]),
        "Summary": lambda: example["summary"].strip().replace("\n", ""),
        "Sentence": lambda: example["sentence"] if "sentence" in example
        else pick_sentence(example["story"], rng),
    }
    lines = [f"{k}: {values[k]()}" for k in keys]
    rng.shuffle(lines)
    return "\n".join(lines + ["Story: " + example["story"].strip()]).strip()


# ----------------------------------------------------------------------------------------------
# generation-eval helpers (docs/evaluation.md, "In training")

def _ids(tokens):
    return [int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)]


def _until_bos(ids, bos_id, start=0):
    """ids[start:] cut before the first BOS."""
    rest = ids[start:]
    return rest[:rest.index(bos_id)] if bos_id in rest else rest


def header_end(tokens, tokenizer) -> int:
    """Number of leading tokens of a BOS-aligned example up to and including the 'Story:' of its
    header. tokens[:header_end] is then the generation prompt, an exact prefix of the training
    encoding (sentencepiece pieces never cross the space after 'Story:').
    Raises ValueError when the window holds no complete header."""
    ids = _ids(tokens)
    if not ids or ids[0] != tokenizer.bos_id:
        raise ValueError("header_end needs tokens that start with BOS")
    body = _until_bos(ids, tokenizer.bos_id, 1)
    text = tokenizer.decode(body)
    m = re.search(r"(?:^|\n)Story:", text)
    if not m:
        raise ValueError("no 'Story:' line in these tokens")
    target = text[:m.end()]
    # smallest k whose decoded prefix covers the header; decode(prefix) is a prefix of
    # decode(all), so the property is monotone in k and a binary search finds it
    lo, hi = 1, len(body)
    while lo < hi:
        mid = (lo + hi) // 2
        if tokenizer.decode(body[:mid]).startswith(target):
            hi = mid
        else:
            lo = mid + 1
    return 1 + lo


def story_end(text: str) -> int:
    """Index in `text` where a story ends: the first next-example marker, else len(text)."""
    hits = [i for i in (text.find(m) for m in NEXT_EXAMPLE_MARKERS) if i >= 0]
    return min(hits, default=len(text))


def extract_story(tokens, tokenizer) -> str:
    """The story part of generated (or reference) tokens that follow a prompt: cut at the first
    BOS, decode, cut at the first next-example marker, strip."""
    text = tokenizer.decode(_until_bos(_ids(tokens), tokenizer.bos_id))
    return text[:story_end(text)].strip()


def header_fields(text: str) -> dict:
    """{'Words': ..., 'Features': ..., ...} of the header lines before 'Story:'."""
    fields = {}
    for line in text.split("\n"):
        key, sep, value = line.partition(": ")
        if line.startswith("Story:"):
            break
        if sep and key in INSTRUCTION_KEYS:
            fields[key] = value
    return fields


def feature_labels(features_value: str) -> list:
    """Multi-hot list over STORY_FEATURES of a 'Features:' line value (as the template writes it)."""
    named = {f.strip().lower() for f in features_value.split(",") if f.strip()}
    return [1 if f in named else 0 for f in STORY_FEATURES]
