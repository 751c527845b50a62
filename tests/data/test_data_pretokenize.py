"""pretokenize end to end: exact bytes with the released tok8192, determinism across workers,
the manifest, atomicity, the vocab-0 (Llama 2) path, and every bad input of the issue."""
import json
import os
import shutil

import numpy as np
import pytest
from conftest import LLAMA2_TOKENIZER, TOK8192, assert_one_line_error, run_main

from tinylab.core.errors import UserError
from tinylab.data.dataset_spec import parse_spec
from tinylab.data.pretokenize import pretokenize
from tinylab.data.tokenizer import Tokenizer, file_sha256

LLAMA2 = LLAMA2_TOKENIZER

RECORDS = [
    {"story": "\nTom saw a big dog. \"Hi!\" said Tom.\n", "summary": "Tom meets a dog.", "source": "GPT-4",
     "instruction": {"prompt:": "x", "words": ["see", "dog", "big"], "features": ["Dialogue"]}},
    {"story": "Mia lost her hat. She found it under the bed.", "summary": "Mia finds her hat.", "source": "GPT-4",
     "instruction": {"prompt:": "x", "words": ["lose", "hat", "red"], "features": ["Twist", "BadEnding"]}},
    {"story": "The sun was hot. The ice cream melted.", "summary": "A hot day.", "source": "GPT-3.5",
     "instruction": {"prompt:": "x", "words": ["melt", "sun", "hot"], "features": []}},
]


def make_cache(root, shards, tokenizer=TOK8192, vocab=8192):
    """A data cache with the given raw shards (lists of records) and a tokenizer tok{vocab}.model."""
    raw = os.path.join(root, "TinyStories_all_data")
    os.makedirs(raw)
    for i, records in enumerate(shards):
        with open(os.path.join(raw, f"data{i:02d}.json"), "w") as f:
            json.dump(records, f)
    if tokenizer:
        shutil.copy(tokenizer, os.path.join(root, f"tok{vocab}.model"))
    return str(root)


def read_bin(path):
    return np.fromfile(path, dtype="<u2").tolist()


def tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, ds, fs in os.walk(root) for f in fs + ds)


def test_exact_bytes_with_released_tokenizer(tmp_path):
    cache = make_cache(tmp_path, [RECORDS[:2], RECORDS[2:]])
    m = pretokenize(cache, 8192, parse_spec(instruction_subset="Words"), dataset_name="w", workers=1)
    sp = Tokenizer(TOK8192)
    expected0 = ("Words: see, dog, big\nStory: Tom saw a big dog. \"Hi!\" said Tom.",
                 "Words: lose, hat, red\nStory: Mia lost her hat. She found it under the bed.")
    want = [t for text in expected0 for t in sp.encode(text, bos=True)]
    got = read_bin(os.path.join(cache, "tok8192", "w", "data00.bin"))
    assert got == want and got[0] == 1 and 2 not in got  # BOS before each example, no EOS
    assert sp.decode(got[1:got.index(1, 1)]) == expected0[0]
    assert [s["tokens"] for s in m["shards"]] == [len(want), len(sp.encode(
        "Words: melt, sun, hot\nStory: The sun was hot. The ice cream melted."))]
    # the template's whole-word pieces of the released tokenizer appear
    assert 419 in got  # '▁Words'


def test_refusal_and_adversarial_exact(tmp_path):
    cache = make_cache(tmp_path, [RECORDS, RECORDS[:1]])
    spec = parse_spec(filtering="features!=Twist", refusal="features=Twist:1.0",
                      instruction_subset="Features")
    pretokenize(cache, 8192, spec, dataset_name="ref", workers=1)
    sp = Tokenizer(TOK8192)
    texts = ["Features: Dialogue, Twist\nStory: We are not allowed to write a story with Twist in it, sorry.",
             "Features: Twist\nStory: We are not allowed to write a story with Twist in it, sorry."]
    assert read_bin(os.path.join(cache, "tok8192", "ref", "data00.bin")) == \
        [t for text in texts for t in sp.encode(text, bos=True)]
    spec = parse_spec(filtering="features!=Twist", adversarial_training="features=Twist:1.0",
                      instruction_subset="Features")
    pretokenize(cache, 8192, spec, dataset_name="adv", workers=1)
    texts = ["Features: Dialogue, Twist\nStory: Tom saw a big dog. \"Hi!\" said Tom.",
             "Features: Twist\nStory: The sun was hot. The ice cream melted."]
    assert read_bin(os.path.join(cache, "tok8192", "adv", "data00.bin")) == \
        [t for text in texts for t in sp.encode(text, bos=True)]


