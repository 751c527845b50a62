"""LAMBADA scoring (evaluation/eval_lambada.py; the protocol is in docs/evaluation.md): each
passage's last word is the target, scored whole (every one of its tokens must be the greedy
prediction) and by its log-probability, plus the older last-token-only accuracy.
"""
import math

import torch
import torch.nn.functional as F

from tinylab.eval_common import load_hf_rows, read_rows, right_pad
from tinylab.progress import progress


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
