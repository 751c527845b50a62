"""The training-text template and the helpers that read it back (generation prompts, probe labels),
on hand-made records."""
import random

import pytest
from conftest import TOK8192

from tinylab.data.template import (
    extract_story,
    feature_labels,
    header_end,
    header_fields,
    make_text,
    pick_sentence,
    story_end,
)


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
