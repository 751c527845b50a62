"""The kinds of T0 sources (tinylab/t0/sources/): the registry decides Source.kind; every kind gives
the same SourceData (a json file and a Megatron prefix of the same records give the same token
ids, compared with ids written by Megatron's own builder from sentencepiece directly); a kind
registered by a module of its own is read by mixture files, finetune_t0.py's data and
eval_rank.py with no other edit; and the one overlap check finds training examples in an
evaluation source whatever the two kinds are."""
import hashlib
import json
import os

import numpy as np
import pytest
from conftest import TOK8192, assert_one_line_error, run_main, save_tiny_checkpoint, t0_args
from conftest import tiny_model as shared_tiny_model
from test_bad_input import snapshot
from test_megatron_data import meg_write

from tinylab.core.errors import UserError
from tinylab.data.tokenizer import Tokenizer
from tinylab.t0.encode import ExampleEncoder
from tinylab.t0.finetune import T0Data
from tinylab.t0.mixture import Source, read_mixture
from tinylab.t0.sources import T0_SOURCES, find_reader, read_records
from tinylab.t0.sources.text import text_reader

ROW = 129
RECORDS = [{"inputs": f"Story {i}: Tom had {i} red balls.\nHow many balls did Tom have?", "targets": f" {i}",
            "answer_choices": [f"{i}", f"{i + 1}"]} for i in range(10)]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(TOK8192)


def no_log(*a):
    pass


def write_jsonl(path, records):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return str(path)


def write_prefix(prefix, records, tok):
    """A Megatron prefix of `records` written by Megatron's builder (test_megatron_data.py), ids
    straight from sentencepiece: [BOS] + the inputs; the target without its leading whitespace
    (the dummy prefix gives it one space) + [EOS]: finetune_t0.py's default tokenisation."""
    inputs = [tok.encode(r["inputs"], bos=True, eos=False) for r in records]
    targets = [tok.encode(r["targets"].lstrip(), bos=False, eos=True) for r in records]
    for field, items in (("inputs", inputs), ("targets", targets)):
        meg_write(f"{prefix}_{field}_document", [[it] for it in items], np.uint16)
    return str(prefix), list(zip(inputs, targets))


def test_the_registry_decides_each_sources_kind(tmp_path):
    assert {"hf", "file", "megatron"} <= set(T0_SOURCES.names())
    for path in ("a.jsonl", "a.json", "a.parquet", "A.JSONL", str(tmp_path / "missing.jsonl")):
        assert Source("a", path=path).kind == "file"  # by extension, whether or not it exists
    hub = Source("h", hf="bigscience/P3", config="rte", split="validation")
    assert hub.kind == "hf" and hub.describe() == "'h' (bigscience/P3/rte [validation])"
    prefix = Source("m", path=str(tmp_path / "rte"), start=0.5)  # a path that names no file
    assert prefix.kind == "megatron" and prefix.describe() == f"'m' (Megatron prefix {tmp_path / 'rte'} rows 0.5:1)"
    assert hub.reader.gives_records and Source("a", path="a.jsonl").reader.gives_records
    assert not prefix.reader.gives_records
    other = tmp_path / "notes.txt"
    other.write_text("inputs,targets\n")
    for probe in (lambda s: s.kind, read_records):
        with pytest.raises(UserError, match=r"'notes.txt' \(.*notes.txt\): unsupported file type '\.txt' "
                                            r"\(.*json, jsonl.* or .*\)"):  # the registered file types
            probe(Source("notes.txt", path=str(other)))
    with pytest.raises(UserError, match="holds token ids, not text records"):
        read_records(prefix)


