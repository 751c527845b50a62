"""The training-text template of one example, and the helpers that read it back.

    Words: sing, cat, loud            header lines, shuffled (--instruction_subset keeps some)
    Features: Dialogue, Badending
    Summary: A cat sings.
    Sentence: Once there was a cat
    Story: Once there was a cat. ...  always last

`make_text` consumes the shard's RNG after the transforms: the header sentence pick (only when
the Sentence line is kept and not already set) and the line shuffle. Changing that order changes
every dataset.

The generation-eval helpers (`header_end`, `story_end`, `extract_story`) work on token ids of
the same template, so prompts are exact prefixes of the training encoding; `header_fields` and
`feature_labels` read the header lines and the probes' 6-way target.
"""
import random
import re

from tinylab.data.records import STORY_FEATURES

# header lines of the template, in the order they are built before shuffling
INSTRUCTION_KEYS = ("Words", "Features", "Summary", "Sentence")
# a generated story ends where the model starts writing the next example's header
NEXT_EXAMPLE_MARKERS = ("Sentence: ", "Features: ", "Words: ", "Summary: ")


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
