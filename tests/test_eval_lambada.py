"""evaluation/eval_lambada.py: whole-word accuracy on a handmade file whose answers are known (a
lookup model that gets chosen continuation tokens wrong), the target-word perplexity, batched ==
unbatched scores, the CLI's keys and errors."""
import json
import math

import pytest
import torch
from conftest import TOK8192, assert_one_line_error, run_main, save_tiny_checkpoint, tiny_model
from torch import nn

from tinylab.lambada import lambada_items, score_items, summarize
from tinylab.tokenizer import Tokenizer

# (passage, which continuation tokens the lookup model gets wrong: none / the first / the last)
PASSAGES = [
    ("The dog ran to the park and played with the ball", None),
    ("She opened the door and saw her friend Zanzibarquette", None),
    ("He looked at the map and pointed to Quixotrellia", "first"),
    ("They sailed across the sea to reach Blorptavonia", "last"),
    ("Mia wanted to drink a glass of milk", "last"),
    ("Tom gave the cat some fish", None),
]


class LookupLM(nn.Module):
    """Predicts a fixed next token for each exact prefix it knows (probability 1/2, the rest
    spread evenly), else uniform: every log-probability and greedy choice is known in advance."""

    def __init__(self, vocab, table):
        super().__init__()
        self.vocab, self.table = vocab, table
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, tokens, all_logits=False):
        B, T = tokens.shape
        logits = torch.zeros(B, T, self.vocab, dtype=torch.float64)
        for b in range(B):
            for t in range(T):
                nxt = self.table.get(tuple(tokens[b, :t + 1].tolist()))
                if nxt is not None:
                    logits[b, t] = math.log(0.5 / (self.vocab - 1))
                    logits[b, t, nxt] = math.log(0.5)
        return logits


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(TOK8192)


def build_lookup(items, tok):
    table, expected = {}, []
    for (ctx, cont), (_, miss) in zip(items, PASSAGES):
        seq = ctx + cont
        logp, right = 0.0, []
        for i in range(len(cont)):
            prefix = tuple(seq[:len(ctx) + i])
            wrong = (miss == "first" and i == 0) or (miss == "last" and i == len(cont) - 1)
            table[prefix] = (cont[i] + 1) % tok.vocab_size if wrong else cont[i]
            logp += math.log(0.5 / (tok.vocab_size - 1)) if wrong else math.log(0.5)
            right.append(not wrong)
        expected.append((logp, all(right), right[-1]))
    return LookupLM(tok.vocab_size, table), expected


def test_items_split_last_word(tok):
    items, skipped = lambada_items([p for p, _ in PASSAGES] + ["oneword"], tok)
    assert skipped == 1 and len(items) == len(PASSAGES)
    for (ctx, cont), (text, _) in zip(items, PASSAGES):
        context, word = text.rsplit(" ", 1)
        assert ctx == tok.encode(context, bos=True) and ctx + cont == tok.encode(text, bos=True)
        assert tok.decode(cont).strip() == word
    assert len(items[1][1]) > 2 and len(items[2][1]) > 2 and len(items[3][1]) > 2  # multi-token words


def test_whole_word_accuracy_and_ppl(tok):
    items, _ = lambada_items([p for p, _ in PASSAGES], tok)
    model, expected = build_lookup(items, tok)
    results = score_items(model, items, max_len=256, batch_size=4)
    assert [r[1] for r in results] == [e[1] for e in expected] == [True, True, False, False, False, True]
    # the lenient last-token figure would count the passage whose FIRST word piece was wrong
    assert [r[2] for r in results] == [True, True, True, False, False, True]
    for r, e in zip(results, expected):
        assert r[0] == pytest.approx(e[0], rel=1e-12)
    m = summarize(results)
    assert m["acc"] == pytest.approx(3 / 6) and m["n"] == 6
    assert m["ppl"] == pytest.approx(math.exp(-sum(e[0] for e in expected) / 6), rel=1e-12)


def test_batched_equals_unbatched(tok):
    model = tiny_model(max_seq_len=64, dtype=torch.float64)
    items, _ = lambada_items([p for p, _ in PASSAGES], tok)
    one = score_items(model, items, max_len=64, batch_size=1)
    many = score_items(model, items, max_len=64, batch_size=4)
    for a, b in zip(one, many):
        assert a[0] == pytest.approx(b[0], rel=1e-10) and a[1:] == b[1:]
    # a context longer than the model keeps its last tokens and still scores the whole word
    long = [(items[0][0] + items[0][0] * 20, items[0][1])]
    assert len(score_items(model, long, max_len=64)) == 1


def test_cli_jsonl_and_errors(tmp_path):
    ckpt = save_tiny_checkpoint(tmp_path / "ckpt.pt", cache_dir=str(tmp_path))
    data = tmp_path / "lambada.jsonl"
    data.write_text("".join(json.dumps({"text": p}) + "\n" for p, _ in PASSAGES))
    out = tmp_path / "m.json"
    proc = run_main("evaluation/eval_lambada.py", [f"--checkpoint={ckpt}", f"--tokenizer_model={TOK8192}",
                                                    f"--data={data}", f"--out={out}", "--device=cpu"], check=True)
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(metrics) == {"acc", "ppl", "n"} and metrics["n"] == len(PASSAGES)
    assert json.loads(out.read_text()) == metrics and 0 <= metrics["acc"] <= 1 and metrics["ppl"] > 1
    assert "last_token_acc" in proc.stdout  # the lenient figure, labelled, in the summary only
    base = [f"--checkpoint={ckpt}", f"--tokenizer_model={TOK8192}", "--device=cpu"]

    def lambada(argv):
        return run_main("evaluation/eval_lambada.py", argv)
    assert_one_line_error(lambada(base + [f"--data={tmp_path}/none.jsonl"]), "not found")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"txt": "no text field"}\n')
    assert_one_line_error(lambada(base + [f"--data={bad}"]), "'text'")
    assert_one_line_error(lambada([f"--checkpoint={tmp_path}/no.pt", f"--data={data}"]), "checkpoint not found")
