"""evaluation/eval_harness.py: lm-evaluation-harness tasks on our checkpoint through the LM
adapter (tinylab/eval/harness.py).

A tiny model is trained a few seeded steps on text like the tasks', saved, and exported to an HF
folder with export.py. Four local tasks (multiple choice, multiple choice 2-shot with contexts
longer than the window, rolling perplexity over documents longer than the window, generation
with until ["\\n"] and exact_match) run through two routes: the adapter, and the harness's own
HFLM on the HF export (`lm_eval --model hf`). The routes agree per sample and on every metric;
each of the adapter's numbers is also checked against a re-implementation here with plain
full-sequence forward passes (no batching, no KV cache, no harness code).
"""
import json
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import TOK8192, run_main, save_tiny_checkpoint, tiny_model

from tinylab.data.tokenizer import Tokenizer
from tinylab.eval.harness import evaluate, harness_lm, task_manager

lm_eval = pytest.importorskip("lm_eval")  # requirements-eval.txt (in requirements-dev.txt)
# a model trained for the module, its HF export and four harness runs per route: end to end
pytestmark = pytest.mark.slow

L = 64  # the model's max_seq_len
MAX_GEN = 8
NAMES = ["Lily", "Tom", "Mia", "Ben", "Sue", "Max"]
COLORS = ["red", "blue", "green"]
THINGS = ["ball", "hat", "car", "cup"]
NEXT = {"one": "two", "two": "three", "three": "four", "four": "five", "five": "six", "six": "seven"}
TASKS = ["tiny_mc", "tiny_mc_2shot", "tiny_ppl", "tiny_gen"]
TOL = 1e-4


def mc_docs():
    docs = [{"question": f"{n} has a {c} {t}. The {t} is", "choices": COLORS,
             "label": COLORS.index(c)}
            for i, (n, t) in enumerate(zip(NAMES * 2, THINGS * 3)) for c in [COLORS[i % 3]]]
    long_context = " ".join(f"{n} has a {c} {t}." for n, c, t in zip(NAMES, COLORS * 2, THINGS + THINGS))
    docs.append({"question": long_context * 2 + " The hat is", "choices": COLORS, "label": 1})
    return docs


def stories():
    return [" ".join(f"{n} has a {COLORS[(i + j) % 3]} {t}. The {t} is {COLORS[(i + j) % 3]}."
                     for j, (n, t) in enumerate(zip(NAMES, THINGS * 2))) for i in range(3)]


def ppl_docs():
    s = stories()
    return [{"text": s[0][:40]}, {"text": s[1]}, {"text": s[2] + " " + s[0] + " " + s[1]}, {"text": "The end."}]


def gen_docs():
    return [{"question": f"Q: What comes after {a}?\nA:", "answer": b} for a, b in NEXT.items()]


def task_yaml(name, path, output_type, body):
    return (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    train: {path}\n    test: {path}\n"
            f"output_type: {output_type}\ntraining_split: train\ntest_split: test\n{body}")


def metrics(*entries):
    return "metric_list:\n" + "".join(f"  - metric: {m}\n    aggregation: {agg}\n    higher_is_better: {hib}\n"
                                      for m, agg, hib in entries)


MC_BODY = ('doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
           + metrics(("acc", "mean", "true"), ("acc_norm", "mean", "true")))
PPL_BODY = ('doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
            + metrics(("word_perplexity", "weighted_perplexity", "false"),
                      ("byte_perplexity", "weighted_perplexity", "false"), ("bits_per_byte", "bits_per_byte", "false")))
GEN_BODY = ('doc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["\\n"]\n'
            f"  max_gen_toks: {MAX_GEN}\n  do_sample: false\n" + metrics(("exact_match", "mean", "true")))


def write_tasks(root):
    os.makedirs(root / "tasks")
    for name, docs in [("mc", mc_docs()), ("ppl", ppl_docs()), ("gen", gen_docs())]:
        with open(root / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(d) + "\n" for d in docs)
    specs = [("tiny_mc", "mc", "multiple_choice", MC_BODY), ("tiny_mc_2shot", "mc", "multiple_choice",
                                                               MC_BODY + "num_fewshot: 2\n"),
             ("tiny_ppl", "ppl", "loglikelihood_rolling", PPL_BODY), ("tiny_gen", "gen", "generate_until", GEN_BODY)]
    for name, data, kind, body in specs:
        (root / "tasks" / f"{name}.yaml").write_text(task_yaml(name, root / f"{data}.jsonl", kind, body))
    return str(root / "tasks")


