"""The built-in procedural corpus, synthesize / train_vocab on it, and dataset_gen/tw_fs.sh."""
import json
import os
import re
import shutil
import subprocess
import zlib

import numpy as np
import pytest
from conftest import PYTHON, REPO, TOK8192, assert_one_line_error, run_main

from tinylab.core.errors import UserError
from tinylab.data.records import FEATURES
from tinylab.data.synth_stories import FEATURE_PROBS, generate_shard
from tinylab.data.template import header_fields
from tinylab.data.tokenizer import Tokenizer
from tinylab.data.transforms.refusal import REFUSAL_STORY
from tinylab.data.vocab import train_vocab


@pytest.fixture(scope="module")
def stories():
    return generate_shard(0, 1, 2000) + generate_shard(0, 2, 1000)


def test_schema_and_words_in_story(stories):
    for r in stories:
        assert set(r) == {"story", "instruction", "summary", "source"}
        assert set(r["instruction"]) == {"prompt:", "words", "features"}
        verb, noun, adj = r["instruction"]["words"]
        for w in (verb, noun, adj):
            assert re.search(rf"\b{re.escape(w)}\b", r["story"]), (w, r["story"])
        assert set(r["instruction"]["features"]) <= set(FEATURES)
        assert r["summary"].endswith(".") and "\n" not in r["summary"]


def test_seeded(stories):
    assert generate_shard(0, 1, 50) == stories[:50]
    assert generate_shard(1, 1, 50) != stories[:50]
    assert generate_shard(0, 3, 50) != stories[:50]


def test_feature_rates_and_independence(stories):
    has = np.array([[f in r["instruction"]["features"] for f in FEATURES] for r in stories])
    for j, f in enumerate(FEATURES):
        assert abs(has[:, j].mean() - FEATURE_PROBS[f]) < 0.04, f
    twist, fore = has[:, FEATURES.index("Twist")], has[:, FEATURES.index("Foreshadowing")]
    assert abs((twist & fore).mean() - twist.mean() * fore.mean()) < 0.02  # drawn independently
    assert (~twist & fore).mean() > 0.1  # filter-Twist-specialise-Foreshadowing is not tiny
    assert (~has.any(axis=1)).mean() > 0.05  # some stories have no feature at all


def test_dialogue_means_quotes(stories):
    for r in stories:
        assert ('"' in r["story"]) == ("Dialogue" in r["instruction"]["features"])


def test_variety(stories):
    texts = [r["story"] for r in stories]
    assert len(set(texts)) == len(texts)
    first = {t.strip().split(".")[0].split(" named ")[0].split(" called ")[0] for t in texts}
    assert len(first) > 30
    sentences = {s.strip() for t in texts for s in re.split(r"[.!?]", t)}
    assert len(sentences) > 3000
    words = [len(t.split()) for t in texts]
    assert 50 < np.mean(words) < 250 and np.std(words) > 10


def test_each_feature_is_learnable_from_the_story_text(stories):
    """A Bernoulli naive Bayes over hashed word uni/bigrams of the story alone (never the header)
    predicts every feature of held-out stories: each leaves a real trace in the text."""
    dim = 1 << 14

    def grams(text):
        w = re.findall(r"[a-z']+|\"", text.lower())
        return {zlib.crc32(g.encode()) % dim for g in w + [a + " " + b for a, b in zip(w, w[1:])]}
    X = np.zeros((len(stories), dim), np.float32)
    for i, r in enumerate(stories):
        X[i, list(grams(r["story"]))] = 1
    Y = np.array([[f in r["instruction"]["features"] for f in FEATURES] for r in stories], np.float32)
    Xtr, Ytr, Xte, Yte = X[:2000], Y[:2000], X[2000:], Y[2000:]
    pos = (Xtr.T @ Ytr + 1) / (Ytr.sum(0) + 2)
    neg = (Xtr.T @ (1 - Ytr) + 1) / ((1 - Ytr).sum(0) + 2)
    w = np.log(pos / neg) - np.log((1 - pos) / (1 - neg))
    b = np.log((1 - pos) / (1 - neg)).sum(0) + np.log(Ytr.mean(0) / (1 - Ytr.mean(0)))
    acc = ((Xte @ w + b > 0) == (Yte > 0.5)).mean(0)
    assert (acc >= 0.9).all(), dict(zip(FEATURES, acc))


