"""Transforms on hand-made records, their grammar errors, and dataset naming."""
import copy
import os

import pytest
from test_data_template import CAT, FORESHADOW, TWIST, ScriptedRng

from tinylab.core.errors import UserError
from tinylab.data.dataset_spec import infer_pretokenize_flags, parse_spec, spec_string
from tinylab.data.records import check_dataset_name, dataset_dir
from tinylab.data.template import make_text
from tinylab.data.transforms.refusal import REFUSAL_STORY

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