def trained_model(tok, steps=150):
    """A tiny model trained (seeded) on stories and Q/A lines like the tasks', BOS before each."""
    texts = stories() + [f"Q: What comes after {a}?\nA: {b}\n" for a, b in NEXT.items()] * 3
    stream = torch.tensor([t for text in texts for t in tok.encode(text, bos=True)])
    model = tiny_model(seed=0, max_seq_len=L).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - L - 1, (8,), generator=gen)
        x = torch.stack([stream[s:s + L] for s in starts])
        y = torch.stack([stream[s + 1:s + L + 1] for s in starts])
        model(x, y)
        opt.zero_grad()
        model.last_loss.backward()
        opt.step()
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    tok = Tokenizer(TOK8192)
    model = trained_model(tok)
    ckpt = save_tiny_checkpoint(root / "ckpt.pt", model)
    run_main("export.py", [str(root / "hf"), "--version=-1", f"--checkpoint={ckpt}", f"--tokenizer={TOK8192}"],
             check=True)
    include = write_tasks(root)
    manager = task_manager(include, TASKS)  # the four local tasks: lm-eval's own are not indexed
    ours = evaluate(harness_lm(model, tok, batch_size=4), manager, TASKS, bootstrap_iters=0, log_samples=True)
    return dict(root=root, tok=tok, model=model, ckpt=ckpt, hf=str(root / "hf"), include=include,
                manager=manager, ours=ours)


def hf_route(bench, tasks, add_bos_token):
    """The harness's HFLM on the HF export: lm_eval --model hf --model_args
    pretrained=<export>,dtype=float32,add_bos_token=<...> (in-process)."""
    args = dict(pretrained=bench["hf"], dtype="float32", add_bos_token=add_bos_token)
    return lm_eval.simple_evaluate(model="hf", model_args=args, tasks=tasks, task_manager=bench["manager"],
                                   batch_size=4, device="cpu", bootstrap_iters=0, log_samples=True,
                                   random_seed=1234, numpy_random_seed=1234, torch_random_seed=1234,
                                   fewshot_random_seed=1234)


@pytest.fixture(scope="module")
def hf(bench):
    """BOS in front for the loglikelihood and generation tasks (add_bos_token=True); for the
    perplexity task add_bos_token=False, so that BOS is only HFLM's prefix token (with True it
    also scores the BOS its tokenizer adds: test_hf_rolling_with_add_bos_scores_bos_twice)."""
    return {**hf_route(bench, ["tiny_mc", "tiny_mc_2shot", "tiny_gen"], True),
            "ppl": hf_route(bench, ["tiny_ppl"], False)}


def metric(results, task, name):
    return results["results"][task][f"{name},none"]


def sample_values(results, task):
    """Per document (by doc_id): the loglikelihood of each choice / the document, or the generation."""
    def value(resp):  # [(ll, greedy)], [ll] or [text]
        x = resp[0]
        return x[0] if isinstance(x, (list, tuple)) else x
    return {s["doc_id"]: [value(r) for r in s["resps"]] for s in results["samples"][task]}


def close(a, b, tol=TOL):
    return abs(a - b) <= tol * max(1.0, abs(b))


@pytest.mark.parametrize("task,metrics", [("tiny_mc", ["acc", "acc_norm"]), ("tiny_mc_2shot", ["acc", "acc_norm"]),
                                          ("tiny_ppl", ["word_perplexity", "byte_perplexity", "bits_per_byte"]),
                                          ("tiny_gen", ["exact_match"])])
