"""LAMBADA scoring (evaluation/eval_lambada.py; the protocol is in docs/evaluation.md): each
passage's last word is the target, scored whole (every one of its tokens must be the greedy
prediction) and by its log-probability, plus the older last-token-only accuracy.

staged-training's interface (`--path`, `--preprocess`, `--jeff_suggestion`, `--ignore-fragments`)
reads and prepares passages as its eval_lambada.py did: read_original_passages, original_items.
"""
import ast
import json
import math

import torch
import torch.nn.functional as F

from tinylab.core.errors import UserError
from tinylab.core.fileio import read_text
from tinylab.core.progress import progress
from tinylab.eval.common import load_hf_rows, read_rows, right_pad


def lambada_items(passages, tokenizer):
    """[(context ids with BOS, continuation ids)] per passage; passages without a space are
    skipped (they have no context). The continuation is the part of the full passage's encoding
    beyond the context's encoding, or, when that is not a prefix, the word encoded alone (the
    sentencepiece dummy prefix stands for the space)."""
    items, skipped = [], 0
    for text in passages:
        text = text.strip()
        if " " not in text:
            skipped += 1
            continue
        context, word = text.rsplit(" ", 1)
        ctx = tokenizer.encode(context, bos=True)
        full = tokenizer.encode(text, bos=True)
        if full[:len(ctx)] == ctx and len(full) > len(ctx):
            cont = full[len(ctx):]
        else:
            cont = tokenizer.encode(word, bos=False)
        items.append((ctx, cont))
    return items, skipped


def fitting_items(items, max_len):
    """(items whose continuation fits the model's window with at least one context token, number
    left out): a word of max_len tokens or more cannot be scored by this model at all."""
    kept = [(ctx, cont) for ctx, cont in items if len(cont) < max_len]
    return kept, len(items) - len(kept)


@torch.no_grad()
def score_items(model, items, max_len, batch_size=8):
    """Per passage: (log p(continuation | context), whole word greedy-correct, last token
    greedy-correct). Sequences longer than max_len + 1 keep their last tokens. Batches are
    right-padded, which under causal attention leaves every score as it is unbatched."""
    device = next(model.parameters()).device
    results = []
    bar = progress(total=len(items), desc="lambada", unit="passage")
    for start in range(0, len(items), batch_size):
        chunk = [(ctx + cont)[-(max_len + 1):] for ctx, cont in items[start:start + batch_size]]
        x = right_pad([seq[:-1] for seq in chunk])
        logp = F.log_softmax(model(x.to(device), all_logits=True).double(), dim=-1).cpu()
        for i, seq in enumerate(chunk):
            k = len(items[start + i][1])
            pos = torch.arange(len(seq) - 1 - k, len(seq) - 1)  # positions predicting the continuation
            target = torch.tensor(seq[-k:])
            lp = logp[i, pos, target].sum().item()
            greedy = logp[i, pos].argmax(-1)
            results.append((lp, bool((greedy == target).all()), bool(greedy[-1] == target[-1])))
        bar.update(len(chunk))
    bar.close()
    return results


def summarize(results):
    n = len(results)
    return {"acc": sum(r[1] for r in results) / n,
            "ppl": math.exp(-sum(r[0] for r in results) / n),
            "n": n}


def load_passages(data):
    if data == "hf":
        return load_hf_rows("lambada", None, "test")
    if data.startswith("hf:"):
        return load_hf_rows(data[3:], None, "test")
    return [r for r in read_rows(data) if r.strip()]


# ---------------------------------------------------------------------- staged-training's eval_lambada.py

JSONL_HEAD, JSONL_TAIL = '{"text": "', '"}'


def preprocess(text: str) -> str:
    """staged-training's preprocess (from openai/gpt-2 issue 131): curly and doubled quotes become
    '"', and a newline is put in front of the stripped text."""
    for a in ("\u201c", "\u201d", "''", "``"):
        text = text.replace(a, '"')
    return "\n" + text.strip()


def read_original_passages(path: str, do_preprocess: bool = False) -> list:
    """The passages of `path` as staged-training's main() read them: the whole file's text
    (with --preprocess: preprocess() of the whole text, before it is split, as the original
    applied it), stripped and split into lines; a `.jsonl` line `{"text": "..."}` is its string
    literal (the original sliced off the braces and evaluated the rest as a Python string; here
    ast.literal_eval, which reads the same strings and runs nothing; a line of another shape is
    parsed as JSON). Blank lines are left out (the original failed on them)."""
    raw = read_text(path, "--path")
    if do_preprocess:
        raw = preprocess(raw)
    lines = raw.strip().split("\n")
    if not path.endswith(".jsonl"):
        return [line for line in lines if line.strip()]
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        text = None
        if line.startswith(JSONL_HEAD) and line.endswith(JSONL_TAIL):
            try:
                text = ast.literal_eval('"""' + line[len(JSONL_HEAD):-len(JSONL_TAIL)] + '"""')
            except (SyntaxError, ValueError):
                text = None
        if not isinstance(text, str):
            try:
                obj = json.loads(line)
            except ValueError:
                raise UserError(f"{path}:{i} is not a {{\"text\": ...}} line") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise UserError(f"{path}:{i} has no string field 'text'")
            text = obj["text"]
        out.append(text)
    return out


def original_items(passages, tokenizer, jeff_suggestion: bool = False):
    """Per passage, as staged-training's score_batch prepared it: the line stripped, with
    --jeff_suggestion a "\\n" in front, encoded whole (`tokenizer.encode(line, bos=True)`: our
    models' BOS, or an HF tokenizer's own special tokens, none for GPT-2); its last token is the
    original's target, and the passage is a *fragment* when that token's decoding (stripped) is
    not the whole last word. Returns (items, fragments, skipped): items are (context ids,
    continuation ids) with context + continuation = the full encoding and the continuation the
    tokens of the last word (for the whole-word test), fragments one flag per item, skipped the
    passages with a single word (no context)."""
    items, fragments, skipped = [], [], 0
    for line in passages:
        line = line.strip()
        if jeff_suggestion:
            line = "\n" + line
        words = line.split()
        if len(words) < 2:
            skipped += 1
            continue
        word = words[-1].strip()
        full = tokenizer.encode(line, bos=True)
        ctx = tokenizer.encode(line[:len(line) - len(words[-1])].rstrip(), bos=True)
        k = 0  # the context's encoding is (nearly always) a prefix of the whole line's; else their common prefix
        while k < min(len(ctx), len(full)) and ctx[k] == full[k]:
            k += 1
        if not 0 < k < len(full):
            skipped += 1
            continue
        items.append((full[:k], full[k:]))
        fragments.append(tokenizer.decode(full[-1:]).strip() != word)
    return items, fragments, skipped
