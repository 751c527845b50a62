"""The shared grammar of transform flags: comma-separated entries of KEY=VALUE-like parts over
the instruction's lists, and the KEY=VALUE:PROB entries of the probabilistic transforms."""
from dataclasses import dataclass

from tinylab.core.errors import UserError
from tinylab.data.records import FEATURES, LIST_KEYS, check_feature, closest


def entries(flag, text):
    if text == "":
        raise UserError(f"{flag} is empty; leave the flag out instead")
    parts = text.split(",")
    if "" in parts:
        raise UserError(f"{flag}: empty entry in '{text}' (stray comma?)")
    return parts


def check_key(flag, entry, key, allowed):
    if key not in allowed:
        hint = " (feature names are values: features=Twist)" if key in FEATURES else closest(key, allowed)
        raise UserError(f"{flag}: unknown key '{key}' in '{entry}'{hint}; keys are {', '.join(allowed)}")


def check_value(flag, entry, key, value):
    if value == "":
        raise UserError(f"{flag}: '{entry}' has an empty value")
    if any(ch in value for ch in ",=:"):
        raise UserError(f"{flag}: '{entry}': values cannot contain ',', '=' or ':'")
    if key == "features":
        check_feature(flag, value)


@dataclass(frozen=True)
class Injection:
    key: str  # features | words
    value: str
    prob: float


def parse_injections(flag, text):
    """KEY=VALUE:PROB entries (e.g. --adversarial_training=features=Twist:0.5,words=dog:1.0)."""
    injections, seen = [], set()
    for entry in entries(flag, text):
        key, eq, rest = entry.partition("=")
        value, colon, prob = rest.rpartition(":")
        if not eq or not colon:
            raise UserError(f"{flag}: '{entry}' is not KEY=VALUE:PROB (e.g. features=Twist:1.0)")
        check_key(flag, entry, key, LIST_KEYS)
        check_value(flag, entry, key, value)
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


def injections_text(tokens):
    """KEY=VALUE:PROB entries back from a name's KEY_VALUE_PROB_... tokens."""
    return ",".join(f"{tokens[i]}={tokens[i + 1]}:{tokens[i + 2]}" for i in range(0, len(tokens), 3))
