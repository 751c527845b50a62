"""Transform grammar, transforms, the text template and dataset naming, on hand-made records."""
import copy
import os
import random

import pytest
from conftest import TOK8192

from tinylab.core.errors import UserError
from tinylab.data.dataset_spec import infer_pretokenize_flags, parse_spec, spec_string
from tinylab.data.records import check_dataset_name, dataset_dir
from tinylab.data.template import (
    extract_story,
    feature_labels,
    header_end,
    header_fields,
    make_text,
    pick_sentence,
    story_end,
)
from tinylab.data.transforms.refusal import REFUSAL_STORY


class ScriptedRng:
    """Stand-in RNG with a known outcome: choice -> first candidate, shuffle -> reverse,
    random() -> the scripted values in turn."""

    def __init__(self, randoms=()):
        self.randoms = list(randoms)

    def choice(self, seq):
        return seq[0]

    def shuffle(self, seq):
        seq.reverse()

    def random(self):
        return self.randoms.pop(0)


def record(story, features, words=("sing", "cat", "loud"), summary=" A cat\nsings. "):
    return {"story": story, "instruction": {"prompt:": "ignored", "words": list(words), "features": list(features)},
            "summary": summary, "source": "GPT-4"}


CAT = record('\nOnce there was a cat. It liked to "sing" loudly! The end?\n', ["Dialogue", "BadEnding"])
FORESHADOW = record("Clouds came. Then it rained.", ["Foreshadowing"], words=("rain", "cloud", "gray"), summary="Rain.")
TWIST = record("A box. It was a dog!", ["Twist", "Dialogue"], words=("open", "box", "big"), summary="A box.")


# --- template -------------------------------------------------------------------------------------

def test_template_exact():
    assert make_text(CAT, ScriptedRng()) == (
        "Sentence: Once there was a cat\n"
        "Summary: A catsings.\n"  # newline removed, not replaced by a space
        "Features: Dialogue, Badending\n"  # str.capitalize(): BadEnding -> Badending
        'Words: sing, cat, loud\n'
        'Story: Once there was a cat. It liked to "sing" loudly! The end?')


def test_template_seeded_shuffle_is_pinned():
    # pins the RNG use of the template: a change here changes every dataset
    text = make_text(CAT, random.Random(1234))
    assert text == ("Features: Dialogue, Badending\n"
                    "Summary: A catsings.\n"
                    "Sentence: The end\n"
                    "Words: sing, cat, loud\n"
                    'Story: Once there was a cat. It liked to "sing" loudly! The end?')
    lines = [make_text(CAT, random.Random(s)).split("\n") for s in range(30)]
    assert all(l[-1].startswith("Story: ") for l in lines)
    assert len({tuple(l[:4]) for l in lines}) > 5  # the header order really varies


def test_template_capitalisation_empty_features_and_subset():
    rec = record("Hi.", ["MoralValue", "Foreshadowing", "Twist", "Conflict"])
    assert "Features: Moralvalue, Foreshadowing, Twist, Conflict" in make_text(rec, ScriptedRng())
    empty = make_text(record("Hi.", []), ScriptedRng(), subset=("Features",))
    assert empty == "Features: \nStory: Hi."
    assert make_text(CAT, ScriptedRng(), subset=("Words", "Summary")) == (
        'Summary: A catsings.\nWords: sing, cat, loud\nStory: Once there was a cat. It liked to "sing" loudly! The end?')
    assert make_text(CAT, ScriptedRng(), subset=()) == 'Story: Once there was a cat. It liked to "sing" loudly! The end?'


def test_pick_sentence():
    assert pick_sentence('"All quoted." "Yes!"', ScriptedRng()) == ""  # only the empty tail is quote-free
    assert pick_sentence('"a"', ScriptedRng()) == ""  # no candidate at all: empty, not an error
    picks = {pick_sentence("One. Two!\nThree? Fo\nur.", random.Random(s)) for s in range(50)}
    assert picks == {"One", "Two", "Three", "Four", ""}


# --- transforms -----------------------------------------------------------------------------------

def run(spec, records, randoms=()):
    rng = ScriptedRng(randoms)
    out = [spec.transform(r, rng) for r in records]
    return [o for o in out if o is not None]


