"""LAMBADA last-word accuracy and target-word perplexity (../shared/spec/interop.md §6).

    python evaluation/eval_lambada.py --checkpoint=out/ckpt.pt --data=lambada_test.jsonl   # OpenAI jsonl
    python evaluation/eval_lambada.py --checkpoint=out/ckpt.pt --data=hf                   # HF `lambada` test
    python evaluation/eval_lambada.py --checkpoint=out/ckpt.pt --data=hf:EleutherAI/lambada_openai

Each passage's target is its last whitespace-separated word; the context is the text before the
last space and the continuation is " " + word (the lm-evaluation-harness task). A passage counts
as correct only if, teacher-forced over the continuation, the greedy (argmax) prediction is right
at EVERY continuation token, i.e. the whole word, however many tokens it has (Megatron-LM's strict
LAMBADA). Perplexity is exp(-mean over passages of log p(continuation | context)).
`last_token_acc` (summary only) is the older, more lenient staged-training figure: only the last
token of the passage is checked.
Last stdout line: {"acc", "ppl", "n"}.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from errors import UserError, cli_main  # noqa: E402
from evaluation.common import (model_parser, check_positive, emit, load_hf_rows, load_for_args,  # noqa: E402
                               progress, read_rows, right_pad)


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


def main(argv=None):
    p = model_parser(__doc__)
    p.add_argument("--data", default="hf", help="'hf' (the HF `lambada` test split), 'hf:NAME' (another HF "
                                                "dataset with a text column), or a local .jsonl/.txt/.parquet file")
    p.add_argument("--max_passages", type=int, default=0, help="only the first N passages (0 = all)")
    a = p.parse_args(argv)
    check_positive(batch_size=a.batch_size)
    model, ckpt, tok = load_for_args(a)
    passages = load_passages(a.data)
    if a.max_passages:
        passages = passages[:a.max_passages]
    items, skipped = lambada_items(passages, tok)
    if not items:
        raise UserError(f"{a.data} holds no passage with a context and a last word")
    results = score_items(model, items, model.params.max_seq_len, a.batch_size)
    metrics = summarize(results)
    last_token_acc = sum(r[2] for r in results) / len(results)
    multi = sum(len(c) > 1 for _, c in items)
    print(f"data {a.data}: {len(items)} passages ({skipped} skipped without a space); "
          f"{multi} targets span several tokens")
    print(f"whole-word accuracy {metrics['acc']:.4f}  target-word perplexity {metrics['ppl']:.3f}  "
          f"last_token_acc (last token only, lenient) {last_token_acc:.4f}")
    emit(metrics, a.out)


if __name__ == "__main__":
    cli_main(main)
