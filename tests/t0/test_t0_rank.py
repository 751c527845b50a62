"""evaluation/eval_rank.py: padded-batch scores equal one-at-a-time scores and an independent
log-softmax reference, a planted answer is ranked first, ties go to the lowest index, medians,
and the command line on a checkpoint."""
import json

import numpy as np
import pytest
import torch
from conftest import TOK8192, assert_one_line_error, run_main, save_tiny_checkpoint
from conftest import tiny_model as shared_tiny_model
from torch import nn

from model import ModelArgs
from tinylab.data.tokenizer import Tokenizer
from tinylab.t0.encode import ExampleEncoder
from tinylab.t0.rank_eval import rank_accuracy, rank_examples, score_choices, summarize


def tiny_model(vocab=67, max_seq_len=40):
    return shared_tiny_model(vocab_size=vocab, max_seq_len=max_seq_len, dtype=torch.float64)


def random_pairs(n, seed=0, vocab=67):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab, int(rng.integers(2, 15))).tolist(), rng.integers(0, vocab, int(rng.integers(1, 6))).tolist())
            for _ in range(n)]


def reference_score(model, prompt, choice, prefixlm):
    """log p(choice | prompt) from a plain forward of the one sequence (causal: no mask at all)."""
    seq = torch.tensor(prompt + choice)
    x = seq[None, :-1]
    if prefixlm:
        n = x.shape[1]
        q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
        mask = (k <= q) | ((q < len(prompt)) & (k < len(prompt)))
        logits = model(x, attn_mask=mask[None], all_logits=True)[0]
    else:
        logits = model(x, all_logits=True)[0]
    logp = torch.log_softmax(logits, -1)
    return sum(logp[len(prompt) - 1 + j, c].item() for j, c in enumerate(choice))


@pytest.mark.parametrize("prefixlm", [False, True])
def test_batched_scores_equal_one_at_a_time(prefixlm):
    model, pairs = tiny_model(), random_pairs(23)
    batched, lengths = score_choices(model, pairs, batch_size=8, prefixlm=prefixlm)
    single, _ = score_choices(model, pairs, batch_size=1, prefixlm=prefixlm)
    assert np.allclose(batched, single, atol=1e-10, rtol=0)
    ref = [reference_score(model, p, c, prefixlm) for p, c in pairs]
    assert np.allclose(batched, ref, atol=1e-10, rtol=0)
    assert list(lengths) == [len(c) for _, c in pairs]


def test_too_long_prompts_lose_tokens_after_bos():
    model = tiny_model(max_seq_len=12)
    prompt, choice = list(range(1, 20)), [5, 6]
    got, _ = score_choices(model, [(prompt, choice)])
    kept = [1] + prompt[len(prompt) + len(choice) - 13 + 1:]
    assert len(kept) + len(choice) == 13
    assert got[0] == pytest.approx(reference_score(model, kept, choice, False), abs=1e-10)


class Planted(nn.Module):
    """A 'model' whose next-token distribution always prefers token `fav` (and then `second`)."""

    def __init__(self, vocab, fav, second):
        super().__init__()
        self.params = ModelArgs(vocab_size=vocab, max_seq_len=64)
        self.bias = nn.Parameter(torch.zeros(vocab, dtype=torch.float64))
        with torch.no_grad():
            self.bias[fav], self.bias[second] = 5.0, 2.0

    def forward(self, tokens, segment_ids=None, prefix_mask=None, position_ids=None, all_logits=False):
        return self.bias.expand(*tokens.shape, -1)


def test_planted_answer_ranks_first_and_ties_go_to_the_lowest_index():
    model = Planted(20, fav=7, second=3)
    examples = [([1, 2, 3], [[4], [7], [3]], 1), ([1, 9], [[7, 7], [4]], 0), ([1], [[3], [7]], 1)]
    r = rank_accuracy(model, examples)
    assert r["acc"] == 1.0 and r["n"] == 3
    # equal scores: the first choice wins
    assert rank_accuracy(model, [([1], [[5], [6]], 0)])["acc"] == 1.0
    assert rank_accuracy(model, [([1], [[5], [6]], 1)])["acc"] == 0.0
    # length normalisation: [3, 3] has the better mean log-prob, [19] the better sum
    r = rank_accuracy(model, [([1], [[3, 3], [19]], 0)])
    assert (r["acc"], r["acc_norm"]) == (0.0, 1.0)


def test_rank_examples_use_the_training_target_convention():
    tok = Tokenizer(TOK8192)
    enc = ExampleEncoder(tok, max_input_len=6)
    rows = [{"inputs": "Is the sky blue today in the town?", "targets": " no", "answer_choices": ["yes", "no"]},
            {"inputs": "Pick one.", "targets": "maybe", "answer_choices": ["yes", "no"]},  # target not a choice
            {"inputs": "Nothing to rank.", "targets": "x"}]
    examples, skipped = rank_examples(rows, enc)
    assert skipped == 2 and len(examples) == 1
    prompt, choices, gold = examples[0]
    assert gold == 1 and len(prompt) == 6 and prompt[0] == tok.bos_id
    assert tok.decode(prompt + choices[1]) == tok.decode(prompt) + " no"  # one space, no EOS
    assert all(tok.eos_id not in c for c in choices)
    examples, _ = rank_examples(rows, enc, score_eos=True)
    assert all(c[-1] == tok.eos_id for c in examples[0][1])


def test_medians():
    accs = {"a1": 0.2, "a2": 0.6, "a3": 0.5, "b": 0.9, "c": 0.1}
    out = summarize(accs, held_out={"b", "c"}, datasets={"a1": "a", "a2": "a", "a3": "a"})
    assert out["rank_acc_median"] == 0.5
    assert out["rank_acc_median/held_out"] == pytest.approx(0.5) and out["rank_acc_median/seen"] == 0.5
    assert out["rank_acc_dataset/a"] == 0.5 and "rank_acc_dataset/b" not in out


def test_command_line(tmp_path):
    tok = Tokenizer(TOK8192)
    model = shared_tiny_model(dim=16, n_layers=1, n_heads=2, n_kv_heads=None, vocab_size=tok.vocab_size, max_seq_len=64)
    save_tiny_checkpoint(tmp_path / "base" / "ckpt.pt", model)  # its config names TOK8192
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"inputs": f"Is {i} even?", "targets": "yes" if i % 2 == 0 else "no",
                                        "answer_choices": ["yes", "no"]}) + "\n" for i in range(10)))
    out = tmp_path / "rank.json"
    proc = run_main("evaluation/eval_rank.py", [f"--checkpoint={tmp_path / 'base'}", f"--data=even={data}",
                                                "--device=cpu", f"--out={out}"], check=True)
    assert "even" in proc.stdout and "rank_acc_median" in proc.stdout
    res = json.loads(out.read_text())
    assert res["groups"]["even"]["n"] == 10 and 0.0 <= res["summary"]["rank_acc_median"] <= 1.0
    assert_one_line_error(run_main("evaluation/eval_rank.py", [f"--checkpoint={tmp_path / 'base'}", "--device=cpu"]),
                          "nothing to evaluate")
