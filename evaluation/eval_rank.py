"""Rank-classification evaluation (T0's zero-shot protocol, docs/t0.md).

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

Choices are tokenised exactly as training targets (tinylab/t0/encode.py's ExampleEncoder: one space after the
prompt, no EOS unless --score_eos); the tokenisation settings and prefixlm come from the
checkpoint's config when it was finetuned with finetune_t0.py. Each (prompt, choice) is its own
right-padded row with its own attention mask and positions 0.., so batched scores equal scores
computed one at a time. Also used inside finetune_t0.py on validation groups with choices.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinylab.core.config import Key
from tinylab.core.errors import UserError, cli_main
from tinylab.core.memory_budget import check_model_batch
from tinylab.eval.common import emit, load_for_args
from tinylab.schema import EVAL, FINETUNE_T0
from tinylab.t0.mixture import Source, is_held_out, load_mixture
from tinylab.t0.options import LossOptions, TokenizationOptions
from tinylab.t0.rank_eval import rank_accuracy, rank_examples, skip_reasons, summarize

SCHEMA = EVAL.derive("evaluation/eval_rank.py", sections=[("rank classification", [
    Key("mixture", "", "evaluate the valid groups of this mixture file"),
    Key("data", [], "NAME=PATH of a json/jsonl/parquet file (repeatable)"),
    Key("max_examples", 0, "per group, a seeded subset; 0 = all", range="[0, inf)"),
    Key("prefixlm", None, "prefix-LM attention over the prompt (default: the checkpoint's config)", type=bool),
    Key("score_eos", False, "score each choice's EOS too"),
])])


def _groups_from_args(args):
    """[(Source, held_out)] from --mixture (its valid groups) and --data NAME=PATH entries."""
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


def no_usable_records(n_groups, read, reasons, no_text):
    """The one line for a run in which no group had a record to rank; `no_text`: {kind's title:
    groups skipped} of the source kinds without text records."""
    why = [f"{n} with {reason}" for reason, n in reasons.items()]
    why += [f"{n} {title} group(s) (token ids, no answer_choices)" for title, n in no_text.items()]
    return (f"no record to rank: {read} record(s) read from {n_groups} group(s)"
            + (f", skipped: {'; '.join(why)}" if why else " (empty files)")
            + "; rank classification needs inputs, targets and answer_choices that include the target")


def main(argv=None):
    args = SCHEMA.parse_args(argv, SCHEMA.argparser(__doc__.split("\n")[0]))
    groups = _groups_from_args(args)
    model, ckpt, tok = load_for_args(args)
    # the tokenisation settings of a finetune_t0.py checkpoint, else finetune_t0.py's defaults
    cfg = {**FINETUNE_T0.defaults(), **(ckpt.get("config") or {})}
    encoder = TokenizationOptions.from_config(cfg).encoder(tok)
    prefixlm = LossOptions.from_config(cfg).prefixlm if args.prefixlm is None else args.prefixlm
    results, accs, held = {}, {}, set()
    read, reasons, no_text = 0, {}, {}  # what was read and why it was skipped, for the error below
    for src, held_out in groups:
        reader = src.reader
        if not reader.gives_records:  # a kind of source without text (a Megatron prefix)
            print(f"{src.name}: a {reader.title} holds token ids, no answer_choices; skipped")
            no_text[reader.title] = no_text.get(reader.title, 0) + 1
            continue
        rows = reader.records(src)
        read += len(rows)
        examples, skipped = rank_examples(rows, encoder, args.score_eos, args.max_examples, args.seed)
        if not examples:
            print(f"{src.name}: no records with answer_choices containing the target; skipped")
            for why, n in skip_reasons(rows).items():
                reasons[why] = reasons.get(why, 0) + n
            continue
        pairs = [len(p) + len(c) for p, choices, _ in examples for c in choices]  # longest first (score_choices)
        check_model_batch(model, min(args.batch_size, len(pairs)), min(max(pairs), model.params.max_seq_len + 1) - 1,
                          "--batch_size")
        r = rank_accuracy(model, examples, args.batch_size, prefixlm)
        results[src.name] = {**r, "skipped": skipped, "held_out": held_out, "dataset": src.dataset}
        accs[src.name] = r["acc"]
        if held_out:
            held.add(src.name)
        tag = " (held out)" if held_out else ""
        print(f"{src.name:24s} acc {r['acc']:.4f}  acc_norm {r['acc_norm']:.4f}  n {r['n']}{tag}")
    if not results:
        raise UserError(no_usable_records(len(groups), read, reasons, no_text))
    summary = summarize(accs, held, {g: results[g]["dataset"] for g in results})
    for k, v in summary.items():
        print(f"{k:24s} {v:.4f}")
    emit({"prefixlm": prefixlm, "score_eos": args.score_eos, "groups": results, "summary": summary}, args.out)
    return results, summary


if __name__ == "__main__":
    cli_main(main)
