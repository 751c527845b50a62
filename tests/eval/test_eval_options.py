"""The evaluation's keys next to their code: the typed options read exactly their keys (every field
from its own key, the defaults the keys' defaults), and the tools' shared flags accept the same
devices and precisions as train.py's."""
import dataclasses

import pytest

from tinylab.eval.keys import EVAL_KEYS
from tinylab.eval.lm_eval import GENERATION_KEYS, GenerationOptions
from tinylab.eval.probes import HEADS_KEYS, HeadsOptions, build_heads
from tinylab.schema import EVAL, TRAIN

# option field <- config key (written out here, not taken from the code under test)
GENERATION_FIELDS = {"temperature": "temperature", "top_k": "top_k", "max_new_tokens": "max_new_tokens",
                     "eval_iters": "generation_eval_iters", "batch_size": "generation_batch_size",
                     "interval_multiplier": "generation_eval_interval_multiplier",
                     "datasets": "generation_datasets", "feature_eval": "feature_eval",
                     "prompt_split": "generation_prompt_split"}
HEADS_FIELDS = {"probes": "probes", "lenses": "lenses", "probes_classes": "probes_classes",
                "init_lens_with_unembed": "init_lens_with_unembed"}


@pytest.mark.parametrize("options, keys, fields", [(GenerationOptions, GENERATION_KEYS, GENERATION_FIELDS),
                                                   (HeadsOptions, HEADS_KEYS, HEADS_FIELDS)])
def test_options_read_each_field_from_its_key(options, keys, fields):
    assert sorted(k.name for k in keys) == sorted(fields.values())
    assert [f.name for f in dataclasses.fields(options)] == list(fields)
    defaults = TRAIN.defaults()
    # the dataclass's own defaults are the keys' defaults (a list key becomes a tuple)
    assert options.from_config(defaults) == options()
    # a distinct, valid value per key lands in its own field (a swapped pair of fields would not)
    changed = {"temperature": 0.25, "top_k": 7, "max_new_tokens": 11, "generation_eval_iters": 3,
               "generation_batch_size": 5, "generation_eval_interval_multiplier": 2,
               "generation_datasets": ["id", "other"], "feature_eval": "Twist", "generation_prompt_split": "train",
               "probes": True, "lenses": False,
               "probes_classes": 4, "init_lens_with_unembed": True}
    got = options.from_config({**defaults, **changed})
    for field, key in fields.items():
        want = changed[key]
        assert getattr(got, field) == (tuple(want) if isinstance(want, list) else want), field


def test_generation_enabled_and_heads_kind():
    assert GenerationOptions().enabled
    assert not GenerationOptions(max_new_tokens=0).enabled and not GenerationOptions(eval_iters=0).enabled
    assert HeadsOptions().kind is None
    assert HeadsOptions(probes=True).kind == "probes" and HeadsOptions(lenses=True).kind == "lenses"


def test_no_heads_without_probes_or_lenses():
    assert build_heads(HeadsOptions(), False, model=None) is None


def test_the_tools_shared_flags_accept_what_train_py_accepts():
    """EVAL's device / seed / batch_size / tokenizer_model are train.py's keys with the tools' own
    defaults and help (the tools load a trained model); its dtype takes train.py's precisions."""
    assert [k.name for k in EVAL_KEYS] == ["checkpoint", "tokenizer_model", "data_cache_dir", "device", "dtype",
                                           "batch_size", "seed", "out", "force"]
    assert list(EVAL.keys) == [k.name for k in EVAL_KEYS]
    tool, train = EVAL.keys, TRAIN.keys
    assert tool["device"].check is train["device"].check
    assert set(tool["dtype"].choices) == set(train["dtype"].choices) - {""}  # '' (train.py's automatic) excluded
    for name in ("seed", "batch_size"):
        assert (tool[name].type, tool[name].range) == (train[name].type, train[name].range), name
    assert tool["seed"] == train["seed"]
    assert tool["tokenizer_model"].input and train["tokenizer_model"].input
    assert tool["out"].output == "json"  # the output guard checks --out before any work
