"""evaluation/compare_checkpoints.py and tinylab/eval/compare.py: linear CKA against the HSIC formula
with explicit centering matrices and its invariances, the relative weight change against a hand
computation on saved tiny models, the CLI end to end (dataset and file prompts, JSON, table, PNG;
CKA recomputed from unpadded forward passes) and bad input (one line, nothing written)."""
import json
import math
import os

import numpy as np
import pytest
import torch
from conftest import TOK8192, assert_one_line_error, run_main, save_tiny_checkpoint, tiny_model

from tinylab.data.tokenizer import Tokenizer
from tinylab.eval.compare import default_pairs, linear_cka, weight_changes
from tinylab.eval.probes import story_examples

CLI = "evaluation/compare_checkpoints.py"


def hsic_cka(x, y):
    """Kornblith et al. 2019 eq. 3-4, as written: K = XX^T, L = YY^T, H = I - 11^T/n,
    HSIC(K, L) = tr(KHLH) / (n-1)^2, CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)); numpy float64."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = x @ x.T, y @ y.T

    def hsic(a, b):
        return np.trace(a @ h @ b @ h) / (n - 1) ** 2
    return hsic(k, l) / math.sqrt(hsic(k, k) * hsic(l, l))


def test_linear_cka_equals_the_hsic_reference():
    g = torch.Generator().manual_seed(0)
    for n, d1, d2 in [(40, 7, 5), (25, 3, 12), (60, 16, 16)]:
        x = torch.randn(n, d1, generator=g, dtype=torch.float64) + 2.0  # not centred: the centering matters
        y = x[:, :min(d1, d2)] @ torch.randn(min(d1, d2), d2, generator=g, dtype=torch.float64) \
            + 0.5 * torch.randn(n, d2, generator=g, dtype=torch.float64)
        assert abs(linear_cka(x, y) - hsic_cka(x, y)) < 1e-10
        assert abs(linear_cka(x.float(), y.float()) - hsic_cka(x, y)) < 1e-5  # float32 inputs are upcast
        assert 0 < linear_cka(x, y) < 1


def test_linear_cka_invariances():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 8, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))
    assert abs(linear_cka(x, x) - 1) < 1e-12
    assert abs(linear_cka(x, x @ q) - 1) < 1e-12  # orthogonal transform
    assert abs(linear_cka(x, 3.7 * x) - 1) < 1e-12  # isotropic scaling
    assert abs(linear_cka(x, x + 5.0) - 1) < 1e-12  # translation (the centering)
    assert abs(linear_cka(x, x @ q) - linear_cka(x @ q, x)) < 1e-12  # symmetric
    # not invariant to an anisotropic scaling, and unrelated representations are far from 1
    assert linear_cka(x, x * torch.tensor([10.0] + [0.1] * 7, dtype=torch.float64)) < 0.5
    assert linear_cka(x, torch.randn(200, 8, generator=g, dtype=torch.float64)) < 0.2
    assert math.isnan(linear_cka(x, torch.ones(200, 3)))  # a constant representation: undefined


def test_relative_change_by_hand_untied():
    """One tensor changed by a known matrix; every other tensor's change is exactly 0; the
    untied output head is its own row."""
    a = tiny_model(n_layers=3, tie_embeddings=False, dtype=torch.float64)
    b = tiny_model(n_layers=3, tie_embeddings=False, dtype=torch.float64)
    with torch.no_grad():
        b.layers[2].attention.wk.weight.add_(0.03)
    w = a.layers[2].attention.wk.weight.tolist()
    expected = 0.03 * math.sqrt(sum(len(r) for r in w)) / math.sqrt(sum(v * v for r in w for v in r))
    rows, whole = weight_changes(a, b)
    by_name = {r["param"]: r for r in rows}
    assert by_name["layers.2.attention.wk.weight"]["rel_change"] == pytest.approx(expected, rel=1e-12)
    assert (by_name["layers.2.attention.wk.weight"]["row"], by_name["layers.2.attention.wk.weight"]["module"]) == \
        ("layer 2", "attention.wk")
    assert all(r["rel_change"] == 0 for n, r in by_name.items() if n != "layers.2.attention.wk.weight")
    assert by_name["output.weight"]["row"] == "output" and by_name["tok_embeddings.weight"]["row"] == "embedding"
    total = sum(v * v for p in a.state_dict().values() for v in p.flatten().tolist())
    assert whole == pytest.approx(0.03 * math.sqrt(len(w) * len(w[0])) / math.sqrt(total), rel=1e-10)
    assert default_pairs(2) == [(0, 1)] and default_pairs(4) == [(0, 1), (1, 2), (2, 3), (0, 2), (0, 3)]


@pytest.fixture
def ckpts(tiny_corpus, tmp_path):
    """a, b (= a with layer 1's feed_forward.w2 scaled by 1.5), c (another seed), as run folders
    whose config names tiny_corpus and its pretrain-all dataset."""
    config = {"vocab_size": 8192, "vocab_source": "custom", "data_cache_dir": tiny_corpus.cache_dir,
              "dataset_name": "pretrain-all"}
    a = tiny_model(n_layers=3, max_seq_len=128)
    b = tiny_model(n_layers=3, max_seq_len=128)
    with torch.no_grad():
        b.layers[1].feed_forward.w2.weight.mul_(1.5)
    c = tiny_model(seed=1, n_layers=3, max_seq_len=128)
    for name, m in (("a", a), ("b", b), ("c", c)):
        save_tiny_checkpoint(tmp_path / name / "ckpt.pt", m, config=config, iter_num=7)
    return tmp_path, (a, b, c)


@pytest.mark.slow
def test_cli_end_to_end(ckpts, tiny_corpus):
    root, (a, b, c) = ckpts
    out, png = root / "cmp.json", root / "cmp.png"
    proc = run_main(CLI, [str(root / "a"), str(root / "b" / "ckpt.pt"), str(root / "c"), "--num_prompts=6",
                          "--device=cpu", "--batch_size=4", f"--out={out}", f"--plot={png}"], check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == result
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [ck["label"] for ck in result["checkpoints"]] == ["a", "b", "c"]
    assert [(p["a"], p["b"]) for p in result["pairs"]] == [("a", "b"), ("b", "c"), ("a", "c")]

    # a -> b: only layers.1.feed_forward.w2 moved, by 0.5 of itself; the states before it are equal
    ab = result["pairs"][0]
    changed = {w["param"]: w["rel_change"] for w in ab["weights"] if w["rel_change"] != 0}
    assert list(changed) == ["layers.1.feed_forward.w2.weight"]
    assert changed["layers.1.feed_forward.w2.weight"] == pytest.approx(0.5, rel=1e-6)
    assert "output.weight" not in {w["param"] for w in ab["weights"]}  # tied: it is tok_embeddings
    cka = {s["state"]: s["cka"] for s in ab["cka"]}
    assert list(cka) == ["embedding", "layer 0", "layer 1", "layer 2"]
    assert cka["embedding"] == pytest.approx(1, abs=1e-12) and cka["layer 0"] == pytest.approx(1, abs=1e-12)
    assert cka["layer 1"] < 1 - 1e-9

    # the prompts: 6 whole test examples of the first checkpoint's dataset, and CKA recomputed from
    # forward passes of one sequence at a time (no padding) with the HSIC reference
    tok = Tokenizer(tiny_corpus.tokenizer_model)
    seqs = [ids for ids, _ in story_examples(tiny_corpus.dataset_dir, "test", 6, 1337, tok, 128, header=True)]
    assert "Features:" in tok.decode(seqs[0]) or "Words:" in tok.decode(seqs[0])
    assert result["prompts"]["n"] == 6 and result["tokens"] == sum(len(s) for s in seqs)

    def states(m, layer):
        with torch.no_grad():
            hs = [torch.cat([(m.tok_embeddings(torch.tensor([s])) if layer == 0 else
                              m.hidden_states(torch.tensor([s]))[layer - 1])[0] for s in seqs])]
        return hs[0].numpy()
    for layer, name in enumerate(["embedding", "layer 0", "layer 1", "layer 2"]):
        got = {s["state"]: s["cka"] for s in result["pairs"][1]["cka"]}[name]
        assert got == pytest.approx(hsic_cka(states(b, layer), states(c, layer)), abs=1e-5)
    table = proc.stdout
    assert "a -> b: relative weight change" in table and "layer 2" in table and "final norm" in table

    # seeded: the same prompts give the same numbers; --force replaces an existing --out
    again = run_main(CLI, [str(root / "a"), str(root / "b"), str(root / "c"), "--num_prompts=6", "--device=cpu",
                           f"--out={out}", "--force", "--pairs=1:2", "--labels=x,y,z"], check=True)
    r2 = json.loads(out.read_text())
    assert [(p["a"], p["b"]) for p in r2["pairs"]] == [("y", "z")]
    assert [s["cka"] for s in r2["pairs"][0]["cka"]] == pytest.approx([s["cka"] for s in result["pairs"][1]["cka"]],
                                                                     abs=1e-6)  # other batches, same numbers
    assert "wrote" not in again.stdout  # no --plot, no PNG


def test_cli_prompt_file(ckpts, tmp_path):
    root, _ = ckpts
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time there was a dog.\n\nThe cat sat on the mat.\nLily liked to play.\n")
    proc = run_main(CLI, [str(root / "a"), str(root / "b"), f"--prompts={prompts}", "--num_prompts=2",
                          "--device=cpu"], check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    tok = Tokenizer(TOK8192)
    want = tok.encode("Once upon a time there was a dog.") + tok.encode("The cat sat on the mat.")
    assert result["prompts"] == {"source": f"file {prompts}", "n": 2} and result["tokens"] == len(want)


def test_bad_input(ckpts, tmp_path):
    root, _ = ckpts
    a, b = str(root / "a"), str(root / "b")
    other = save_tiny_checkpoint(root / "wide" / "ckpt.pt", tiny_model(n_layers=2, dim=64))
    base = ["--device=cpu", "--num_prompts=2"]
    proc = run_main(CLI, [a, other] + base)
    assert_one_line_error(proc, "different shapes", "dim=32 n_layers=3", "dim=64 n_layers=2")
    assert_one_line_error(run_main(CLI, [a] + base), "at least two checkpoints")
    assert_one_line_error(run_main(CLI, base), "at least two checkpoints")
    assert_one_line_error(run_main(CLI, [a, str(root / "missing.pt")] + base), "checkpoint not found", "missing.pt")
    assert_one_line_error(run_main(CLI, [a, str(tmp_path)] + base), "checkpoint not found")
    assert_one_line_error(run_main(CLI, [a, b, "--pairs=0:2"] + base), "--pairs=0:2", "only 2 checkpoints")
    assert_one_line_error(run_main(CLI, [a, b, "--pairs=1:1"] + base), "--pairs")
    assert_one_line_error(run_main(CLI, [a, b, "--labels=x"] + base), "--labels")
    assert_one_line_error(run_main(CLI, [a, b, "--dataset=pretrain-all", "--prompts=p.txt"] + base), "--prompts")
    assert_one_line_error(run_main(CLI, [a, b, "--prompts=nope.txt"] + base), "nope.txt")
    assert_one_line_error(run_main(CLI, [a, b, "--dataset=no-such-set"] + base), "no-such-set")
    # an existing output without --force: refused before any work, nothing else written
    out, png = tmp_path / "old.json", tmp_path / "new.png"
    out.write_text('{"keep": "me"}\n')
    before = sorted(os.listdir(tmp_path))
    assert_one_line_error(run_main(CLI, [a, b, f"--out={out}", f"--plot={png}"] + base), "--out", "--force")
    # a PNG over a JSON file: another kind, never replaced, not even with --force
    assert_one_line_error(run_main(CLI, [a, b, f"--plot={out}", "--force"] + base), "--plot", "JSON", "never replaced")
    assert_one_line_error(run_main(CLI, [a, b, f"--out={png}", f"--plot={png}", "--force"] + base), "same file")
    assert_one_line_error(run_main(CLI, [a, other, f"--out={png}"] + base), "different shapes")
    assert sorted(os.listdir(tmp_path)) == before and out.read_text() == '{"keep": "me"}\n'