def test_every_kind_gives_the_same_source_data(tmp_path, tok):
    enc = ExampleEncoder(tok)
    rows = RECORDS + [{"inputs": "  ", "targets": "x", "answer_choices": ["x", "y"]}]  # no inputs: skipped, counted
    text = Source("j", path=write_jsonl(tmp_path / "r.jsonl", rows))
    prefix, pairs = write_prefix(tmp_path / "r", RECORDS, tok)
    a, b = text.reader.read(text, enc), Source("m", path=prefix).reader.read(Source("m", path=prefix), enc)
    assert a.pairs == b.pairs == [(list(i), list(t)) for i, t in pairs]
    assert (a.n_rows, b.n_rows) == (11, 10) and a.records == rows and b.records == []
    ids = [hashlib.sha1(np.asarray(i, np.int64).tobytes() + b"|" + np.asarray(t, np.int64).tobytes()).hexdigest()
           for i, t in pairs]
    texts = [hashlib.sha1((r["inputs"].strip() + "\x00" + r["targets"].strip()).encode()).hexdigest() for r in RECORDS]
    assert a.hashes == list(zip(ids, texts)) and b.hashes == [(h, None) for h in ids]
    assert a.show(3) == repr(RECORDS[3]["inputs"].replace("\n", " ")[:60]) and b.show(3) == "item 3 of its range"
    part = Source("m", path=prefix, start=0.5)  # Megatron's rounding: items round(0.5 * 10) = 5 on
    assert part.reader.read(part, enc).pairs == a.pairs[5:]


def overlap_error(train, valid, enc, split="valid"):
    with pytest.raises(UserError) as e:
        T0Data(train, valid if split == "valid" else [], enc, ROW, log=no_log, test=valid if split == "test" else ())
    return str(e.value)


def test_one_overlap_check_for_every_kind(tmp_path, tok):
    """Training examples in an evaluation source are refused whichever kinds the two sources are;
    the shared count is the number of records the two have in common."""
    enc = ExampleEncoder(tok)
    train_file = Source("t", path=write_jsonl(tmp_path / "train.jsonl", RECORDS))
    train_prefix = Source("tp", path=write_prefix(tmp_path / "train", RECORDS, tok)[0])
    new = [{"inputs": f"A new question {i}?", "targets": "yes"} for i in range(2)]
    valid_rows = RECORDS[2:5] + new
    valid_file = Source("v", path=write_jsonl(tmp_path / "valid.jsonl", valid_rows))
    shared = sum(1 for r in valid_rows if (r["inputs"], r["targets"]) in {(t["inputs"], t["targets"]) for t in RECORDS})
    # a Megatron training prefix vs a jsonl validation file: by token ids
    first = repr(RECORDS[2]["inputs"].replace("\n", " "))
    assert overlap_error([train_prefix], [valid_file], enc) == (
        f"valid source {valid_file.describe()} shares {shared} of 5 examples with the training data (the same input "
        f"and target token ids, e.g. {first}); it must be held out")
    # a jsonl training file vs a Megatron test prefix of some of its records
    test_prefix = Source("xp", path=write_prefix(tmp_path / "test", RECORDS[6:] + new, tok)[0])
    msg = overlap_error([train_file], [test_prefix], enc, split="test")
    assert f"test source {test_prefix.describe()} shares 4 of 6 examples" in msg and "e.g. item 0 of its range" in msg
    # two json files: by text, up to surrounding whitespace
    spaced = Source("s", path=write_jsonl(tmp_path / "spaced.jsonl", [{**RECORDS[7], "inputs": RECORDS[7]["inputs"] + " "}]))
    assert "shares 1 of 1 examples with the training data (the same inputs + targets" in \
        overlap_error([train_file], [spaced], enc)
    # held-out sources of every kind load
    held_prefix = Source("hp", path=write_prefix(tmp_path / "held", new, tok)[0])
    data = T0Data([train_file, train_prefix], [Source("n", path=write_jsonl(tmp_path / "new.jsonl", new)), held_prefix],
                  enc, ROW, log=no_log)
    assert [len(m["examples"]) for g in data.valid for m in g["members"]] == [2, 2]


def read_pairs(src):
    """A toy kind for the test: "inputs ||| targets" lines."""
    if not os.path.isfile(src.path):
        raise UserError(f"source {src.describe()}: file {src.path} not found")
    lines = open(src.path).read().splitlines()
    return [dict(zip(("inputs", "targets"), line.split(" ||| "))) for line in lines]


@pytest.fixture
def pairs_kind(monkeypatch):
    """A toy kind, registered as a module of its own would register it (undone after the test)."""
    entry = text_reader("pairs file", read_pairs, handles=lambda src: src.path.endswith(".pairs"),
                        extensions=(".pairs",))
    monkeypatch.setitem(T0_SOURCES._entries, "pairs", entry)
    return entry


