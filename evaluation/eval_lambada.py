"""LAMBADA last-word accuracy and target-word perplexity (docs/evaluation.md).

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

staged-training's flags work too (any of --path, --batch, --max-batches, --ignore-fragments,
--preprocess, --jeff_suggestion, --dryrun, --checkpoint-file, --model-name selects its interface;
docs/evaluation.md, "The staged-training repository's commands"):

    python evaluation/eval_lambada.py --checkpoint-file out/ckpt.pt --path lambada_test.jsonl --batch 4
    python evaluation/eval_lambada.py --model-name gpt2 --path lambada_test.jsonl --ignore-fragments
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinylab.core.config import Key
from tinylab.core.errors import UserError, cli_main
from tinylab.core.memory_budget import check_model_batch
from tinylab.eval.common import emit, load_for_args
from tinylab.eval.lambada import (
    fitting_items,
    lambada_items,
    load_passages,
    original_items,
    read_original_passages,
    score_items,
    summarize,
)
from tinylab.eval.staged_eval import CHECKPOINT_FILE, MODEL_NAME, flag_argv, load_named_model
from tinylab.schema import EVAL

SCHEMA = EVAL.derive("evaluation/eval_lambada.py", sections=[("LAMBADA", [
    Key("data", "hf", "'hf' (the HF `lambada` test split), 'hf:NAME' (another HF dataset with a text column), or a "
        "local .jsonl / .txt / .parquet file", nonempty=True, input=True),
    Key("max_passages", 0, "only the first N passages; 0 = all", range="[0, inf)"),
])])


def score_fitting(model, items, batch_size, source, flag="--batch_size"):
    """Score the items whose last word fits the model's window (a notice counts the others):
    (the scored items, summarize()'s metrics, the last-token accuracy). `flag` sets batch_size."""
    items, too_long = fitting_items(items, model.params.max_seq_len)
    if too_long:
        print(f"notice: {too_long} passage(s) left out: their last word has max_seq_len="
              f"{model.params.max_seq_len} tokens or more, which this model cannot score")
    if not items:
        raise UserError(f"{source} holds no passage with a context and a last word that fits the model's window")
    rows = min(batch_size, len(items))  # the first batch, each passage cut to the window as score_items does
    check_model_batch(model, rows, min(max(len(c) + len(w) for c, w in items[:rows]), model.params.max_seq_len + 1) - 1,
                      flag)
    results = score_items(model, items, model.params.max_seq_len, batch_size)
    return items, summarize(results), sum(r[2] for r in results) / len(results)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return original_main(argv) if interface_of(argv) == "original" else project_main(argv)


def project_main(argv):
    """The project's interface: --checkpoint, --data."""
    parser = SCHEMA.argparser(__doc__.split("\n\n")[0])
    parser.epilog = ("staged-training's interface: its flags (--path, --batch, --checkpoint-file, --model-name, "
                     "...) select it; `eval_lambada.py --path=FILE --help` lists them")
    a = SCHEMA.parse_args(argv, parser)
    model, ckpt, tok = load_for_args(a)
    passages = load_passages(a.data)
    if a.max_passages:
        passages = passages[:a.max_passages]
    items, skipped = lambada_items(passages, tok)
    items, metrics, last_token_acc = score_fitting(model, items, a.batch_size, a.data)
    multi = sum(len(c) > 1 for _, c in items)
    print(f"data {a.data}: {len(items)} passages ({skipped} skipped without a space); "
          f"{multi} targets span several tokens")
    print(f"whole-word accuracy {metrics['acc']:.4f}  target-word perplexity {metrics['ppl']:.3f}  "
          f"last_token_acc (last token only, lenient) {last_token_acc:.4f}")
    emit(metrics, a.out)


# ---------------------------------------------------------------------- staged-training's interface

ORIGINAL_HELP = """staged-training's eval_lambada.py: last-token and whole-word LAMBADA accuracy (docs/evaluation.md).

--path is read as the original read it (the whole file, --preprocess applied to its text, split
into lines; a .jsonl line is {"text": "..."}); each passage is stripped (--jeff_suggestion: "\\n"
in front) and encoded whole; last_token_acc is the original's Accuracy (the passage's last token
is the greedy, teacher-forced prediction), acc the project's whole-word test (every token of the
last word), ppl the target-word perplexity. Last stdout line: {"acc", "last_token_acc", "ppl",
"n", "fragments"} ({"passages", "n", "fragments", "skipped", "tokens"} with --dryrun)."""

ORIGINAL = EVAL.derive("evaluation/eval_lambada.py", drop=["checkpoint", "batch_size"], sections=[
    ("staged-training's flags", [
        Key("path", "lambada_test.jsonl", "the LAMBADA file: OpenAI's lambada_test.jsonl ({\"text\": ...} per line) "
            "or plain text, one passage per line", nonempty=True, input=True),
        Key("batch", 4, "passages per forward pass", range="[1, inf)"),
        Key("max_batches", 0, "only the passages of the first N batches; 0 = all (the original parsed it but never "
            "applied it)", range="[0, inf)", aliases=("max-batches",)),
        Key("ignore_fragments", False, "leave out the passages whose last token is not the whole last word",
            aliases=("ignore-fragments",)),
        Key("preprocess", False, "the original's quote normalisation of the file's text (curly and doubled quotes "
                                 "become \")"),
        Key("jeff_suggestion", False, "put a newline in front of each passage", aliases=("jeff-suggestion",)),
        Key("dryrun", False, "read, preprocess and tokenize only; score nothing, report the counts"),
        CHECKPOINT_FILE, MODEL_NAME,
    ])])
ORIGINAL_FLAGS = {f"--{n}" for _, keys in ORIGINAL.sections[-1:] for k in keys for n in (k.name, *k.aliases)}
PROJECT_FLAGS = {f"--{n}" for _, keys in SCHEMA.sections[-1:] for k in keys for n in (k.name, *k.aliases)} | \
    {"--checkpoint", "--batch_size"}


def interface_of(argv) -> str:
    """'original' when a flag only staged-training's interface has is given, else 'project'."""
    names = [a.split("=", 1)[0] for a in argv if a.startswith("--")]
    ours = [n for n in names if n in ORIGINAL_FLAGS]
    theirs = [n for n in names if n in PROJECT_FLAGS]
    if ours and theirs:
        raise UserError(f"{theirs[0]} belongs to this project's interface and {ours[0]} to staged-training's: use "
                        f"the flags of one (docs/evaluation.md)")
    return "original" if ours else "project"


def original_main(argv):
    a = ORIGINAL.parse_args(flag_argv(argv, ORIGINAL), ORIGINAL.argparser(ORIGINAL_HELP))
    passages = read_original_passages(a.path, a.preprocess)
    if a.max_batches:
        passages = passages[:a.max_batches * a.batch]
    loaded = load_named_model(a, need_model=not a.dryrun)
    model, tok = loaded.model, loaded.tokenizer
    items, fragments, skipped = original_items(passages, tok, a.jeff_suggestion)
    n_fragments = sum(fragments)
    if a.ignore_fragments:
        items = [it for it, frag in zip(items, fragments) if not frag]
    print(f"model {loaded.name}")
    print(f"data {a.path}: {len(passages)} passages ({skipped} without a context left out), {n_fragments} fragments "
          f"(last token not the whole last word){' left out' if a.ignore_fragments else ''}; "
          f"preprocess {a.preprocess}, jeff_suggestion {a.jeff_suggestion}")
    if a.dryrun:
        tokens = sum(len(c) + len(w) for c, w in items)
        print(f"dry run: {len(items)} passages to score, {tokens:,} tokens; nothing scored")
        emit({"passages": len(passages), "n": len(items), "fragments": n_fragments, "skipped": skipped,
              "tokens": tokens}, a.out)
        return
    items, metrics, last_token_acc = score_fitting(model, items, a.batch, a.path, "--batch")
    print(f"whole-word accuracy {metrics['acc']:.4f}  target-word perplexity {metrics['ppl']:.3f}  "
          f"last_token_acc {last_token_acc:.4f}")
    print("Accuracy: %.4f" % last_token_acc)  # the original's line (its last-token accuracy)
    emit({"acc": metrics["acc"], "last_token_acc": last_token_acc, "ppl": metrics["ppl"], "n": metrics["n"],
          "fragments": n_fragments}, a.out)


if __name__ == "__main__":
    cli_main(main)
