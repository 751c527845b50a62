"""evaluation/probe.py: story-only inputs and their labels (checked against the raw features
field), pooled hidden states (batched == one at a time), per-layer probe training on a problem
with a known answer, and the CLI on a tiny model (every block probed)."""
import json
import os

import pytest
import torch
from conftest import assert_one_line_error, run_main, save_tiny_checkpoint, tiny_model

from tinylab.data.records import FEATURES, STORY_FEATURES
from tinylab.data.tokenizer import Tokenizer
from tinylab.eval.probes import pooled_states, probe_accuracy, story_examples, train_probes


@pytest.fixture(scope="module")
def corpus(lab_corpus):
    return lab_corpus


def test_story_only_inputs_and_labels(corpus):
    tok = Tokenizer(os.path.join(corpus.cache_dir, "tok8192.model"))
    examples = story_examples(corpus.dataset("pretrain-all"), "test", 40, 0, tok, max_len=512)
    assert len(examples) == 40
    with open(os.path.join(corpus.raw_dir, "data00.json")) as f:
        raw = {r["story"].strip(): r["instruction"]["features"] for r in json.load(f)}
    for ids, labels in examples:
        assert ids[0] == tok.bos_id and tok.bos_id not in ids[1:]
        text = tok.decode(ids[1:]).strip()
        assert "Features:" not in text and "Words:" not in text  # the header is gone
        expected = [int(any(f.lower() == s for f in raw[text])) for s in STORY_FEATURES]
        assert labels == expected
    # seeded: the same call gives the same examples; another seed another order
    again = story_examples(corpus.dataset("pretrain-all"), "test", 40, 0, tok, max_len=512)
    assert again == examples
    assert story_examples(corpus.dataset("pretrain-all"), "test", 40, 1, tok, max_len=512) != examples
    short = story_examples(corpus.dataset("pretrain-all"), "test", 5, 0, tok, max_len=16)
    assert all(len(ids) <= 16 for ids, _ in short)


def test_pooled_states_batched_equals_single():
    model = tiny_model(max_seq_len=64, dtype=torch.float64, n_layers=3)
    g = torch.Generator().manual_seed(0)
    seqs = [[1] + torch.randint(3, 8192, (n,), generator=g).tolist() for n in (5, 30, 12, 3, 40)]
    pooled = pooled_states(model, seqs, pool=10, batch_size=3).double()
    assert pooled.shape == (5, 3, 32)
    for i, s in enumerate(seqs):
        hs = model.hidden_states(torch.tensor([s]))
        ref = torch.stack([h[0, -10:].mean(0) for h in hs])  # last 10 (or all, when shorter) positions
        assert torch.allclose(pooled[i], ref.float().double(), atol=1e-6)


def test_probes_find_the_layer_that_holds_the_signal():
    """Only layer 1 carries the labels (signs of fixed projections); the other layers are noise."""
    g = torch.Generator().manual_seed(0)
    n, layers, dim = 800, 3, 16
    x = torch.randn(n, layers, dim, generator=g)
    directions = torch.randn(dim, 6, generator=g)
    y = (x[:, 1] @ directions > 0).long()
    probes = train_probes(x[:600], y[:600], iters=300, lr=3e-2, batch_size=128)
    acc = probe_accuracy(probes.logits(x[600:]), y[600:])
    assert acc.shape == (3, 6)
    assert (acc[1] > 0.9).all(), acc
    assert (acc[0] < 0.75).all() and (acc[2] < 0.75).all(), acc


def test_cli_every_block_and_errors(corpus, tmp_path):
    ckpt = save_tiny_checkpoint(tmp_path / "ckpt.pt", tiny_model(max_seq_len=256, n_layers=3), cache_dir=corpus.cache_dir)
    out = tmp_path / "probe.json"
    proc = run_main("evaluation/probe.py", [f"--checkpoint={ckpt}", "--dataset=pretrain-all", "--num_train=60",
                                            "--num_test=30", "--iters=50", "--device=cpu", f"--out={out}"], check=True)
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(metrics) == {"layers"} and json.loads(out.read_text()) == metrics
    rows = metrics["layers"]
    assert [(r["layer"], r["feature"]) for r in rows] == [(i, f) for i in range(3) for f in
                                                          [next(x for x in FEATURES if x.lower() == s) for s in STORY_FEATURES]]
    assert all(set(r) == {"layer", "feature", "acc"} and 0 <= r["acc"] <= 1 for r in rows)
    assert "majority baseline" in proc.stdout
    base = [f"--checkpoint={ckpt}", "--device=cpu"]
    assert_one_line_error(run_main("evaluation/probe.py", base + ["--dataset=no-such-set"]), "pretokenize")
    assert_one_line_error(run_main("evaluation/probe.py", base + ["--dataset=pretrain-all", "--num_train=0"]),
                          "--num_train")
