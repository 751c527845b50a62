"""Rank classification (T0's zero-shot protocol; docs/t0.md): each answer choice scored as the sum
of its tokens' log-probabilities given the prompt, the argmax is the prediction. Used by
evaluation/eval_rank.py and by finetune_t0.py on validation groups with answer_choices."""
import statistics

import numpy as np
import torch

from tinylab.t0.batches import position_ids
from tinylab.t0.encode import ExampleEncoder, usable

# why a record cannot be ranked (skip_reasons' keys, in the order they are checked)
NO_TEXT, NO_CHOICES, NOT_A_CHOICE = ("no inputs/targets text", "fewer than 2 non-empty answer_choices",
                                     "a target that is not one of its answer_choices")


def skip_reason(row):
    """None for a record rank classification can score, else why not (one of the reasons above)."""
    if not usable([row])[0]:
        return NO_TEXT
    choices = row.get("answer_choices")
    if not isinstance(choices, (list, tuple)) or len(choices) < 2 or not all(isinstance(c, str) and c.strip() for c in choices):
        return NO_CHOICES
    return None if row["targets"].strip() in [c.strip() for c in choices] else NOT_A_CHOICE


def skip_reasons(rows) -> dict:
    """{reason: count} over the records that cannot be ranked."""
    out = {}
    for r in rows:
        why = skip_reason(r)
        if why is not None:
            out[why] = out.get(why, 0) + 1
    return out


def rank_examples(rows, encoder: ExampleEncoder, score_eos=False, limit=0, seed=0):
    """(prompt ids, [choice ids], gold index) of the rows that have answer_choices with the target
    among them; at most `limit` (0 = all) in a seeded order. Returns (examples, skipped)."""
    keep = []
    for r in rows:
        if skip_reason(r) is None:
            stripped = [c.strip() for c in r["answer_choices"]]
            keep.append((r["inputs"], list(r["answer_choices"]), stripped.index(r["targets"].strip())))
    skipped = len(rows) - len(keep)  # every record not ranked, those without inputs/targets text too
    if limit and len(keep) > limit:
        order = np.random.default_rng([seed, 17]).permutation(len(keep))[:limit]
        keep = [keep[i] for i in sorted(order)]
    if not keep:
        return [], skipped
    prompts = encoder.encode_inputs([k[0] for k in keep])
    flat = encoder.encode_targets([c for k in keep for c in k[1]], eos=score_eos)
    out, at = [], 0
    for (_, choices, gold), prompt in zip(keep, prompts):
        out.append((encoder.clip_input(prompt), flat[at:at + len(choices)], gold))
        at += len(choices)
    return out, skipped


@torch.no_grad()
def score_choices(model, pairs, batch_size=16, prefixlm=False):
    """Sum of log p(choice tokens | prompt) for each (prompt ids, choice ids) pair, and the
    choice's token count. Pairs are batched longest first (less padding); order is restored."""
    device = next(model.parameters()).device
    max_len = model.params.max_seq_len + 1  # the model sees all but the last token
    seqs, n_prompt = [], []
    for prompt, choice in pairs:
        over = len(prompt) + len(choice) - max_len
        if over > 0:  # drop prompt tokens after the first (BOS) so the choice still fits
            prompt = prompt[:1] + prompt[1 + over:]
        seqs.append(list(prompt) + list(choice))
        n_prompt.append(len(prompt))
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    scores = np.zeros(len(seqs))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        T = max(len(seqs[i]) for i in idx) - 1
        tokens = torch.zeros(len(idx), T, dtype=torch.long)
        labels = torch.zeros(len(idx), T, dtype=torch.long)
        seg = torch.zeros(len(idx), T, dtype=torch.long)
        is_input = torch.zeros(len(idx), T, dtype=torch.bool)
        scored = torch.zeros(len(idx), T, dtype=torch.bool)
        for b, i in enumerate(idx):
            s = torch.tensor(seqs[i])
            n = len(s) - 1
            tokens[b, :n], labels[b, :n], seg[b, :n] = s[:-1], s[1:], 1
            is_input[b, :n_prompt[i]] = True
            scored[b, n_prompt[i] - 1:n] = True  # labels that are choice tokens
        seg, is_input = seg.to(device), is_input.to(device)
        logits = model(tokens.to(device), segment_ids=seg, prefix_mask=is_input if prefixlm else None,
                       position_ids=position_ids(seg), all_logits=True)
        logp = torch.log_softmax(logits.to(torch.float64), dim=-1).gather(-1, labels.to(device)[..., None])[..., 0]
        sums = (logp * scored.to(device)).sum(1).cpu().numpy()
        scores[idx] = sums
    return scores, np.array([len(c) for _, c in pairs])


def rank_accuracy(model, examples, batch_size=16, prefixlm=False):
    """{"acc", "acc_norm" (length-normalised scores), "n"} over rank examples."""
    if not examples:
        return {"acc": float("nan"), "acc_norm": float("nan"), "n": 0}
    pairs = [(p, c) for p, choices, _ in examples for c in choices]
    scores, lengths = score_choices(model, pairs, batch_size, prefixlm)
    correct = correct_norm = at = 0
    for _, choices, gold in examples:
        s, n = scores[at:at + len(choices)], np.maximum(lengths[at:at + len(choices)], 1)
        correct += int(np.argmax(s)) == gold  # argmax: ties go to the lowest index
        correct_norm += int(np.argmax(s / n)) == gold
        at += len(choices)
    return {"acc": correct / len(examples), "acc_norm": correct_norm / len(examples), "n": len(examples)}


def summarize(accs, held_out=(), datasets=None):
    """Medians: over all groups, held-out and seen groups, and per dataset over its prompts."""
    out = {}
    if accs:
        out["rank_acc_median"] = statistics.median(accs.values())
    held = [a for g, a in accs.items() if g in held_out]
    seen = [a for g, a in accs.items() if g not in held_out]
    if held and seen:
        out["rank_acc_median/held_out"] = statistics.median(held)
        out["rank_acc_median/seen"] = statistics.median(seen)
    by_dataset = {}
    for g, a in accs.items():
        by_dataset.setdefault((datasets or {}).get(g, g), []).append(a)
    for d, vals in by_dataset.items():
        if len(vals) > 1:  # several prompts of one dataset: T0 reports their median
            out[f"rank_acc_dataset/{d}"] = statistics.median(vals)
    return out
