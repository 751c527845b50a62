"""Rank-classification evaluation (T0's zero-shot protocol, spec t0-finetuning.md §10).

    python evaluation/eval_rank.py --checkpoint=out/t0 --mixture=data/t0/mixture.json
    python evaluation/eval_rank.py --checkpoint=out/base --data=rte=data/t0/rte_valid.jsonl \
        --max_examples=500 [--prefixlm=True] [--score_eos] [--out=rank.json]

Each record's `inputs` is the prompt and `answer_choices` its candidate answers; `targets` names
the correct one (P3 *_score_eval files: the row with is_correct). Every choice is scored as the
sum of its tokens' log-probabilities given the prompt, the prediction is the argmax (ties: the
lowest index), and accuracy is reported per group (a dataset x prompt) as `acc`, and as
`acc_norm` with the scores divided by the choices' token counts; then the median over groups,
over held-out groups (datasets no training source of the mixture has) and over seen ones, and
per dataset over its prompts. Last stdout line: {"prefixlm", "score_eos", "groups", "summary"}.

Choices are tokenised exactly as training targets (t0_data.ExampleEncoder: one space after the
prompt, no EOS unless --score_eos); the tokenisation settings and prefixlm come from the
checkpoint's config when it was finetuned with finetune_t0.py. Each (prompt, choice) is its own
right-padded row with its own attention mask and positions 0.., so batched scores equal scores
computed one at a time. Also used inside finetune_t0.py on validation groups with choices.
"""
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from errors import ArgParser, UserError, cli_main  # noqa: E402
from t0_data import TOKENIZATION_DEFAULTS, ExampleEncoder, attention_mask, position_ids, usable  # noqa: E402


def rank_examples(rows, encoder: ExampleEncoder, score_eos=False, limit=0, seed=0):
    """(prompt ids, [choice ids], gold index) of the rows that have answer_choices with the target
    among them; at most `limit` (0 = all) in a seeded order. Returns (examples, skipped)."""
    rows, _ = usable(rows)
    keep = []
    for r in rows:
        choices = r.get("answer_choices")
        if not isinstance(choices, (list, tuple)) or len(choices) < 2 or not all(isinstance(c, str) and c.strip() for c in choices):
            continue
        stripped = [c.strip() for c in choices]
        if r["targets"].strip() in stripped:
            keep.append((r["inputs"], list(choices), stripped.index(r["targets"].strip())))
    skipped = len(rows) - len(keep)
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
        logits = model(tokens.to(device), attn_mask=attention_mask(seg, is_input, prefixlm),
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


# ---------------------------------------------------------------------- command line

def _groups_from_args(args):
    """[(Source, held_out)] from --mixture (its valid groups) and --data NAME=PATH entries."""
    from t0_data import Source, is_held_out, load_mixture
    groups = []
    if args.mixture:
        train, valid = load_mixture(args.mixture)
        groups += [(v, is_held_out(v, train)) for v in valid]
    for item in args.data:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--data expects NAME=PATH, got {item!r}")
        groups.append((Source(name=name, path=path, dataset=name), False))
    if not groups:
        raise UserError("nothing to evaluate: give --mixture=mixture.json (its valid groups) and/or --data=NAME=PATH")
    return groups


def main(argv=None):
    from evaluation.common import add_model_args, check_positive, emit, load_model, load_tokenizer
    from t0_data import read_records
    p = ArgParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--mixture", default="", help="evaluate the valid groups of this mixture file")
    p.add_argument("--data", action="append", default=[], help="NAME=PATH of a json/jsonl/parquet file (repeatable)")
    p.add_argument("--max_examples", type=int, default=0, help="per group, a seeded subset (0 = all)")
    p.add_argument("--prefixlm", default=None, choices=["True", "False"], help="default: the checkpoint's config")
    p.add_argument("--score_eos", action="store_true", help="score each choice's EOS too")
    args = p.parse_args(argv)
    check_positive(batch_size=args.batch_size)
    groups = _groups_from_args(args)
    model, ckpt = load_model(args.checkpoint, args.device, args.dtype)
    tok = load_tokenizer(ckpt, model, args.checkpoint, args.tokenizer_model, args.data_cache_dir)
    cfg = ckpt.get("config", {})
    encoder = ExampleEncoder(tok, **{k: cfg.get(k, v) for k, v in TOKENIZATION_DEFAULTS.items()})
    prefixlm = cfg.get("prefixlm", False) if args.prefixlm is None else args.prefixlm == "True"
    results, accs, held = {}, {}, set()
    for src, held_out in groups:
        examples, skipped = rank_examples(read_records(src), encoder, args.score_eos, args.max_examples, args.seed)
        if not examples:
            print(f"{src.name}: no records with answer_choices containing the target; skipped")
            continue
        r = rank_accuracy(model, examples, args.batch_size, prefixlm)
        results[src.name] = {**r, "skipped": skipped, "held_out": held_out, "dataset": src.dataset}
        accs[src.name] = r["acc"]
        if held_out:
            held.add(src.name)
        tag = " (held out)" if held_out else ""
        print(f"{src.name:24s} acc {r['acc']:.4f}  acc_norm {r['acc_norm']:.4f}  n {r['n']}{tag}")
    summary = summarize(accs, held, {g: results[g]["dataset"] for g in results})
    for k, v in summary.items():
        print(f"{k:24s} {v:.4f}")
    emit({"prefixlm": prefixlm, "score_eos": args.score_eos, "groups": results, "summary": summary}, args.out)
    return results, summary


if __name__ == "__main__":
    cli_main(main)