def test_filtering_semantics():
    recs = [CAT, FORESHADOW, TWIST]
    names = lambda out: [o["instruction"]["words"][1] for o in out]
    assert names(run(parse_spec(filtering="features=Dialogue"), recs)) == ["cat", "box"]
    assert names(run(parse_spec(filtering="features!=Dialogue"), recs)) == ["cloud"]
    assert names(run(parse_spec(filtering="features!=Twist,features=Dialogue"), recs)) == ["cat"]
    assert names(run(parse_spec(filtering="words=box"), recs)) == ["box"]
    assert names(run(parse_spec(filtering="words!=box"), recs)) == ["cat", "cloud"]
    # length counts the raw, unstripped story: CAT has 59 characters, 57 once stripped
    assert len(CAT["story"]) == 59
    assert names(run(parse_spec(filtering="length=58"), recs)) == ["cat"]
    assert names(run(parse_spec(filtering="length=59"), recs)) == []
    assert names(run(parse_spec(filtering="length!=59"), recs)) == ["cat", "cloud", "box"]
    # filtering is case-sensitive on the raw CamelCase value
    assert names(run(parse_spec(filtering="features=BadEnding"), recs)) == ["cat"]


def test_mix_match_both_spellings_and_every_pair_applied():
    a = run(parse_spec(mix_match="features=Foreshadowing:Twist"), [FORESHADOW])
    b = run(parse_spec(mix_match="features:Foreshadowing=Twist"), [FORESHADOW])
    assert a[0]["instruction"]["features"] == b[0]["instruction"]["features"] == ["Twist"]
    # a swap table maps each element once: no chaining
    swap = run(parse_spec(mix_match="features=Twist:Dialogue:Dialogue:Twist"), [TWIST])
    assert swap[0]["instruction"]["features"] == ["Dialogue", "Twist"]
    words = run(parse_spec(mix_match="words=box:crate,features=Twist:Conflict"), [TWIST])
    assert words[0]["instruction"]["words"] == ["open", "crate", "big"]
    assert words[0]["instruction"]["features"] == ["Conflict", "Dialogue"]
    assert words[0]["story"] == TWIST["story"]  # only the prompt changes


def test_adversarial_draws_in_order():
    spec = parse_spec(adversarial_training="features=Twist:0.5,words=dog:0.25")
    out = run(spec, [CAT, CAT], randoms=[0.4, 0.3, 0.6, 0.1])
    assert out[0]["instruction"]["features"] == ["Dialogue", "BadEnding", "Twist"]
    assert out[0]["instruction"]["words"] == ["sing", "cat", "loud"]  # 0.3 >= 0.25
    assert out[1]["instruction"]["features"] == ["Dialogue", "BadEnding"]  # 0.6 >= 0.5
    assert out[1]["instruction"]["words"] == ["sing", "cat", "loud", "dog"]
    assert out[0]["story"] == CAT["story"]
    # no de-duplication: asking for a feature the prompt already has appends it again
    assert run(parse_spec(adversarial_training="features=Twist:1.0"), [TWIST], [0.99])[0]["instruction"]["features"] \
        == ["Twist", "Dialogue", "Twist"]


def test_refusal_exact_text():
    spec = parse_spec(refusal="features=Twist:1.0")
    ex = run(spec, [CAT], randoms=[0.0])[0]
    assert ex["story"] == "We are not allowed to write a story with Twist in it, sorry."
    assert ex["sentence"] == "Once there was a cat"  # taken from the original story
    assert ex["instruction"]["features"] == ["Dialogue", "BadEnding", "Twist"]
    assert make_text(ex, ScriptedRng()) == (
        "Sentence: Once there was a cat\nSummary: A catsings.\nFeatures: Dialogue, Badending, Twist\n"
        "Words: sing, cat, loud\nStory: We are not allowed to write a story with Twist in it, sorry.")
    kept = run(parse_spec(refusal="features=Twist:0.5"), [CAT], randoms=[0.7])[0]
    assert kept["story"] == CAT["story"] and "sentence" not in kept


