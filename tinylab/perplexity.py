"""Sliding-window perplexity of a token stream (evaluation/eval_wikitext.py; docs/evaluation.md):
every token is scored exactly once, with up to window - 1 tokens of context."""
import torch
import torch.nn.functional as F

from tinylab.errors import UserError
from tinylab.eval_common import right_pad
from tinylab.progress import progress


def window_spans(n_tokens: int, window: int, stride: int, bos: bool):
    """[(begin, end, first_scored)] of every window over a stream of n_tokens: the window holds
    tokens [begin, end) and scores [first_scored, end). Without BOS a window's first token has no
    context, so it can only be scored by an earlier window."""
    if not 1 <= stride <= window:
        raise UserError(f"--stride must be between 1 and the window ({window}), got {stride}")
    spans, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + window, n_tokens)
        first = max(prev_end, begin + (0 if bos else 1))
        if first < end:
            spans.append((begin, end, first))
        prev_end = end
        if end == n_tokens:
            break
    return spans


@torch.no_grad()
def sliding_window_nll(model, ids, window, stride, bos_id=None, batch_size=8):
    """(sum of NLL in nats, number of scored tokens) of the token stream `ids` (a list)."""
    device = next(model.parameters()).device
    spans = window_spans(len(ids), window, stride, bos_id is not None)
    total, count = 0.0, 0
    bar = progress(total=len(spans), desc="windows", unit="win")
    for start in range(0, len(spans), batch_size):
        chunk = spans[start:start + batch_size]
        rows = []
        for begin, end, first in chunk:
            seq = ([bos_id] if bos_id is not None else []) + ids[begin:end]
            off = 1 if bos_id is not None else 0  # index in seq of stream token `begin`
            # input seq[:-1] predicts seq[1:]; keep only the targets at stream positions >= first
            target = [t if begin + j + 1 - off >= first else -1 for j, t in enumerate(seq[1:])]
            rows.append((seq[:-1], target))
        x, y = right_pad([r[0] for r in rows]), right_pad([r[1] for r in rows], value=-1)
        logits = model(x.to(device), all_logits=True)
        nll = F.cross_entropy(logits.double().flatten(0, 1), y.to(device).flatten(), ignore_index=-1, reduction="sum")
        total += nll.item()
        count += int((y >= 0).sum())
        bar.update(len(chunk))
    bar.close()
    return total, count


def token_stream(rows, tokenizer, join):
    """(token ids without BOS, UTF-8 bytes of the text they encode)."""
    if join == "rows":
        ids = [t for ids in tokenizer.encode_batch(rows, bos=False) for t in ids]
        return ids, sum(len(r.encode("utf-8")) for r in rows)
    text = "\n\n".join(rows)
    return tokenizer.encode(text, bos=False), len(text.encode("utf-8"))