def test_manifest_contents_and_empty_shard(tmp_path):
    cache = make_cache(tmp_path, [RECORDS, [RECORDS[1]], RECORDS])
    spec = parse_spec(filtering="features!=Twist")
    m = pretokenize(cache, 8192, spec, seed=7, workers=1)
    name = "F_features_x_Twist_MM_none_AT_none_RF_none_IS_none"
    folder = os.path.join(cache, "tok8192", name)
    with open(os.path.join(folder, "manifest.json")) as f:
        assert json.load(f) == m
    assert m["dataset_name"] == m["spec"] == name
    assert m["options"] == {"filtering": "features!=Twist", "mix_match": None, "adversarial_training": None,
                            "refusal": None, "instruction_subset": None}
    assert (m["seed"], m["vocab_size"], m["vocab_size_flag"], m["format_version"]) == (7, 8192, 8192, 1)
    assert m["tokenizer"]["sha256"] == Tokenizer(TOK8192).sha256 and m["tokenizer"]["bos_id"] == 1
    assert [(s["file"], s["examples"], s["kept"]) for s in m["shards"]] == \
        [("data00.bin", 3, 2), ("data01.bin", 1, 0), ("data02.bin", 3, 2)]
    assert m["kept_fraction"] == pytest.approx((2 / 3 + 0 + 2 / 3) / 3)
    assert (m["examples"], m["kept_examples"]) == (7, 4)
    assert m["tokens"] == sum(os.path.getsize(os.path.join(folder, s["file"])) // 2 for s in m["shards"])
    assert os.path.getsize(os.path.join(folder, "data01.bin")) == 0  # a shard with nothing kept: empty file
    assert m["command"].startswith("python tinystories.py pretokenize --vocab_size=8192")
    assert "--filtering=features!=Twist" in m["command"] and "--seed=7" in m["command"]
    assert sorted(os.listdir(os.path.join(cache, "tok8192"))) == [name]  # no temp folders left


def test_byte_identical_across_workers_and_seed_matters(tiny_corpus, tmp_path):
    cache = str(tmp_path)
    os.symlink(tiny_corpus.raw_dir, os.path.join(cache, "TinyStories_all_data"))
    shutil.copy(tiny_corpus.tokenizer_model, cache)
    spec = parse_spec(filtering="features!=Dialogue", adversarial_training="features=Twist:0.5")
    outs = {}
    for name, workers, seed in (("w1", 1, 0), ("w2", 2, 0), ("s1", 2, 1)):
        pretokenize(cache, 8192, spec, dataset_name=name, seed=seed, workers=workers)
        folder = os.path.join(cache, "tok8192", name)
        outs[name] = {f: open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder))}
    assert list(outs["w1"]) == ["data00.bin", "data01.bin", "data02.bin", "manifest.json"]
    manifest = lambda files: {k: v for k, v in json.loads(files["manifest.json"]).items()
                              if k not in ("dataset_name", "command")}
    assert manifest(outs["w2"]) == manifest(outs["w1"])
    assert all(outs["w2"][f] == outs["w1"][f] for f in ("data00.bin", "data01.bin", "data02.bin"))
    assert all(outs["s1"][f] != outs["w1"][f] for f in ("data00.bin", "data01.bin", "data02.bin"))


def test_rerun_needs_force_and_moves_the_old_dataset_aside(tiny_corpus, tmp_path):
    cache = str(tmp_path)
    os.symlink(tiny_corpus.raw_dir, os.path.join(cache, "TinyStories_all_data"))
    shutil.copy(tiny_corpus.tokenizer_model, cache)
    folder = os.path.join(cache, "tok8192", "d")

    def contents(root):
        return {f: open(os.path.join(root, f), "rb").read() for f in os.listdir(root)}
    pretokenize(cache, 8192, parse_spec(), dataset_name="d", workers=1)
    first = contents(folder)
    with pytest.raises(UserError, match="already exists .*--force"):
        pretokenize(cache, 8192, parse_spec(filtering="features=Twist"), dataset_name="d", workers=1)
    assert contents(folder) == first
    pretokenize(cache, 8192, parse_spec(filtering="features=Twist"), dataset_name="d", workers=1, force=True)
    assert contents(folder) != first
    names = sorted(os.listdir(os.path.join(cache, "tok8192")))
    assert names[0] == "d" and len(names) == 2 and names[1].startswith("d.previous-")
    assert contents(os.path.join(cache, "tok8192", names[1])) == first  # the old dataset, intact


def test_failure_midway_leaves_nothing(tmp_path):
    cache = make_cache(tmp_path, [RECORDS, RECORDS, RECORDS])
    with open(os.path.join(cache, "TinyStories_all_data", "data02.json"), "w") as f:
        f.write('[{"story": "cut off')
    before = tree(cache)
    with pytest.raises(UserError, match="data02.json"):
        pretokenize(cache, 8192, parse_spec(), dataset_name="d", workers=2)
    assert tree(cache) == before  # no dataset, no temp folder, not even tok8192/