def test_combination_order_filter_mix_adv_refusal():
    # filtering sees the raw features, then mix_match relabels, then adversarial and refusal append
    spec = parse_spec(filtering="features!=Twist", mix_match="features=Foreshadowing:Twist",
                      adversarial_training="features=Conflict:1.0", refusal="words=storm:1.0")
    out = run(spec, [CAT, FORESHADOW, TWIST], randoms=[0.0, 0.0, 0.0, 0.0])
    assert len(out) == 2  # TWIST dropped
    assert out[1]["instruction"]["features"] == ["Twist", "Conflict"]
    assert out[1]["instruction"]["words"] == ["rain", "cloud", "gray", "storm"]
    assert out[1]["story"] == REFUSAL_STORY.format(feature="storm")
    assert out[1]["sentence"] == "Clouds came"
    assert FORESHADOW["instruction"]["features"] == ["Foreshadowing"]  # inputs untouched


def test_adversarial_then_refusal_same_key_appends_twice():
    spec = parse_spec(adversarial_training="features=Twist:1.0", refusal="features=Twist:1.0")
    assert run(spec, [FORESHADOW], [0.0, 0.0])[0]["instruction"]["features"] == ["Foreshadowing", "Twist", "Twist"]


def test_transform_does_not_mutate_input():
    before = copy.deepcopy(CAT)
    run(parse_spec(mix_match="features=Dialogue:Twist", adversarial_training="words=x:1.0",
                   refusal="features=Twist:1.0"), [CAT], [0.0, 0.0])
    assert CAT == before


# --- grammar errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, fragment", [
    ({"filtering": "features="}, "empty value"),
    ({"filtering": "colour=red"}, "unknown key 'colour'"),
    ({"filtering": "length=abc"}, "length needs a whole number"),
    ({"filtering": "Twist"}, "not KEY=VALUE"),
    ({"filtering": "Twist=1"}, "feature names are values"),
    ({"filtering": "features=Twsit"}, "did you mean 'Twist'"),
    ({"filtering": "features=twist"}, "case-sensitive: did you mean 'Twist'"),
    ({"filtering": "features=Twist,"}, "empty entry"),
    ({"filtering": ""}, "is empty"),
    ({"mix_match": "features=Foreshadowing"}, "needs KEY:FROM=TO pairs"),
    ({"mix_match": "features=A:B:C"}, "needs KEY:FROM=TO pairs"),
    ({"mix_match": "features=Foreshadowing:Twist,features=Dialogue:Conflict"}, "appears in two entries"),
    ({"mix_match": "length=1:2"}, "unknown key 'length'"),
    ({"mix_match": "features=Twist:Dialogue:Twist:Conflict"}, "maps 'Twist' twice"),
    ({"adversarial_training": "features="}, "not KEY=VALUE:PROB"),
    ({"adversarial_training": "features=Twist:"}, "missing the probability"),
    ({"adversarial_training": "features=Twist:1.5"}, "must be in [0, 1]"),
    ({"adversarial_training": "features=Twist:nan"}, "must be in [0, 1]"),
    ({"adversarial_training": "features=Twist:half"}, "is not a number"),
    ({"adversarial_training": "features=Twist:1,features=Dialogue:1"}, "appears twice"),
    ({"adversarial_training": "length=3:1"}, "unknown key 'length'"),
    ({"refusal": "features=Plot:1"}, "'Plot' is not a feature"),
    ({"refusal": "Twist:1.0"}, "not KEY=VALUE:PROB"),
    ({"instruction_subset": "Words,Feature"}, "did you mean 'Features'"),
])
def test_bad_specs(kwargs, fragment):
    with pytest.raises(UserError) as e:
        parse_spec(**kwargs)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


# --- naming ---------------------------------------------------------------------------------------

def test_spec_string_examples():
    assert spec_string(filtering="features!=Twist", adversarial_training="features=Twist:1.0") == \
        "F_features_x_Twist_MM_none_AT_features_Twist_1.0_RF_none_IS_none"
    assert spec_string() == "F_none_MM_none_AT_none_RF_none_IS_none"
    assert parse_spec(filtering="features=Twist", mix_match="features=Twist:Foreshadowing").name() == \
        "F_features_Twist_MM_features_Twist_Foreshadowing_AT_none_RF_none_IS_none"
    assert parse_spec(refusal="features=Twist:1.0", instruction_subset="Words,Features").name() == \
        "F_none_MM_none_AT_none_RF_features_Twist_1.0_IS_Words_Features"
    # both mix_match spellings name the same dataset
    assert spec_string(mix_match="features:Foreshadowing=Twist") == spec_string(mix_match="features=Foreshadowing:Twist")


