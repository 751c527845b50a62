"""evaluation/eval_lambada.py: whole-word accuracy on a handmade file whose answers are known (a
lookup model that gets chosen continuation tokens wrong), the target-word perplexity, batched ==
unbatched scores, the CLI's keys and errors."""
import json
import math

import pytest
import torch
from conftest import TOK8192, assert_one_line_error, run_main, save_tiny_checkpoint, tiny_model
from torch import nn

from tinylab.data.tokenizer import Tokenizer
from tinylab.eval.lambada import lambada_items, score_items, summarize

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


# ---------------------------------------------------------------------- staged-training's interface
# (docs/evaluation.md, "The staged-training repository's commands")

def lambada(argv, **kw):
    return run_main("evaluation/eval_lambada.py", argv, **kw)


def last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


def originals_reading(path, preprocess=False):
    """staged-training's main(), verbatim but for eval -> ast.literal_eval (same strings)."""
    import ast
    ds_raw = open(path, encoding="utf-8").read()
    if preprocess:
        for a in ("\u201c", "\u201d", "''", "``"):
            ds_raw = ds_raw.replace(a, '"')
        ds_raw = "\n" + ds_raw.strip()
    ds = ds_raw.strip().split("\n")
    if path.endswith(".jsonl"):
        ds = [ast.literal_eval('"""' + line[len('{"text": "'):-len('"}')] + '"""') for line in ds]
    return ds


def originals_score(model, encode, decode, lines, jeff=False, ignore_fragments=False):
    """staged-training's score_batch over batch-of-one, verbatim in logic: the passage encoded
    whole, right-padded, the last token's greedy prediction; a fragment when the last token's
    decoding is not the last word. Returns (accuracy, number scored, fragments)."""
    errors = total = fragments = 0
    for line in lines:
        line = line.strip()
        if jeff:
            line = "\n" + line
        enc = encode(line)
        frag = decode(enc[-1:]).strip() != line.split()[-1].strip()
        fragments += frag
        with torch.no_grad():
            logits = model(torch.tensor([enc]), all_logits=True)[0]
        if ignore_fragments and frag:
            continue
        total += 1
        errors += int(logits[len(enc) - 2].argmax()) != enc[-1]
    return 1 - errors / total, total, fragments


def greedy_passages(model, tok, n):
    """Passages whose last token is the model's own greedy prediction (so the original's accuracy
    is known to be 1 on them): a wikitext line's first words, then the predicted piece, kept when
    it is a whole word (a "▁word" piece) and the text re-encodes to the same tokens."""
    from conftest import WIKITEXT
    out = []
    for row in open(WIKITEXT, encoding="utf-8"):
        words = row.split()
        for k in range(4, min(len(words), 16), 3):
            ctx = " ".join(words[:k])
            ids = tok.encode(ctx, bos=True)
            with torch.no_grad():
                t = int(model(torch.tensor([ids]), all_logits=True)[0, -1].argmax())
            line = tok.decode(ids[1:] + [t]).strip()
            if (tok.sp.id_to_piece(t).startswith("\u2581") and tok.decode([t]).strip().isalpha()
                    and tok.encode(line, bos=True) == ids + [t]):
                out.append(line)
                break
        if len(out) == n:
            return out
    raise AssertionError("the excerpt gave too few greedy passages")


def test_original_reading_and_preprocess(tmp_path):
    """--path is read as the original read it: .jsonl lines sliced and evaluated as string
    literals (escapes, quotes, unicode), --preprocess applied to the whole text first."""
    from tinylab.eval.lambada import read_original_passages
    texts = ['He said \u201chello\u201d to the dog', "Tab\there and a \\ backslash then Zed",
             "''Quoted'' ``twice'' story ends", 'A "plain" quote and caf\u00e9']
    path = tmp_path / "lambada_test.jsonl"
    # unescaped unicode, as OpenAI's file has it (an escaped \u201c is not a curly quote to --preprocess)
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    for pre in (False, True):
        assert read_original_passages(str(path), pre) == originals_reading(str(path), pre)
    assert read_original_passages(str(path))[1] == texts[1]
    assert read_original_passages(str(path), True)[0] == 'He said "hello" to the dog'
    plain = tmp_path / "lambada.txt"
    plain.write_text("first passage here\n\nsecond one here\n", encoding="utf-8")
    assert read_original_passages(str(plain)) == ["first passage here", "second one here"]