def test_a_registered_kind_needs_no_other_edit(tmp_path, tok, pairs_kind):
    enc = ExampleEncoder(tok)
    (tmp_path / "sums.pairs").write_text("".join(f"What is {i} plus {i}? ||| {2 * i}\n" for i in range(8)))
    assert find_reader(Source("x", path=str(tmp_path / "missing.pairs"))) == ("pairs", pairs_kind)  # before the fallback
    mixture = tmp_path / "mixture.json"
    mixture.write_text(json.dumps({"train": "2 0:1 sums.pairs, 1 0:1 r.jsonl",
                                     "valid": [{"name": "v", "path": "v.pairs"}]}))
    write_jsonl(tmp_path / "r.jsonl", RECORDS)
    (tmp_path / "v.pairs").write_text("Is the sky green? ||| no\n")
    m = read_mixture(str(mixture))
    assert [(s.name, s.kind) for s in m.train] == [("sums", "pairs"), ("r", "file")]  # named without the extension
    assert read_records(m.train[0])[3] == {"inputs": "What is 3 plus 3?", "targets": "6"}
    data = T0Data(m.train, m.valid, enc, ROW, log=no_log)
    assert data.report["train"]["sums"]["examples"] == 8 and data.report["valid"]["v"]["rows"] == 1
    rows = data.stream({"max_seq_len": ROW - 1, "seed": 0, "mixing": "example", "packing": "best_fit",
                        "pack_buffer": 64, "pad_id": 0, "too_long_examples": "drop"}).next_rows(4)
    assert {s for row in rows for s, _ in row} == {0, 1}  # both kinds' examples are packed
    (tmp_path / "v.pairs").write_text("What is 5 plus 5? ||| 10\nIs the sky green? ||| no\n")
    assert "valid source 'v'" in overlap_error(m.train, read_mixture(str(mixture)).valid, enc)


def test_finetune_refuses_a_prefix_of_its_validation_file(t0_setup, tmp_path, tok):
    """The command line: a Megatron training prefix made from a jsonl file that is also a
    validation source is one error line, exit 2, nothing written."""
    _, base = t0_setup
    prefix, _ = write_prefix(tmp_path / "train", RECORDS, tok)
    mixture = tmp_path / "m.json"
    mixture.write_text(json.dumps({"train": [{"name": "t", "path": prefix}],
                                   "valid": [{"name": "v", "path": write_jsonl(tmp_path / "v.jsonl", RECORDS[:3])}]}))
    before = snapshot(tmp_path)
    proc = run_main("finetune_t0.py", t0_args(str(mixture), base, str(tmp_path / "out")))
    assert proc.returncode == 2
    assert_one_line_error(proc, "valid source 'v'", "shares 3 of 3 examples with the training data")
    assert snapshot(tmp_path) == before


def test_eval_rank_skips_kinds_without_records(tmp_path, tok):
    model = shared_tiny_model(dim=16, n_layers=1, n_heads=2, n_kv_heads=None, vocab_size=tok.vocab_size, max_seq_len=64)
    save_tiny_checkpoint(tmp_path / "base" / "ckpt.pt", model)
    prefix, _ = write_prefix(tmp_path / "p", RECORDS, tok)
    mixture = tmp_path / "m.json"
    spec = {"train": [{"name": "t", "path": prefix, "range": "0:0.5"}],
            "valid": [{"name": "ids", "path": prefix, "range": "0.5:1"}]}
    mixture.write_text(json.dumps(spec))
    argv = [f"--checkpoint={tmp_path / 'base'}", f"--mixture={mixture}", "--device=cpu"]
    assert_one_line_error(run_main("evaluation/eval_rank.py", argv), "no record to rank: 0 record(s) read from 1 "
                          "group(s), skipped: 1 Megatron prefix group(s) (token ids, no answer_choices)")
    spec["valid"].append({"name": "text", "path": write_jsonl(tmp_path / "q.jsonl", RECORDS[5:])})
    mixture.write_text(json.dumps(spec))
    proc = run_main("evaluation/eval_rank.py", argv, check=True)
    assert "ids: a Megatron prefix holds token ids, no answer_choices; skipped" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1])["groups"]["text"]["n"] == 5