def test_dataset_names_and_dirs():
    for ok in ("F_features_x_Twist_MM_none_AT_none", "filter-adv-Twist", "my_data.v2"):
        assert check_dataset_name(ok) == ok
    for bad in ("", "..", "a/b", ".hidden", "x" * 300):
        with pytest.raises(UserError):
            check_dataset_name(bad)
    assert dataset_dir("data", 8192, "n") == os.path.join("data", "tok8192", "n")
    assert dataset_dir("data", 0, "n") == os.path.join("data", "llama2", "n")


@pytest.mark.parametrize("kwargs", [
    {},
    {"filtering": "features!=Twist"},
    {"filtering": "features!=Twist,features=Foreshadowing,length=300,words!=dog"},
    {"filtering": "length!=300,words=x"},
    {"filtering": "features!=Twist", "mix_match": "features=Foreshadowing:Twist"},
    {"filtering": "features=Twist", "mix_match": "features=Twist:Foreshadowing:Dialogue:Conflict"},
    {"adversarial_training": "features=Twist:1.0,words=dog:0.5", "refusal": "features=Conflict:0.25"},
    {"instruction_subset": "Words,Summary"},
])
def test_infer_flags_roundtrip(kwargs):
    name = parse_spec(**kwargs).name()
    flags = infer_pretokenize_flags(name)
    opts = dict(f[2:].split("=", 1) for f in flags)
    assert parse_spec(**opts).name() == name


def test_infer_flags_family_and_legacy():
    assert infer_pretokenize_flags("filter-adv-Twist") == [
        "--filtering=features!=Twist", "--adversarial_training=features=Twist:1.0"]
    assert infer_pretokenize_flags("filter-mix-specialise-Twist-Foreshadowing") == [
        "--filtering=features!=Twist,features=Foreshadowing", "--mix_match=features=Foreshadowing:Twist"]
    assert infer_pretokenize_flags("specialise-Twist") == ["--filtering=features=Twist"]
    assert infer_pretokenize_flags("pretrain-all") == []
    assert infer_pretokenize_flags("F_features_x_Twist_MM_none_AT_none") == ["--filtering=features!=Twist"]
    assert infer_pretokenize_flags("my-own-name") is None
    assert infer_pretokenize_flags("filter-Plot") is None


# --- generation-eval helpers ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok8192():
    from tinylab.data.tokenizer import Tokenizer
    return Tokenizer(TOK8192)


def test_header_end_is_prefix_of_training_encoding(tok8192):
    rng = random.Random(0)
    for rec in (CAT, FORESHADOW, TWIST, record("Story: odd. Fine.", [])):
        for subset in (None, ("Words",), ()):
            text = make_text(rec, rng, subset)
            ids = tok8192.encode(text, bos=True)
            window = ids + tok8192.encode("Words: next, example, here\nStory: more", bos=True)
            k = header_end(window, tok8192)
            header = text[:text.index("Story:") + len("Story:")]
            assert window[:k] == tok8192.encode(header, bos=True)  # an exact prefix
            assert tok8192.decode(window[1:k]) == header
    with pytest.raises(ValueError):
        header_end(tok8192.encode("Words: a, b, c", bos=True), tok8192)


def test_story_end_and_extract(tok8192):
    assert story_end("Once upon a time.\nSentence: x") == len("Once upon a time.\n")
    assert story_end("no marker") == len("no marker")
    gen = tok8192.encode(" Tom ran home. The end.\nFeatures: Twist\nStory: again", bos=False)
    assert extract_story(gen, tok8192) == "Tom ran home. The end."
    gen = tok8192.encode(" Tom ran home.", bos=False) + [tok8192.bos_id] + tok8192.encode("Words: a", bos=False)
    assert extract_story(gen, tok8192) == "Tom ran home."


def test_header_fields_and_labels():
    text = make_text(CAT, ScriptedRng())
    fields = header_fields(text)
    assert fields == {"Sentence": "Once there was a cat", "Summary": "A catsings.",
                      "Features": "Dialogue, Badending", "Words": "sing, cat, loud"}
    assert feature_labels(fields["Features"]) == [0, 0, 1, 1, 0, 0]
    assert feature_labels("") == [0] * 6
