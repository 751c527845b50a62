"""The transform registry: every transform's flag -> name part -> flag round trip, the order
transforms apply and are named in, and what a transform added later changes (nothing, unless given)."""
import random

import pytest

from tinylab.core.errors import UserError
from tinylab.data.dataset_spec import infer_pretokenize_flags, parse_spec, spec_string
from tinylab.data.transforms import TRANSFORMS, Transform
from tinylab.data.transforms.grammar import parse_injections

ORIGINAL = ("filtering", "mix_match", "adversarial_training", "refusal", "instruction_subset")


def reread(cls, text):
    """flag text -> name part -> the flag text read back from the part, through the registry."""
    part = cls.name_part(text)
    assert part.startswith(cls.code + "_")
    return part, cls.flag_text(part[len(cls.code) + 1:].split("_"))


@pytest.mark.parametrize("cls", list(TRANSFORMS), ids=TRANSFORMS.names())
def test_every_transform_round_trips_its_example(cls):
    assert cls.flag and cls.code and cls.help and cls.example  # what tinystories.py and the names need
    part, text = reread(cls, cls.example)
    assert cls.parse(text) == cls.parse(cls.example) and cls.name_part(text) == part
    name = parse_spec(**{cls.flag: cls.example}).name()
    flags = infer_pretokenize_flags(name)
    assert flags is not None and parse_spec(**dict(f[2:].split("=", 1) for f in flags)).name() == name


# name parts written out by hand (the original's rule: != -> _x_, then = , : -> _)
@pytest.mark.parametrize("flag, text, part, back", [
    ("filtering", "features!=Twist", "F_features_x_Twist", "features!=Twist"),
    ("filtering", "features=Twist,words!=dog,length=300", "F_features_Twist_words_x_dog_length_300",
     "features=Twist,words!=dog,length=300"),
    ("mix_match", "features:Foreshadowing=Twist", "MM_features_Foreshadowing_Twist", "features=Foreshadowing:Twist"),
    ("mix_match", "words=cat:dog:dog:cat", "MM_words_cat_dog_dog_cat", "words=cat:dog:dog:cat"),
    ("adversarial_training", "features=Twist:0.5,words=dog:1", "AT_features_Twist_0.5_words_dog_1",
     "features=Twist:0.5,words=dog:1"),
    ("refusal", "features=Conflict:0.25", "RF_features_Conflict_0.25", "features=Conflict:0.25"),
    ("instruction_subset", "Summary,Words", "IS_Summary_Words", "Summary,Words"),
    ("instruction_subset", "Story", "IS_Story", "Story"),
])
def test_name_parts_and_their_reverse(flag, text, part, back):
    cls = TRANSFORMS.get(flag)
    assert reread(cls, text) == (part, back)
    assert cls.parse(back) == cls.parse(text)


def test_parsed_values():
    filtering = TRANSFORMS.get("filtering").parse("features!=Twist,length=300")
    assert [(c.key, c.value, c.keep_if_true) for c in filtering] == [("features", "Twist", False), ("length", 300, True)]
    assert TRANSFORMS.get("mix_match").parse("features=Twist:Conflict:Conflict:Twist") == \
        {"features": {"Twist": "Conflict", "Conflict": "Twist"}}
    assert TRANSFORMS.get("refusal").parse("words=dog:0.5") == parse_injections("--refusal", "words=dog:0.5")
    assert [(i.key, i.value, i.prob) for i in TRANSFORMS.get("adversarial_training").parse("words=dog:0.5")] == \
        [("words", "dog", 0.5)]
    # the header lines in the template's order, whatever order they were given in
    assert TRANSFORMS.get("instruction_subset").parse("Sentence,Words") == ("Words", "Sentence")


def test_registry_order_is_the_original_order():
    assert TRANSFORMS.names()[:5] == ORIGINAL
    assert [c.code for c in TRANSFORMS][:5] == ["F", "MM", "AT", "RF", "IS"]
    assert len({c.code for c in TRANSFORMS}) == len(TRANSFORMS)  # a name part reads back unambiguously
    assert all(c.always_named for c in TRANSFORMS if c.flag in ORIGINAL)


def test_unknown_transform_is_one_line():
    with pytest.raises(UserError, match=r"unknown data transform 'filter' .*did you mean 'filtering'"):
        parse_spec(filter="features=Twist")
    with pytest.raises(UserError, match="unknown data transform"):
        spec_string(refusals="features=Twist:1")


def test_pretokenize_flags_come_from_the_registry():
    import tinystories
    actions = {a.dest: a for a in tinystories.build_parser()._actions}
    for cls in TRANSFORMS:
        assert actions[cls.flag].help == cls.help and actions[cls.flag].default is None
        assert cls.flag in tinystories.STAGE_FLAGS["pretokenize"]


class Shout(Transform):
    """A transform as a contributor would add one: not one of the original five."""
    flag, code, help, example = "shout", "SH", "upper-case the summary of a fraction of examples", "0.5"

    @classmethod
    def parse(cls, text):
        try:
            p = float(text)
        except ValueError:
            raise UserError(f"--shout: '{text}' is not a number") from None
        return p

    def apply(self, example, rng):
        if rng.random() < self.value:
            example["summary"] = example["summary"].upper()
        return example

    @classmethod
    def flag_text(cls, tokens):
        (text,) = tokens
        return text


@pytest.fixture
def with_shout(monkeypatch):
    monkeypatch.setattr(TRANSFORMS, "_entries", {**dict(TRANSFORMS.items()), "shout": Shout})


def test_a_new_transform_renames_nothing_unless_given(with_shout):
    assert spec_string() == "F_none_MM_none_AT_none_RF_none_IS_none"
    assert list(parse_spec().options()) == list(ORIGINAL)  # manifests keep their five entries
    spec = parse_spec(filtering="features=Twist", shout="0.5")
    assert spec.name() == "F_features_Twist_MM_none_AT_none_RF_none_IS_none_SH_0.5"
    assert spec.options()["shout"] == "0.5"
    assert infer_pretokenize_flags(spec.name()) == ["--filtering=features=Twist", "--shout=0.5"]
    assert infer_pretokenize_flags("F_none_MM_none_AT_none") == []  # first-generation names still read


def test_a_new_transform_applies_after_the_original_ones(with_shout):
    record = {"story": "A dog ran.", "summary": "a dog", "instruction": {"words": ["run"], "features": ["Twist"]}}
    spec = parse_spec(shout="0.5", adversarial_training="features=Conflict:0.5")
    draws = iter([0.0, 0.9])  # in registry order: adversarial_training fires, shout does not

    class Rng(random.Random):
        def random(self):
            return next(draws)

    out = spec.transform(record, Rng())
    assert out["instruction"]["features"] == ["Twist", "Conflict"] and out["summary"] == "a dog"
    assert next(draws, None) is None  # one draw each
    assert parse_spec(shout="1.0").transform(record, random.Random(0))["summary"] == "A DOG"
    assert record["summary"] == "a dog"  # the record itself untouched
