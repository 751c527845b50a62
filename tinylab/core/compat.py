"""The originals' behaviour on request: `compat=original`.

This project fixes some defects of the three codebases it follows (the TinyStories study's
train.py, allenai/staged-training's gpt_pretrain.py, Megatron-DeepSpeed's T0 scripts). Each fix
is a documented difference with a key of its own that switches the original behaviour back on,
declared next to the code it changes:

    ORIGINAL_ACCUMULATION = Key("accumulation", "fresh", "...", choices=("fresh", "repeat"))
    declare_difference(ORIGINAL_ACCUMULATION, original="repeat", family="study",
                       behaviour="every micro-step forwards the same batch",
                       source="RobertKirk/tinystories-wrappers train.py:290")

`compat=original` sets every difference of the program's family to its original value, except
the keys the user set (config file or --key=value), and says which once on stderr; `compat=fixed`
(the default) leaves every key at what the user or the defaults give. docs/originals.md lists the
differences in one table (tests/core/test_compat.py checks it against this registry).
"""
import sys
from dataclasses import dataclass

from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.core.registry import Registry

# the originals, by family: what `compat=original` reproduces for each program
FAMILIES = {
    "study": "RobertKirk/tinystories-wrappers (train.py, tinystories.py)",
    "staged": "allenai/staged-training (scripts/gpt_pretrain.py)",
    "t0": "bigscience-workshop/Megatron-DeepSpeed, branch t0loading (finetune_t0.py, megatron/data)",
}


@dataclass(frozen=True)
class Difference:
    key: str  # the key that switches it
    original: object  # the key's value that reproduces the original
    family: str  # a FAMILIES name
    behaviour: str  # what the original does
    source: str  # where: repository file:line


DIFFERENCES = Registry("documented difference from an original")


def declare_difference(key: Key, original, family: str, behaviour: str, source: str) -> Difference:
    """Register `key` as switching one documented difference; `original` must be a value the
    key accepts (checked here, at import, so a typo cannot reach a run)."""
    if family not in FAMILIES:
        raise ValueError(f"difference {key.name}: unknown family {family!r}")
    key.validate(key.convert(original, key.name), key.name)
    if original == key.default:
        raise ValueError(f"difference {key.name}: the original value {original!r} is the default")
    return DIFFERENCES.register(key.name, Difference(key.name, original, family, behaviour, source))


COMPAT = Key("compat", "fixed", "original = the program's original codebase's behaviour, defects included, for every "
             "difference docs/originals.md lists (each also has a key of its own; a key you set wins) | fixed",
             choices=("fixed", "original"))


def differences_of(family: str, keys=None) -> list:
    """The family's differences (those whose key is among `keys`, when given)."""
    return [d for d in DIFFERENCES if d.family == family and (keys is None or d.key in keys)]


def apply_compat(cfg: dict, defaults: dict, family: str, quiet: bool = False, given=None) -> dict:
    """A new config: with compat=original, each of `family`'s differences whose key this program
    has and the user did not set takes its original value. `given`: the keys the user set (the
    prepare step's `sources`: config files, --key=value, also a key set to its default value);
    without it a key whose value differs from its default counts as set."""
    out = dict(cfg)
    if cfg.get("compat", "fixed") != "original":
        return out
    if family not in FAMILIES:
        raise UserError(f"compat=original: no original is known for this program (family {family!r})")
    applied, kept = [], []
    for d in differences_of(family, cfg):
        user_set = d.key in given if given is not None else cfg[d.key] != defaults.get(d.key, cfg[d.key])
        if user_set:
            kept.append(f"{d.key}={cfg[d.key]!r}")
            continue
        out[d.key] = d.original
        applied.append(f"{d.key}={d.original!r}")
    if not quiet:
        text = ", ".join(applied) or "nothing to change"
        tail = f" (kept as set: {', '.join(kept)})" if kept else ""
        print(f"notice: compat=original ({FAMILIES[family].split(' (')[0]}): {text}{tail}", file=sys.stderr)
    return out