def test_routes_agree(bench, hf, task, metrics):
    """The adapter and lm_eval's HFLM on the HF export: every metric to 1e-4 (relative above 1),
    every per-sample loglikelihood to 1e-4, every generation identical, the same prompts."""
    theirs = hf["ppl"] if task == "tiny_ppl" else hf
    for name in metrics:
        assert close(metric(bench["ours"], task, name), metric(theirs, task, name)), name
    ours_s, theirs_s = sample_values(bench["ours"], task), sample_values(theirs, task)
    assert ours_s.keys() == theirs_s.keys() and ours_s
    for doc_id, values in ours_s.items():
        for a, b in zip(values, theirs_s[doc_id], strict=True):
            assert a == b if isinstance(a, str) else close(a, b), (doc_id, a, b)
    prompts = {s["doc_id"]: s["arguments"] for s in bench["ours"]["samples"][task]}
    assert prompts == {s["doc_id"]: s["arguments"] for s in theirs["samples"][task]}


# ---------------------------------------------------------------------- independent references

def logprobs(model, ids):
    """log p(ids[i+1] | ids[:i+1]) for every i, one plain forward pass."""
    logits = model(torch.tensor([ids[:-1]]), all_logits=True)[0]
    return F.log_softmax(logits.double(), -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def reference_choice_ll(model, tok, context, choice):
    """log p(choice | BOS + context): the context's trailing spaces go to the choice, the pair is
    tokenized whole and split after the context's tokens; a pair longer than L + 1 tokens keeps its
    last L + 1."""
    stripped = context.rstrip()
    choice, context = context[len(stripped):] + choice, stripped
    ctx = tok.encode(context, bos=True)
    whole = tok.encode(context + choice, bos=True)
    cont = whole[len(ctx):]
    ids = whole[-(L + 1):]
    return float(logprobs(model, ids)[-len(cont):].sum())


def test_multiple_choice_matches_reference(bench):
    """Per choice log-likelihoods, acc and acc_norm (the choice's log-likelihood per character),
    0-shot and 2-shot (whose contexts pass the window and are cut on the left)."""
    model, tok = bench["model"], bench["tok"]
    for task in ["tiny_mc", "tiny_mc_2shot"]:
        samples = bench["ours"]["samples"][task]
        hits = hits_norm = 0
        for s in samples:
            context = s["arguments"][0][0]
            choices = s["doc"]["choices"]
            ref = [reference_choice_ll(model, tok, context, " " + c) for c in choices]  # " ": target_delimiter
            got = [r[0][0] for r in s["resps"]]
            assert all(abs(a - b) < 1e-4 for a, b in zip(got, ref, strict=True)), (task, got, ref)
            hits += max(range(3), key=lambda i: ref[i]) == s["doc"]["label"]
            hits_norm += max(range(3), key=lambda i: ref[i] / len(" " + choices[i])) == s["doc"]["label"]
        assert metric(bench["ours"], task, "acc") == pytest.approx(hits / len(samples))
        assert metric(bench["ours"], task, "acc_norm") == pytest.approx(hits_norm / len(samples))
    long_ctx = [len(bench["tok"].encode(s["arguments"][0][0])) for s in bench["ours"]["samples"]["tiny_mc_2shot"]]
    assert max(long_ctx) > L + 1  # the left cut was exercised


def reference_doc_ll(model, bos_id, t):
    """A document's log-likelihood: its tokens `t` in consecutive chunks of L predicted tokens; the
    first chunk sees BOS and its own earlier tokens, each later full chunk also the one token before
    it, the last partial chunk the L tokens before each of its tokens' ends."""
    total, n = 0.0, len(t)
    for s in range(0, n, L):
        e = min(s + L, n)
        if s == 0:
            ids = [bos_id] + t[:e]
        elif e - s == L:
            ids = t[s - 1:e]
        else:
            ids = t[e - L - 1:e]
        total += float(logprobs(model, ids)[-(e - s):].sum())
    return total


def test_perplexity_matches_reference(bench):
    """Per-document log-likelihoods and the three metrics, from their definitions: word
    perplexity exp(-sum ll / words), byte perplexity exp(-sum ll / UTF-8 bytes), bits per byte."""
    model, tok = bench["model"], bench["tok"]
    docs = [d["text"] for d in ppl_docs()]
    assert max(len(tok.encode(d, bos=False)) for d in docs) > 2 * L  # three windows or more
    ref = [reference_doc_ll(model, tok.bos_id, tok.encode(d, bos=False)) for d in docs]
    got = sample_values(bench["ours"], "tiny_ppl")
    for i, r in enumerate(ref):  # float32 scoring vs the float64 log-softmax here
        assert close(got[i][0], r, 1e-5), (i, got[i], r)
    words = sum(len(re.split(r"\s+", d)) for d in docs)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    ours = bench["ours"]
    assert metric(ours, "tiny_ppl", "word_perplexity") == pytest.approx(math.exp(-sum(ref) / words), rel=1e-5)
    assert metric(ours, "tiny_ppl", "byte_perplexity") == pytest.approx(math.exp(-sum(ref) / nbytes), rel=1e-5)
    assert metric(ours, "tiny_ppl", "bits_per_byte") == pytest.approx(-sum(ref) / nbytes / math.log(2), rel=1e-5)


def reference_generation(model, tok, prompt):
    """Greedy, one full forward pass per new token: BOS + prompt (cut on the left to L - MAX_GEN
    tokens), until EOS, MAX_GEN tokens or a newline in the text."""
    ids = tok.encode(prompt, bos=True)[-(L - MAX_GEN):]
    new = []
    for _ in range(MAX_GEN):
        nxt = int(model(torch.tensor([ids + new]), all_logits=True)[0, -1].argmax())
        if nxt == tok.eos_id:
            break
        new.append(nxt)
    return tok.decode(new).split("\n")[0]


def test_generation_matches_reference(bench):
    model, tok = bench["model"], bench["tok"]
    samples = bench["ours"]["samples"]["tiny_gen"]
    refs = [reference_generation(model, tok, s["arguments"][0][0]) for s in samples]
    assert [s["resps"][0][0] for s in samples] == refs
    hits = sum(r == s["target"] for r, s in zip(refs, samples))
    assert metric(bench["ours"], "tiny_gen", "exact_match") == pytest.approx(hits / len(samples))
    assert hits > 0  # the trained model answers some: exact_match is not trivially 0


def test_hf_rolling_with_add_bos_scores_bos_twice(bench, hf):
    """HFLM with add_bos_token=True encodes each document with its own BOS and still puts the
    prefix BOS in front: it scores the tokens [BOS] + document after a BOS, so each document also
    pays log p(BOS | BOS) and its tokens see two BOS (the adapter and add_bos_token=False score
    the document's tokens alone, after one BOS)."""
    twice = hf_route(bench, ["tiny_ppl"], True)
    model, tok = bench["model"], bench["tok"]
    for doc_id, values in sample_values(twice, "tiny_ppl").items():
        t = tok.encode(ppl_docs()[doc_id]["text"], bos=False)
        assert close(values[0], reference_doc_ll(model, tok.bos_id, [tok.bos_id] + t), 1e-5)
    assert metric(twice, "tiny_ppl", "word_perplexity") > metric(bench["ours"], "tiny_ppl", "word_perplexity")


# ---------------------------------------------------------------------- the command line

def test_cli_prints_table_and_writes_results(bench, tmp_path):
    out = tmp_path / "results.json"
    proc = run_main("evaluation/eval_harness.py", [f"--checkpoint={bench['ckpt']}", "--tasks=tiny_mc,tiny_ppl",
                                                   f"--include_path={bench['include']}", "--batch_size=3",
                                                   "--bootstrap_iters=0", f"--out={out}"], check=True)
    assert "|tiny_mc |" in proc.stdout and "word_perplexity" in proc.stdout
    written = json.loads(out.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == written
    assert "samples" not in written and written["config"]["model_args"] == f"checkpoint={bench['ckpt']}"
    for task, name in [("tiny_mc", "acc"), ("tiny_ppl", "word_perplexity"), ("tiny_ppl", "bits_per_byte")]:
        assert close(metric(written, task, name), metric(bench["ours"], task, name))


def test_cli_limit_and_fewshot(bench, tmp_path):
    proc = run_main("evaluation/eval_harness.py", [f"--checkpoint={bench['ckpt']}", "--tasks=tiny_mc",
                                                   f"--include_path={bench['include']}", "--limit=5",
                                                   "--num_fewshot=1", "--bootstrap_iters=0"], check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["n-samples"]["tiny_mc"]["effective"] == 5 and result["n-shot"]["tiny_mc"] == 1
