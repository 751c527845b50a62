"""finetune_t0.py fed as Megatron-DeepSpeed fed it (docs/t0.md, "Megatron-DeepSpeed's data and
arguments"): indexed prefixes written by Megatron's own builder (transcribed in
test_megatron_data.py), the weighted-split arguments on the command line, prefix-LM, Adafactor,
target-only loss, validation groups blending sources and test groups evaluated at the end, on a
tiny model; the test-group losses against the same examples run alone through the model.
Also --preprocess (our writer, read back by Megatron's reader logic), the mixture.json
equivalent of the arguments, and the bad-input lines (one line, exit 2, nothing written)."""
import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TOK8192, assert_one_line_error, read_metrics, run_main
from test_megatron_data import meg_read, meg_write

from tinylab.core import checkpoint as ckpt_lib
from tinylab.core.errors import UserError
from tinylab.data.tokenizer import Tokenizer
from tinylab.schema import FINETUNE_T0
from tinylab.t0.encode import ExampleEncoder
from tinylab.t0.finetune import T0Data
from tinylab.t0.mixture import mixture_from_config, read_mixture

ROW = 129  # the base model's max_seq_len 128, + 1
TASKS = {"hero": ["hero_train.jsonl", "hero_valid.jsonl"], "ending": ["ending_train.jsonl", "ending_valid.jsonl"],
         "mood": ["mood_valid.jsonl"]}


def rows_of(demo, files):
    return [json.loads(line) for f in files for line in open(os.path.join(demo, f))]


@pytest.fixture(scope="module")
def meg(t0_setup, tmp_path_factory):
    """Prefixes hero (50 examples), ending (50) and mood (10, a held-out task) of the demo tasks,
    tokenised as training tokenises text and written by Megatron's builder (uint16, one item
    per document, as tools/preprocess_data.py writes them)."""
    mixture, base = t0_setup
    demo, root = os.path.dirname(mixture), str(tmp_path_factory.mktemp("meg"))
    enc = ExampleEncoder(Tokenizer(TOK8192))
    for task, files in TASKS.items():
        rows = rows_of(demo, files)
        for field, items in (("inputs", enc.encode_inputs([r["inputs"] for r in rows])),
                             ("targets", enc.encode_targets([r["targets"] for r in rows]))):
            meg_write(os.path.join(root, f"{task}_{field}_document"), [[it] for it in items], np.uint16)
    return root, base, demo


def megatron_argv(P, base, out, **over):
    cfg = dict(model_dir=base, out_dir=out, prefixlm=True, adafactor_preset="t0", batch_size=4,
               gradient_accumulation_steps=2, max_iters=4, eval_interval=2, eval_iters=8, log_interval=1,
               device="cpu", dtype="float32")
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()] + [
        "--train-weighted-split-paths", f"train: 1 0:0.8 {P}/hero, 2 0:0.8 {P}/ending",
        "--valid-weighted-split-paths", f"hero: 1 0.8:1 {P}/hero", f"blend: 1 0.8:1 {P}/hero, 2 0.8:0.9 {P}/ending",
        "--test-weighted-split-paths", f"ending: 1 0.9:1 {P}/ending", f"mix: 1 0.9:1 {P}/ending, 3 0:1 {P}/mood"]


def alone_loss(model, prefix, lo, hi):
    """Token-mean target loss of items [lo, hi) of a prefix (read by Megatron's reader logic),
    each example run alone with its own prefix-LM mask; examples longer than a row are skipped
    as training skips them. Returns (loss, number of examples)."""
    _, _, _, _, inputs = meg_read(prefix + "_inputs_document")
    _, _, _, _, targets = meg_read(prefix + "_targets_document")
    total = count = n = 0
    for inp, tgt in zip(inputs[lo:hi], targets[lo:hi]):
        ids = torch.tensor(np.concatenate([inp, tgt]).astype(np.int64))
        if len(ids) > ROW:
            continue
        T, n_in = len(ids) - 1, len(inp)
        q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
        mask = (k <= q) | ((q < n_in) & (k < n_in))  # prefix-LM: the inputs see each other both ways
        with torch.no_grad():
            logits = model(ids[None, :-1], attn_mask=mask[None], all_logits=True)[0].double()
        ce = F.cross_entropy(logits, ids[1:], reduction="none")
        labels = torch.arange(T) >= n_in - 1  # the label is a target token (the first one and EOS included)
        total += ce[labels].sum().item()
        count += int(labels.sum())
        n += 1
    return total / count, n


