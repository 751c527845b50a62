"""--mix_match_pairs=original (and tinystories.py pretokenize --compat=original): --mix_match as the
study's tinystories.py applied it, against its make_mix_match_func re-implemented here, and the
dataset names: unchanged without the flag, one part more with it."""
import os
import random
import re

import pytest
from conftest import run_main

from tinylab.data.dataset_spec import infer_pretokenize_flags, parse_spec


def original_mix_match(mix_match):
    """RobertKirk/tinystories-wrappers tinystories.py:225-242, make_mix_match_func, as written."""
    matches_strs = [re.split(r"[:=]", substr) for substr in mix_match.split(",")]
    matches = {
        match[0]: {match[i]: match[i + 1] for i in range(1, len(match[1:]) - 1, 2)} for match in matches_strs
    }

    def swap_fn(example):
        for feature, swaps in matches.items():
            for val_from, val_to in swaps.items():
                if val_from in example["instruction"][feature]:
                    example["instruction"][feature] = [
                        val_to if val == val_from else val for val in example["instruction"][feature]
                    ]
        return example

    return swap_fn


def example(features, words=("dog", "ball")):
    return {"story": "A story.", "summary": "s", "instruction": {"features": list(features), "words": list(words)}}


EXAMPLES = [example(["Twist"]), example(["Foreshadowing"]), example(["Twist", "Dialogue"]),
            example(["Dialogue", "Conflict", "Twist"], ["box", "cat"]), example([], ["crate"])]


@pytest.mark.parametrize("mix_match", [
    "features=Foreshadowing:Twist",  # the study's one use: a no-op in the original
    "features:Foreshadowing=Twist",
    "features=Twist:Dialogue:Dialogue:Twist",  # two pairs: only the first applies
    "features=Twist:Dialogue:Dialogue:Conflict:Conflict:Twist",  # in turn: Twist -> Dialogue -> Conflict
    "words=box:crate:dog:cat,features=Twist:Conflict:Dialogue:Twist",
])
def test_original_pairs_are_the_originals_loop(mix_match):
    ours = parse_spec(mix_match=mix_match, mix_match_pairs="original")
    fixed = parse_spec(mix_match=mix_match)
    theirs = original_mix_match(mix_match)
    differs = False
    for ex in EXAMPLES:
        got = ours.transform(ex, random.Random(0))["instruction"]
        want = theirs({"instruction": {k: list(v) for k, v in ex["instruction"].items()}})["instruction"]
        assert got == want, (mix_match, ex["instruction"])
        differs |= fixed.transform(ex, random.Random(0))["instruction"] != want
    assert differs  # every pair applied, once each, is another dataset


def test_names_unchanged_without_the_flag_and_one_part_more_with_it():
    plain = "F_features_x_Twist_MM_features_Foreshadowing_Twist_AT_none_RF_none_IS_none"
    assert parse_spec(filtering="features!=Twist", mix_match="features=Foreshadowing:Twist").name() == plain
    spec = parse_spec(filtering="features!=Twist", mix_match="features=Foreshadowing:Twist", mix_match_pairs="original")
    assert spec.name() == plain + "_MP_original"
    assert infer_pretokenize_flags(spec.name()) == ["--filtering=features!=Twist",
                                                    "--mix_match=features=Foreshadowing:Twist",
                                                    "--mix_match_pairs=original"]


def pretokenize(corpus, *flags):
    return run_main("tinystories.py", ["pretokenize", f"--data_cache_dir={corpus}", "--vocab_size=1024",
                                       "--workers=1", *flags], check=True)


def shards(folder):
    return [open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder)) if f.endswith(".bin")]


def test_pretokenize_compat_original_is_the_studys_mix_match(lab_corpus, tmp_path):
    """--compat=original with the study's one mix_match: the dataset is named with its own part and
    holds exactly the bytes of the same filter without mix_match (the original's no-op)."""
    cache = str(tmp_path / "cache")
    os.makedirs(cache)
    for name in ("TinyStories_all_data", "tok1024.model"):
        os.symlink(os.path.join(lab_corpus.cache_dir, name), os.path.join(cache, name))
    proc = pretokenize(cache, "--filtering=features!=Twist", "--mix_match=features=Foreshadowing:Twist",
                       "--compat=original")
    assert "compat=original (RobertKirk/tinystories-wrappers): mix_match_pairs='original'" in proc.stderr
    name = "F_features_x_Twist_MM_features_Foreshadowing_Twist_AT_none_RF_none_IS_none_MP_original"
    assert shards(os.path.join(cache, "tok1024", name)) == shards(lab_corpus.dataset("filter-Twist", 1024))
    # without --compat the pairs apply: a dataset of its own name, relabelled
    pretokenize(cache, "--filtering=features!=Twist", "--mix_match=features=Foreshadowing:Twist")
    relabelled = shards(os.path.join(cache, "tok1024", name[:-len("_MP_original")]))
    assert relabelled != shards(lab_corpus.dataset("filter-Twist", 1024))
    # --compat=original without --mix_match: nothing to change, the usual name
    proc = pretokenize(cache, "--filtering=features!=Twist", "--dataset_name=plain", "--compat=original")
    assert "compat=original (RobertKirk/tinystories-wrappers): nothing to change" in proc.stderr
    assert shards(os.path.join(cache, "tok1024", "plain")) == shards(lab_corpus.dataset("filter-Twist", 1024))