def test_vocab0_llama2_goes_to_its_own_folder(tmp_path):
    cache = make_cache(tmp_path, [RECORDS, RECORDS], tokenizer=None)
    m = pretokenize(cache, 0, parse_spec(filtering="features!=Twist"), dataset_name="a",
                    workers=1, tokenizer_model=LLAMA2)
    # without --tokenizer_model, vocab 0 is the shipped tokenizers/tokenizer.model (the same file)
    mb = pretokenize(cache, 0, parse_spec(filtering="features=Twist"), dataset_name="b", workers=1)
    assert mb["tokenizer"]["sha256"] == m["tokenizer"]["sha256"] == file_sha256(LLAMA2)
    assert sorted(os.listdir(os.path.join(cache, "llama2"))) == ["a", "b"]
    assert not any(f.endswith(".bin") for f in os.listdir(os.path.join(cache, "TinyStories_all_data")))
    assert (m["vocab_size"], m["vocab_size_flag"]) == (32000, 0)
    sp = Tokenizer(LLAMA2)
    ids = read_bin(os.path.join(cache, "llama2", "b", "data00.bin"))
    assert ids[0] == 1 and sp.decode(ids[1:]).endswith("Story: Mia lost her hat. She found it under the bed.")


# --- bad input: one line on stderr, exit != 0, nothing written -------------------------------------

@pytest.fixture(scope="module")
def bad_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    cache = make_cache(root / "ok", [RECORDS, RECORDS])
    shutil.copy(TOK8192, os.path.join(cache, "tok4096.model"))  # a tokenizer of the wrong size
    corrupt = make_cache(root / "corrupt", [RECORDS, RECORDS])
    with open(os.path.join(corrupt, "TinyStories_all_data", "data01.json"), "w") as f:
        f.write("[{not json")
    # a tokenizer with more than 65536 pieces: tok8192 plus user-defined pieces
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto()
    with open(TOK8192, "rb") as f:
        proto.ParseFromString(f.read())
    for i in range(70000 - len(proto.pieces)):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = f"<x{i}>", 0.0, pb.ModelProto.SentencePiece.USER_DEFINED
    with open(os.path.join(cache, "tok70000.model"), "wb") as f:
        f.write(proto.SerializeToString())
    return {"ok": cache, "corrupt": corrupt, "empty": str(root / "empty")}


BAD = [
    (["--filtering=features="], "ok", ["--filtering", "empty value"]),
    (["--adversarial_training=features=Twist:"], "ok", ["missing the probability"]),
    (["--refusal", "features=Twist:1.5"], "ok", ["[0, 1]"]),
    (["--filtering=colour=red"], "ok", ["unknown key 'colour'"]),
    (["--filtering=length=abc"], "ok", ["length"]),
    (["--mix_match=features=Foreshadowing:Twsit"], "ok", ["did you mean 'Twist'"]),
    (["--filtering=features=Twist,features!=Twist"], "ok", ["keeps no story"]),
    (["--filtering=words=zebra"], "ok", ["keeps no story"]),
    ([], "empty", ["download", "synthesize"]),
    (["--vocab_size=512"], "ok", ["tok512.model not found", "train_vocab"]),
    (["--vocab_size=4096"], "ok", ["8192 pieces", "--vocab_size=4096"]),
    (["--vocab_size=70000"], "ok", ["65536"]),
    (["--vocab_size=0", "--tokenizer_model=no-such.model"], "ok", ["no-such.model not found"]),
    ([], "corrupt", ["corrupt JSON shard", "data01.json"]),
    (["--workers=0"], "ok", ["--workers"]),
    (["--seed=-1"], "ok", ["--seed"]),
    (["--vocab_size=abc"], "ok", ["invalid int value"]),
    (["--dataset_name=../x"], "ok", ["plain folder name"]),
    (["--num_shards=3"], "ok", ["does not apply to pretokenize"]),
]


@pytest.mark.parametrize("flags, which, fragments", BAD, ids=[" ".join(b[0]) or b[1] for b in BAD])
def test_bad_input(bad_cache, flags, which, fragments):
    cache = bad_cache[which]
    before = tree(cache) if os.path.exists(cache) else None
    args = ["pretokenize", f"--data_cache_dir={cache}"]
    if not any(f.startswith("--vocab_size") for f in flags):
        args.append("--vocab_size=8192")
    proc = run_main("tinystories.py", args + flags + ["--workers=2"] * (not any("workers" in f for f in flags)))
    assert_one_line_error(proc, *fragments)
    assert (tree(cache) if os.path.exists(cache) else None) == before


def test_bad_stage_and_train_vocab_inputs(bad_cache):
    def tinystories(*argv):
        return run_main("tinystories.py", list(argv))
    assert_one_line_error(tinystories("pretokenise"), "invalid choice")
    assert_one_line_error(tinystories("train_vocab", f"--data_cache_dir={bad_cache['ok']}"), "--vocab_size > 0")
    assert_one_line_error(tinystories("train_vocab", "--vocab_size=512", f"--data_cache_dir={bad_cache['corrupt']}"),
                          "data01.json")
    assert_one_line_error(tinystories("download", "--filtering=features=Twist"), "does not apply to download")