def test_original_flags_give_the_originals_accuracy(tmp_path):
    """--checkpoint-file --path --batch: the original's last-token accuracy (1 on passages made
    to end in the model's greedy token, 0 or more elsewhere) and the whole-word accuracy, named;
    --ignore-fragments, --jeff_suggestion, --max-batches, --dryrun as the original meant them."""
    tok = Tokenizer(TOK8192)
    model = tiny_model(max_seq_len=64)
    ckpt = save_tiny_checkpoint(tmp_path / "ckpt.pt", model)
    greedy = greedy_passages(model, tok, 3)
    lines = greedy + [p for p, _ in PASSAGES]
    path = tmp_path / "lambada_test.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    base = ["--checkpoint-file", ckpt, "--path", str(path), "--device=cpu"]

    def encode(s):
        return tok.encode(s, bos=True)
    m = last_json(lambada(base + ["--batch", "4"], check=True))
    ref_acc, ref_n, ref_frag = originals_score(model, encode, tok.decode, lines)
    assert set(m) == {"acc", "last_token_acc", "ppl", "n", "fragments"}
    assert m["n"] == ref_n == len(lines) and m["fragments"] == ref_frag > 0  # the made-up words are fragments
    assert m["last_token_acc"] == pytest.approx(ref_acc) and m["last_token_acc"] >= 3 / len(lines)
    # the whole-word test, independently: every token of the last word is the greedy prediction
    items, _ = lambada_items(lines, tok)
    whole = []
    for ctx, cont in items:
        seq = ctx + cont
        with torch.no_grad():
            pred = model(torch.tensor([seq]), all_logits=True)[0].argmax(-1).tolist()
        whole.append(all(pred[len(ctx) - 1 + i] == cont[i] for i in range(len(cont))))
    assert m["acc"] == pytest.approx(sum(whole) / len(whole)) and sum(whole) >= 3
    # batch size changes nothing
    assert last_json(lambada(base + ["--batch", "1"], check=True)) == pytest.approx(m)

    m = last_json(lambada(base + ["--ignore-fragments"], check=True))
    ref_acc, ref_n, _ = originals_score(model, encode, tok.decode, lines, ignore_fragments=True)
    assert m["n"] == ref_n < len(lines) and m["last_token_acc"] == pytest.approx(ref_acc)
    m = last_json(lambada(base + ["--jeff_suggestion"], check=True))
    assert m["last_token_acc"] == pytest.approx(originals_score(model, encode, tok.decode, lines, jeff=True)[0])
    m = last_json(lambada(base + ["--batch", "2", "--max-batches", "2"], check=True))
    assert m["n"] == 4 and m["last_token_acc"] == pytest.approx(originals_score(model, encode, tok.decode, lines[:4])[0])
    proc = lambada(base + ["--dryrun"], check=True)
    d = last_json(proc)
    assert d["passages"] == len(lines) and d["n"] == len(lines) and "nothing scored" in proc.stdout
    assert d["tokens"] == sum(len(encode(t)) for t in lines)


def test_original_model_name_is_an_hf_causal_lm(tmp_path):
    """--model-name: a local tiny GPT-2 through transformers, its own tokenizer (no BOS added):
    the original's numbers, computed by its loop on the HF model itself."""
    from conftest import save_tiny_gpt2
    from transformers import AutoTokenizer
    folder, hf = save_tiny_gpt2(tmp_path / "gpt2")
    hf_tok = AutoTokenizer.from_pretrained(folder)
    lines = [p for p, _ in PASSAGES]
    path = tmp_path / "lambada.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    m = last_json(lambada(["--model-name", folder, "--path", str(path), "--batch", "3", "--device=cpu"], check=True))

    def logits_of(tokens, all_logits=True):
        return hf(input_ids=tokens).logits
    ref_acc, ref_n, ref_frag = originals_score(logits_of, hf_tok.encode, hf_tok.decode, lines)
    assert m["n"] == ref_n and m["fragments"] == ref_frag == len(lines)  # byte-level: every last token is a byte
    assert m["last_token_acc"] == pytest.approx(ref_acc)


def test_original_interface_bad_input(tmp_path):
    ckpt = save_tiny_checkpoint(tmp_path / "ckpt.pt")
    path = tmp_path / "lambada_test.jsonl"
    path.write_text(json.dumps({"text": "The dog ran home"}) + "\n", encoding="utf-8")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_one_line_error(lambada(["--checkpoint-file", ckpt, "--path", str(tmp_path / "none.jsonl")]), "not found")
    assert_one_line_error(lambada(["--checkpoint-file", ckpt, "--path", str(path), "--batch", "0"]), "--batch")
    assert_one_line_error(lambada(["--checkpoint-file", ckpt, f"--data={path}", "--path", str(path)]),
                          "--data", "staged-training's", "the flags of one")
    assert_one_line_error(lambada(["--checkpoint-file", str(tmp_path / "no.pt"), "--path", str(path)]), "not found")
    assert_one_line_error(lambada(["--checkpoint-file", ckpt, "--model-name", "gpt2", "--path", str(path)]),
                          "--model-name")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json at all\n", encoding="utf-8")
    assert_one_line_error(lambada(["--checkpoint-file", ckpt, "--path", str(bad)]), "bad.jsonl:1")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + ["bad.jsonl"])
