"""WikiText perplexity of a checkpoint, with a sliding window (docs/evaluation.md).

    python evaluation/eval_wikitext.py --checkpoint=out/ckpt.pt                      # HF wikitext-103-raw-v1 test
    python evaluation/eval_wikitext.py --checkpoint=out/ckpt.pt --data=test.txt --stride=256
    python evaluation/eval_wikitext.py --checkpoint=hf_llama_dir --data=wiki.parquet --window=512

The rows (a .txt file's lines, a .jsonl's or .parquet's `text`, or the HF test split) are
tokenized one by one and concatenated with no separator (`--join=rows`, the staged-training
convention) or joined with "\\n\\n" and tokenized once (`--join=text`, the HF guide's). Windows
of `--window` tokens (default: the model's max_seq_len) start every `--stride` tokens; each window
scores only the tokens no earlier window scored, so every token is scored exactly once, with up
to window - 1 tokens of context. With --bos (default; our models start documents with BOS) each
window is fed as [BOS] + its tokens and the first token of the stream is scored too;
--no-bos with stride = window is the plain non-overlapping block evaluation (the first token
of each block is context only).

Reported: token-level perplexity exp(sum NLL / scored tokens) (depends on the tokenizer) and
bits per UTF-8 byte of the text, sum NLL / (ln 2 * bytes) (comparable across tokenizers).
Last stdout line: {"ppl", "bpb", "tokens"}.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinylab.config import Key
from tinylab.errors import UserError, cli_main
from tinylab.eval_common import emit, load_for_args, load_hf_rows, read_rows
from tinylab.perplexity import sliding_window_nll, token_stream
from tinylab.schema import EVAL

SCHEMA = EVAL.derive("evaluation/eval_wikitext.py", sections=[("WikiText", [
    Key("data", "hf", "'hf' (wikitext-103-raw-v1 test via `datasets`) or a local text / .jsonl / .parquet file",
        nonempty=True),
    Key("stride", 0, "tokens between window starts; 0 = the window", range="[0, inf)"),
    Key("window", 0, "tokens per window; 0 = the model's max_seq_len", range="[0, inf)"),
    Key("join", "rows", "rows: tokenize rows one by one and concatenate | text: join with blank lines, tokenize once",
        choices=("rows", "text")),
    Key("bos", True, "prepend BOS to every window (--no-bos: the plain block evaluation)"),
    Key("max_rows", 0, "only the first N rows; 0 = all", range="[0, inf)"),
])])


def main(argv=None):
    a = SCHEMA.parse_args(argv, SCHEMA.argparser(__doc__.split("\n\n")[0]))
    model, ckpt, tok = load_for_args(a)
    window = a.window or model.params.max_seq_len
    stride = a.stride or window
    if stride > window:
        raise UserError(f"--stride={stride} exceeds the window of {window} tokens (tokens would go unscored)")
    if window > model.params.max_seq_len:
        raise UserError(f"--window={window} exceeds the model's max_seq_len={model.params.max_seq_len}")
    rows = load_hf_rows("wikitext", "wikitext-103-raw-v1", "test") if a.data == "hf" else read_rows(a.data)
    if a.max_rows:
        rows = rows[:a.max_rows]
    ids, n_bytes = token_stream(rows, tok, a.join)
    if len(ids) < 2:
        raise UserError(f"{a.data} holds too little text to evaluate ({len(ids)} tokens)")
    nll, n = sliding_window_nll(model, ids, window, stride, tok.bos_id if a.bos else None, a.batch_size)
    ppl, bpb = math.exp(nll / n), nll / (math.log(2) * n_bytes)
    print(f"data {a.data}: {len(rows)} rows, {n_bytes:,} bytes, {len(ids):,} tokens ({a.join}); "
          f"window {window}, stride {stride}, bos {a.bos}")
    print(f"scored tokens {n:,}  mean NLL {nll / n:.4f} nats  perplexity {ppl:.3f}  bits/byte {bpb:.4f}")
    emit({"ppl": ppl, "bpb": bpb, "tokens": n}, a.out)


if __name__ == "__main__":
    cli_main(main)
