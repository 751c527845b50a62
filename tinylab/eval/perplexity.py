"""Perplexity of token streams (evaluation/eval_wikitext.py; docs/evaluation.md), two protocols:

  sliding_window_nll   the project's: every token scored exactly once, with up to window - 1
                       tokens of context
  group_texts_blocks + block_losses
                       staged-training's (`eval_wikitext.py eval`): rows tokenized, concatenated
                       and cut into non-overlapping blocks exactly as its datasets.map(group_texts)
                       did, each block scored alone, the mean loss over blocks
"""
import math

import numpy as np
import torch
import torch.nn.functional as F

from tinylab.core.errors import UserError
from tinylab.core.progress import progress
from tinylab.eval.common import right_pad


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


# ---------------------------------------------------------------------- staged-training's blocks

MAP_BATCH = 1000  # datasets.map(batched=True)'s default batch_size, over which group_texts concatenated


def contiguous_shards(n: int, num_proc: int):
    """The row ranges datasets.map(num_proc=k) hands its k processes (Dataset.shard(contiguous=True);
    k is lowered to n when there are fewer rows)."""
    k = max(1, min(num_proc, n))
    div, mod = divmod(n, k)
    out = []
    for i in range(k):
        start = div * i + min(i, mod)
        out.append(range(start, start + div + (1 if i < mod else 0)))
    return out


def group_texts_blocks(token_rows, block_size: int, num_proc: int = 1, map_batch: int = MAP_BATCH):
    """staged-training's tools/common.py group_texts as its datasets.map(batched=True, num_proc)
    applied it: each process's contiguous shard of rows is taken in batches of `map_batch` rows;
    a batch's rows are concatenated and cut into blocks of block_size, its remainder dropped (a
    batch shorter than one block stays one short block). Returns the blocks (lists of ids) in
    order, leaving out blocks of fewer than 2 tokens (nothing to predict)."""
    blocks = []
    for shard in contiguous_shards(len(token_rows), num_proc):
        for start in range(shard.start, shard.stop, map_batch):
            concat = [t for row in token_rows[start:min(start + map_batch, shard.stop)] for t in row]
            total = len(concat)
            if total >= block_size:
                total = (total // block_size) * block_size
            blocks += [concat[i:i + block_size] for i in range(0, total, block_size)]
    return [b for b in blocks if len(b) >= 2]


def batched(blocks, batch_size: int, max_batches: int = 0):
    """Consecutive batches of `batch_size` blocks (the last one may be smaller), the first
    max_batches of them (0 = all), as DataLoader(shuffle=False) + islice gave them."""
    starts = range(0, len(blocks), batch_size)
    if max_batches:
        starts = starts[:max_batches]
    for s in starts:
        yield blocks[s:s + batch_size]


@torch.no_grad()
def block_losses(model, batches, ignore_id=None, total=None, max_logits=1 << 26):
    """staged-training's evaluation loop over batches of blocks (each an id sequence; a batch is a
    list of them or a 2-D array): each block is scored alone, x = block[:-1] predicting
    y = block[1:] (GPT-2 with labels = input_ids); targets equal to `ignore_id` (a tokenizer's
    pad id, which the original's DataCollatorForLanguageModeling set to -100) are not scored.

    Returns {"loss": mean over blocks of each block's mean NLL, "ppl": exp(loss), "blocks",
    "tokens" (predictions scored), "batch_mean_loss": the mean over batches of each batch's
    token-mean loss (the original's running_loss / total_batches: the same as `loss` when every
    batch is full)}. A forward pass holds at most `max_logits` logits (long batches are split; the
    numbers do not change)."""
    device = next(model.parameters()).device
    block_means, batch_means, tokens = [], [], 0
    bar = progress(total=total, desc="Evaluating", unit="batch")
    for batch in batches:
        seqs = [list(map(int, b)) for b in batch]
        rows = [(s[:-1], [t if t != ignore_id else -1 for t in s[1:]]) for s in seqs]
        width = max(len(r[0]) for r in rows)
        step = max(1, max_logits // max(1, width * model.params.vocab_size))
        sums, counts = [], []
        for i in range(0, len(rows), step):
            part = rows[i:i + step]
            x, y = right_pad([r[0] for r in part]), right_pad([r[1] for r in part], value=-1).to(device)
            logits = model(x.to(device), all_logits=True)
            nll = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-1, reduction="none")
            nll = nll.double().view(y.shape).sum(1)
            sums += nll.tolist()
            counts += (y >= 0).sum(1).tolist()
        batch_means.append(sum(sums) / max(1, sum(counts)))
        block_means += [s / c for s, c in zip(sums, counts) if c]
        tokens += sum(counts)
        bar.update(1)
    bar.close()
    if not block_means:
        raise UserError("no block to evaluate (the data is shorter than one block)")
    loss = float(np.mean(block_means))
    return {"loss": loss, "ppl": math.exp(loss) if loss < 700 else float("inf"), "blocks": len(block_means), "tokens": tokens,
            "batch_mean_loss": float(np.mean(batch_means))}
