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
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinylab.config import Key
from tinylab.errors import UserError, cli_main
from tinylab.eval_common import emit, load_for_args
from tinylab.lambada import fitting_items, lambada_items, load_passages, score_items, summarize
from tinylab.schema import EVAL

SCHEMA = EVAL.derive("evaluation/eval_lambada.py", sections=[("LAMBADA", [
    Key("data", "hf", "'hf' (the HF `lambada` test split), 'hf:NAME' (another HF dataset with a text column), or a "
        "local .jsonl / .txt / .parquet file", nonempty=True),
    Key("max_passages", 0, "only the first N passages; 0 = all", range="[0, inf)"),
])])


def main(argv=None):
    a = SCHEMA.parse_args(argv, SCHEMA.argparser(__doc__.split("\n\n")[0]))
    model, ckpt, tok = load_for_args(a)
    passages = load_passages(a.data)
    if a.max_passages:
        passages = passages[:a.max_passages]
    items, skipped = lambada_items(passages, tok)
    items, too_long = fitting_items(items, model.params.max_seq_len)
    if too_long:
        print(f"notice: {too_long} passage(s) left out: their last word has max_seq_len="
              f"{model.params.max_seq_len} tokens or more, which this model cannot score")
    if not items:
        raise UserError(f"{a.data} holds no passage with a context and a last word that fits the model's window")
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