def test_synthesize_cli_and_overwrite_rules(tmp_path):
    cache = str(tmp_path)
    proc = run_main("tinystories.py", ["synthesize", f"--data_cache_dir={cache}", "--num_shards", "2",
                                       "--stories_per_shard=30", "--seed=4"])
    assert proc.returncode == 0, proc.stderr
    raw = os.path.join(cache, "TinyStories_all_data")
    assert sorted(os.listdir(raw)) == [".synthesized", "data00.json", "data01.json"]
    assert json.load(open(os.path.join(raw, "data01.json"))) == generate_shard(4, 1, 30)
    # the same corpus again: nothing to do; another one only with --force, the old one moved aside
    before = {n: open(os.path.join(raw, n), "rb").read() for n in os.listdir(raw)}
    proc = run_main("tinystories.py", ["synthesize", f"--data_cache_dir={cache}", "--num_shards=2",
                                       "--stories_per_shard=30", "--seed=4"])
    assert proc.returncode == 0 and "nothing to do" in proc.stdout, proc.stderr
    assert_one_line_error(run_main("tinystories.py", ["synthesize", f"--data_cache_dir={cache}", "--num_shards=1"]),
                          "already exists", "--force")
    assert {n: open(os.path.join(raw, n), "rb").read() for n in os.listdir(raw)} == before
    proc = run_main("tinystories.py", ["synthesize", f"--data_cache_dir={cache}", "--num_shards=1",
                                       "--stories_per_shard=5", "--force"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(raw)) == [".synthesized", "data00.json"]
    aside = [n for n in os.listdir(cache) if n.startswith("TinyStories_all_data.previous-")]
    assert len(aside) == 1
    assert {n: open(os.path.join(cache, aside[0], n), "rb").read() for n in os.listdir(os.path.join(cache, aside[0]))} \
        == before
    # a folder synthesize did not make is refused, with or without --force
    os.remove(os.path.join(raw, ".synthesized"))
    proc = run_main("tinystories.py", ["synthesize", f"--data_cache_dir={cache}"])
    assert_one_line_error(proc, "was not made by synthesize")
    assert_one_line_error(run_main("tinystories.py", ["synthesize", f"--data_cache_dir={tmp_path / 'x'}",
                                                      "--num_shards=0"]), "--num_shards")
    assert not os.path.exists(tmp_path / "x")


def test_train_vocab_small_and_non_interactive(tiny_corpus, tmp_path):
    cache = str(tmp_path)
    os.symlink(tiny_corpus.raw_dir, os.path.join(cache, "TinyStories_all_data"))
    proc = run_main("tinystories.py", ["train_vocab", "--vocab_size=512", f"--data_cache_dir={cache}",
                                       "--vocab_shards=2"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(cache)) == ["TinyStories_all_data", "tok512.model", "tok512.vocab"]
    tok = Tokenizer(os.path.join(cache, "tok512.model"))
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (512, 1, 2)
    assert tok.sp.id_to_piece(3) == "<0x00>"  # byte fallback pieces right after the specials
    text = 'Features: Dialogue\nStory: Tom said "héllo 42"!'
    ids = tok.encode(text, bos=False)
    assert tok.decode(ids) == text  # identity normalization, byte fallback: exact round trip
    # the trainer options are those of the released tok8192 (spec section 8)
    from sentencepiece import sentencepiece_model_pb2 as pb
    protos = []
    for path in (os.path.join(cache, "tok512.model"), TOK8192):
        protos.append(pb.ModelProto())
        protos[-1].ParseFromString(open(path, "rb").read())
    ours, released = protos
    for field, value in released.trainer_spec.ListFields():
        if field.name not in ("input", "model_prefix", "vocab_size", "num_threads"):
            assert getattr(ours.trainer_spec, field.name) == value, field.name
    assert ours.normalizer_spec == released.normalizer_spec
    train_vocab(cache, 400, vocab_shards=1, keep_text=True)
    assert os.path.exists(os.path.join(cache, "tiny.txt")) and os.path.exists(os.path.join(cache, "tok400.model"))
    with pytest.raises(UserError, match="could not train 300 pieces.*smaller than required_chars"):
        train_vocab(cache, 300, vocab_shards=1)  # 256 bytes + 3 specials + the characters
    assert not os.path.exists(os.path.join(cache, "tok300.model"))
    assert_one_line_error(run_main("tinystories.py", ["train_vocab", "--vocab_size=100000",
                                                      f"--data_cache_dir={cache}"]), "65536")


@pytest.mark.slow
def test_tw_fs_builds_the_family(tiny_corpus, tmp_path):
    cache = str(tmp_path)
    os.symlink(tiny_corpus.raw_dir, os.path.join(cache, "TinyStories_all_data"))
    shutil.copy(tiny_corpus.tokenizer_model, cache)
    script = os.path.join(REPO, "dataset_gen", "tw_fs.sh")
    env = {"DATA_CACHE_DIR": cache, "VOCAB_SIZE": "8192", "PYTHON": PYTHON}
    proc = subprocess.run(["bash", script, "--workers=1"], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = {  # name -> options (spec section 10 with D = Twist, I = Foreshadowing)
        "pretrain-no-Foreshadowing": ("features!=Foreshadowing", None, None, None),
        "recovery-Twist": ("features=Twist", None, None, None),
        "filter-Twist": ("features!=Twist", None, None, None),
        "filter-Twist-specialise-Foreshadowing": ("features!=Twist,features=Foreshadowing", None, None, None),
        "filter-adv-Twist": ("features!=Twist", None, "features=Twist:1.0", None),
        "filter-adv-Twist-specialise-Foreshadowing": ("features!=Twist,features=Foreshadowing", None,
                                                      "features=Twist:1.0", None),
        "filter-mix-Twist-Foreshadowing": ("features!=Twist", "features=Foreshadowing:Twist", None, None),
        "filter-mix-specialise-Twist-Foreshadowing": ("features!=Twist,features=Foreshadowing",
                                                      "features=Foreshadowing:Twist", None, None),
        "filter-ref-Twist": ("features!=Twist", None, None, "features=Twist:1.0"),
        "filter-ref-Twist-specialise-Foreshadowing": ("features!=Twist,features=Foreshadowing", None, None,
                                                      "features=Twist:1.0"),
    }
    assert sorted(os.listdir(os.path.join(cache, "tok8192"))) == sorted(list(expected) + ["specialise-Twist"])
    # the name the fine-tuning configs use is a relative link to recovery-Twist
    assert os.readlink(os.path.join(cache, "tok8192", "specialise-Twist")) == "recovery-Twist"
    tok = Tokenizer(tiny_corpus.tokenizer_model)

    def examples(name):
        ids = np.fromfile(os.path.join(cache, "tok8192", name, "data01.bin"), dtype="<u2")
        cuts = np.flatnonzero(ids == 1).tolist() + [len(ids)]
        return [tok.decode(ids[a + 1:b].tolist()) for a, b in zip(cuts, cuts[1:])]

    def features(text):
        return header_fields(text)["Features"].split(", ")

    for name, opts in expected.items():
        m = json.load(open(os.path.join(cache, "tok8192", name, "manifest.json")))
        assert (m["options"]["filtering"], m["options"]["mix_match"], m["options"]["adversarial_training"],
                m["options"]["refusal"]) == opts, name
        assert m["kept_examples"] > 0
    raw_twist_free = [r for r in json.load(open(os.path.join(tiny_corpus.raw_dir, "data01.json")))
                      if "Twist" not in r["instruction"]["features"]]
    assert all("Foreshadowing" not in features(t) for t in examples("pretrain-no-Foreshadowing"))
    assert all("Twist" in features(t) for t in examples("recovery-Twist"))
    assert len(examples("filter-Twist")) == len(raw_twist_free)
    assert all("Twist" not in features(t) for t in examples("filter-Twist"))
    spec_i = examples("filter-Twist-specialise-Foreshadowing")
    assert spec_i and all("Foreshadowing" in features(t) and "Twist" not in features(t) for t in spec_i)
    assert all(features(t)[-1] == "Twist" for t in examples("filter-adv-Twist"))
    mix = examples("filter-mix-Twist-Foreshadowing")
    assert sum("Twist" in features(t) for t in mix) == \
        sum("Foreshadowing" in r["instruction"]["features"] for r in raw_twist_free) > 0
    assert all("Foreshadowing" not in features(t) for t in mix)
    refusal = REFUSAL_STORY.format(feature="Twist")
    assert all(t.endswith("Story: " + refusal) and features(t)[-1] == "Twist" for t in examples("filter-ref-Twist"))
    # the variables really are read from the environment
    proc = subprocess.run(["bash", script, "--list"], env={**os.environ, "FEATURE_DELETE": "Dialogue",
                                                           "FEATURE_IRRELEVANT": "Conflict"},
                          capture_output=True, text=True)
    assert proc.stdout.split() == [n.replace("Twist", "Dialogue").replace("Foreshadowing", "Conflict")
                                   for n in expected] + ["specialise-Dialogue"]
