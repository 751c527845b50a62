"""A dataset variant: the parsed transform flags of `tinystories.py pretokenize`, what they do to
one example, and the dataset's name.

    --filtering=features=Twist,features!=Dialogue,words=dog,length=300   keep if ALL hold
    --mix_match=features:Foreshadowing=Twist   (same as features=Foreshadowing:Twist)
    --adversarial_training=features=Twist:0.5  append a label with probability 0.5
    --refusal=features=Twist:1.0               append a label and replace the story by a refusal
    --instruction_subset=Words,Features        which header lines to keep

The transforms themselves are the registry's (tinylab/data/transforms/: one module each, in the
order they apply). `parse_spec` validates every flag up front (one UserError naming the flag and
the bad part), so a typo fails before any work starts.

A dataset's automatic name is the original's spec string, one part per transform, e.g.
F_features_x_Twist_MM_none_AT_features_Twist_1.0_RF_none_IS_none. `infer_pretokenize_flags`
reads the flags back from such a name, or from a name of the dataset_gen/tw_fs.sh family.
"""
import re

from tinylab.core.errors import UserError
from tinylab.data.records import FEATURES, LIST_KEYS
from tinylab.data.template import INSTRUCTION_KEYS
from tinylab.data.transforms import TRANSFORMS


def _working_copy(example: dict) -> dict:
    """What the transforms edit: the record's own dict and instruction lists, the raw record
    untouched (its other keys, e.g. source, are not needed further)."""
    instruction = dict(example["instruction"])
    for key in LIST_KEYS:
        instruction[key] = list(instruction[key])
    out = {"story": example["story"], "summary": example["summary"], "instruction": instruction}
    if "sentence" in example:
        out["sentence"] = example["sentence"]
    return out


class DatasetSpec:
    """The given transforms, parsed and validated, in registry order."""

    def __init__(self, transforms=()):
        self.transforms = tuple(transforms)
        for t in self.transforms:
            t.bind(self.transforms)

    def options(self) -> dict:
        """{flag: text} of the manifest and the rebuild command: the original's five flags always
        (None when not given), any other transform when given."""
        given = {t.flag: t.text for t in self.transforms}
        return {cls.flag: given.get(cls.flag) for cls in TRANSFORMS if cls.always_named or cls.flag in given}

    def name(self) -> str:
        return spec_string(**self.options())

    def legacy_name(self):
        """The first-generation name, which had no RF and IS parts: only for specs without them."""
        options = self.options()
        if any(v is not None for k, v in options.items() if k not in _FIRST_NAMED):
            return None
        return "_".join(TRANSFORMS.get(flag).name_part(options[flag]) for flag in _FIRST_NAMED)

    @property
    def header_keys(self) -> tuple:
        """The header lines the template writes for every example."""
        keys = INSTRUCTION_KEYS
        for t in self.transforms:
            keys = t.header_keys(keys)
        return keys

    def dropping_flags(self) -> str:
        """The given flags that can drop examples, as on the command line."""
        return " ".join(f"--{t.flag}={t.text}" for t in self.transforms if t.drops) or "the transforms"

    def transform(self, example: dict, rng):
        """The example after every transform, as a new dict (the input is not modified), or None
        when one of them drops it."""
        out = _working_copy(example)
        for t in self.transforms:
            out = t.apply(out, rng)
            if out is None:
                return None
        return out


def parse_spec(**options) -> DatasetSpec:
    """Validate the transform flags given as {flag: text} (None: not given); raises UserError on
    the first problem, checking the flags in registry order."""
    for flag in options:
        TRANSFORMS.get(flag)
    return DatasetSpec(cls(options[cls.flag]) for cls in TRANSFORMS if options.get(cls.flag) is not None)


def spec_string(**options) -> str:
    """The original's automatic dataset name: one part per transform, in registry order."""
    for flag in options:
        TRANSFORMS.get(flag)
    return "_".join(cls.name_part(options.get(cls.flag)) for cls in TRANSFORMS
                    if cls.always_named or options.get(cls.flag) is not None)


# ----------------------------------------------------------------------------------------------
# reading the flags back from a name

_FIRST_NAMED = ("filtering", "mix_match", "adversarial_training")  # the parts of the first-generation names

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


def _splits(name: str, classes: tuple):
    """Every way to read `name` as <code>_<value> parts of `classes` (in order, each part at
    most once), as [(class, value)], longer values first."""
    if not name:
        yield []
        return
    for i, cls in enumerate(classes):
        if not name.startswith(cls.code + "_"):
            continue
        rest, later = name[len(cls.code) + 1:], classes[i + 1:]
        ends = sorted({m.start() for c in later for m in re.finditer(f"(?=_{re.escape(c.code)}_)", rest)} |
                      {len(rest)}, reverse=True)
        for end in ends:
            if end == 0:
                continue
            for tail in _splits(rest[end + 1:], later):
                yield [(cls, rest[:end])] + tail


def _flags_from_spec_string(name):
    """Invert spec_string: the flags of the first reading of `name` that parses and names the
    same dataset again (legacy names lack the RF / IS parts); None when there is none."""
    for parts in _splits(name, tuple(TRANSFORMS)):
        try:
            options = {cls.flag: cls.flag_text(value.split("_")) for cls, value in parts if value != "none"}
            spec = parse_spec(**options)
        except (IndexError, UserError):
            continue
        if name in (spec.name(), spec.legacy_name()):
            return [f"--{flag}={text}" for flag, text in spec.options().items() if text is not None]
    return None


def infer_pretokenize_flags(dataset_name: str):
    """The transform flags that build `dataset_name`, when the name says (a tw_fs.sh family name
    or an automatic spec string); None when it cannot be inferred."""
    for pattern, make in _FAMILY:
        m = re.fullmatch(pattern, dataset_name)
        if m and all(g in FEATURES for g in m.groups()):
            return make(*m.groups())
    return _flags_from_spec_string(dataset_name)