@pytest.mark.slow
def test_megatron_style_run_end_to_end(meg, tmp_path):
    P, base, _ = meg
    out = str(tmp_path / "run")
    proc = run_main("finetune_t0.py", megatron_argv(P, base, out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = read_metrics(out)
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["iter"] for r in evals] == [0, 2, 4]
    for r in evals:
        assert r["loss/valid"] == pytest.approx((r["loss/valid/hero"] + r["loss/valid/blend"]) / 2)
        assert not any(k.startswith("rank_acc") for k in r)  # token ids only: no answer choices
    # test groups once, at the end
    assert not any(k.startswith("loss/test") for r in evals[:-1] for k in r)
    final = evals[-1]
    assert final["loss/test"] == pytest.approx((final["loss/test/ending"] + final["loss/test/mix"]) / 2)
    data = next(r for r in rows if r["kind"] == "data")["data"]
    src = data["sources"]
    assert sorted(src["train"]) == ["ending", "hero"] and src["train"]["hero"]["rows"] == 40
    assert sorted(src["valid"]) == ["blend:ending", "blend:hero", "hero"] and src["valid"]["blend:ending"]["rows"] == 5
    assert sorted(src["test"]) == ["ending", "mix:ending", "mix:mood"] and data["test"] == ["ending", "mix"]
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["optimizer_name"] == "adafactor" and ckpt["config"]["prefixlm"] is True and ckpt["iter_num"] == 4
    # the test losses, recomputed from the final weights with each example on its own
    model = ckpt_lib.model_from_checkpoint(ckpt_lib.load_checkpoint(os.path.join(out, "ckpt.pt"))).eval()
    ending, n_end = alone_loss(model, f"{P}/ending", 45, 50)
    mood, n_mood = alone_loss(model, f"{P}/mood", 0, 10)
    assert (n_end, n_mood) == (src["test"]["ending"]["examples"], src["test"]["mix:mood"]["examples"]) and n_end > 3
    assert final["loss/test/ending"] == pytest.approx(ending, rel=1e-5)
    assert final["loss/test/mix"] == pytest.approx((1 * ending + 3 * mood) / 4, rel=1e-5)


def test_mixture_file_equivalent_of_the_arguments(meg, tmp_path):
    P, base, _ = meg
    mix = tmp_path / "mixture.json"
    mix.write_text(json.dumps({
        "train": [f"train: 1 0:0.8 {P}/hero, 2 0:0.8 {P}/ending"],
        "valid": [f"hero: 1 0.8:1 {P}/hero",
                  {"name": "blend", "sources": [{"name": "hero", "path": f"{P}/hero", "range": "0.8:1"},
                                                {"name": "ending", "path": f"{P}/ending", "range": "0.8:0.9", "weight": 2}]}],
        "test": [{"name": "ending", "path": f"{P}/ending", "range": "0.9:1"},
                 f"mix: 1 0.9:1 {P}/ending, 3 0:1 {P}/mood"]}))
    from_file = read_mixture(str(mix))
    from_args = mixture_from_config(FINETUNE_T0.parse(megatron_argv(P, base, "unused")))

    def shape(m):
        def src(s):
            return (s.name, s.kind, os.path.abspath(s.path), float(s.weight), s.start, s.end)
        return ([src(s) for s in m.train], [[(g.name, [src(s) for s in g.sources]) for g in gs] for gs in (m.valid, m.test)])
    assert shape(from_file) == shape(from_args)
    assert [s.kind for s in from_args.train] == ["megatron", "megatron"]
    # several train groups are one blend, every item's weight as given (Megatron allows one group)
    two = mixture_from_config(FINETUNE_T0.parse(["--model_dir=m", "--train-weighted-split-paths", f"A: 1 0:0.4 {P}/hero",
                                                 f"B: 2 0.4:0.8 {P}/hero, 1 0:0.8 {P}/ending"]))
    assert [(s.name, s.weight, s.start, s.end) for s in two.train] == [
        ("hero", 1.0, 0.0, 0.4), ("hero_1", 2.0, 0.4, 0.8), ("ending", 1.0, 0.0, 0.8)]
    # a prefix used by two splits must not overlap (every pair of splits)
    bad = json.loads(mix.read_text())
    bad["test"][0]["range"] = "0.85:1"
    mix.write_text(json.dumps(bad))
    enc = ExampleEncoder(Tokenizer(TOK8192))
    m = read_mixture(str(mix))
    with pytest.raises(UserError, match=r"test 'ending' \(Megatron prefix .*ending rows 0.85:1\) overlaps validation"):
        T0Data(m.train, m.valid, enc, ROW, log=lambda *a: None, test=m.test)


@pytest.mark.parametrize("content, fragment", [
    ({"train": "T: 1 0:1 a.jsonl", "valid": [{"name": "g", "sources": []}]}, "field 'sources' must be a non-empty list"),
    ({"train": "T: 1 0:1 a.jsonl", "valid": [{"name": "g", "sources": [{"name": "a", "path": "a.jsonl"}], "x": 1}]},
     "unknown group field 'x'"),
    ({"train": "T: 1 0:1 a.jsonl", "test": [{"name": "a/b", "sources": [{"name": "a", "path": "a.jsonl"}]}]},
     "field 'name' must be a non-empty string without '/'"),
    ({"train": "T: 1 0:1 a.jsonl", "test": [{"name": "g", "sources": [{"name": "a", "path": "a.jsonl", "weight": 0}]}]},
     "test[0] ('g'): sources[0] ('a'): field 'weight' must be a number > 0"),
    ({"train": "T: 1 0:1 a.jsonl", "valid": ["g: 1 0:1 a.jsonl", "g: 1 0:1 b.jsonl"]}, "valid name 'g' is used twice"),
    ({"train": "T: 1 0:1 a.jsonl", "valid": ["g: 1 0.5 a.jsonl"]}, "valid[0] 'g: 1 0.5 a.jsonl': character 6: range"),
    ({"train": ["A: 1 0:1 a.jsonl"], "test": {"name": "g"}}, "field 'test' must be a list"),
])
def test_malformed_groups_in_the_mixture_file(tmp_path, content, fragment):
    mix = tmp_path / "m.json"
    mix.write_text(json.dumps(content))
    with pytest.raises(UserError) as e:
        read_mixture(str(mix))
    assert fragment in str(e.value), str(e.value)


def test_preprocess_writes_what_training_reads(meg, tmp_path):
    P, base, demo = meg
    src = os.path.join(demo, "hero_train.jsonl")
    prefix = str(tmp_path / "hero")
    argv = ["--preprocess", f"--input={src}", f"--output_prefix={prefix}", f"--model_dir={base}"]
    proc = run_main("finetune_t0.py", argv)
    assert proc.returncode == 0 and "wrote 40 examples" in proc.stdout, proc.stderr
    rows = rows_of(demo, ["hero_train.jsonl"])
    enc = ExampleEncoder(Tokenizer(TOK8192))
    dtype, _, _, _, inputs = meg_read(prefix + "_inputs_document")  # Megatron's reader on our files
    _, _, _, _, targets = meg_read(prefix + "_targets_document")
    assert dtype == np.uint16
    assert [x.tolist() for x in inputs] == enc.encode_inputs([r["inputs"] for r in rows])
    assert [x.tolist() for x in targets] == enc.encode_targets([r["targets"] for r in rows])
    # the prefix gives the training examples the jsonl gives
    from tinylab.t0.mixture import Source
    a = T0Data([Source("j", path=src)], [], enc, ROW, log=lambda *a: None).train[0]
    b = T0Data([Source("m", path=prefix)], [], enc, ROW, log=lambda *a: None).train[0]
    assert [x.tolist() for x in a.ids] == [x.tolist() for x in b.ids] and a.n_input == b.n_input
    # never over existing files unless asked
    before = {f: open(f, "rb").read() for f in (prefix + "_inputs_document.bin", prefix + "_targets_document.idx")}
    assert_one_line_error(run_main("finetune_t0.py", argv), "already exist", "--overwrite=True")
    assert all(open(f, "rb").read() == b for f, b in before.items())
    assert run_main("finetune_t0.py", argv + ["--overwrite=True"]).returncode == 0
    assert sorted(os.listdir(tmp_path)) == sorted(f"hero_{f}_document.{e}" for f in ("inputs", "targets")
                                                  for e in ("bin", "idx"))  # no temp files left


def test_bad_megatron_input_is_one_line_and_writes_nothing(meg, tmp_path):
    P, base, _ = meg
    bad = str(tmp_path / "bad")
    os.makedirs(bad)
    meg_write(f"{bad}/half_inputs_document", [[[1, 2]]], np.uint16)  # no targets
    meg_write(f"{bad}/uneven_inputs_document", [[[1, 2]], [[3]]], np.uint16)
    meg_write(f"{bad}/uneven_targets_document", [[[4]]], np.uint16)
    meg_write(f"{bad}/vocab_inputs_document", [[[1, 2]]], np.uint16)
    meg_write(f"{bad}/vocab_targets_document", [[[9000]]], np.uint16)  # another tokenizer's id
    for s in ("inputs", "targets"):  # a copy of hero: its items are training items
        for ext in (".bin", ".idx"):
            with open(f"{P}/hero_{s}_document{ext}", "rb") as f, open(f"{bad}/copy_{s}_document{ext}", "wb") as g:
                g.write(f.read())
    out = str(tmp_path / "never")

    def run(train, *extra):
        argv = [f"--model_dir={base}", f"--out_dir={out}", "--device=cpu", "--train-weighted-split-paths", train, *extra]
        return run_main("finetune_t0.py", argv)
    cases = [
        (run(f"T: 1 0:0.8 {P}/hero, x 0:1 {P}/ending"), ["--train-weighted-split-paths", "weight 'x' is not a number",
                                                         f"character {len(f'T: 1 0:0.8 {P}/hero, ') + 1}:"]),
        (run(f"T: 1 0.8:0.2 {P}/hero"), ["character 6", "needs 0 <= START < END <= 1"]),
        (run(f"T: 1 0:1 {bad}/half"), ["half_targets_document.bin", "not found"]),
        (run(f"T: 1 0:1 {bad}/uneven"), ["has 2 items but", "has 1"]),
        (run(f"T: 1 0:1 {bad}/vocab"), ["vocab_targets_document.bin holds token id 9000", "vocabulary of 8192"]),
        (run(f"T: 1 0:0.8 {P}/hero", "--valid-weighted-split-paths", f"V: 1 0:1 {bad}/copy"),
         ["valid source", "shares 40 of 50 examples with the training data"]),
        (run(f"T: 1 0:0.8 {P}/hero", "--test-weighted-split-paths", f"X: 1 0.7:1 {P}/hero"),
         ["test 'hero'", "overlaps training"]),
    ]
    for proc, fragments in cases:
        assert_one_line_error(proc, *fragments)
        assert proc.returncode == 2 and not os.path.exists(out)
