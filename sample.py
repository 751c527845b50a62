"""Sample stories from a checkpoint.

    python sample.py --checkpoint=out/ckpt.pt --start="Features: Twist\\nWords: run, ball, red\\nStory:" \\
        --num_samples=3 --max_new_tokens=300 --temperature=0.8 --top_k=100 --seed=1

`--start` is the prompt (a literal "\\n" in it is a newline; FILE:path reads it from a file);
BOS is prepended as in training. The tokenizer is the one the checkpoint was trained with
(`data_cache_dir` / `vocab_size` / `tokenizer_model` of its config, else the shipped
tokenizers/tok{V}.model or, for Llama 2 vocabularies, tokenizers/tokenizer.model: tinylab/data/tokenizer.py)
unless --tokenizer_model says otherwise. The story ends where the model starts the next example (BOS). The flags are
tinylab/schema.py's SAMPLE.
"""
import sys

from tinylab.core.checkpoint import load_checkpoint, model_from_checkpoint
from tinylab.core.errors import UserError, cli_main
from tinylab.core.fileio import read_text
from tinylab.core.memory_budget import check_generation
from tinylab.data.tokenizer import tokenizer_for_checkpoint
from tinylab.schema import SAMPLE


def read_prompt(start: str) -> str:
    if start.startswith("FILE:"):
        start = read_text(start[5:], "--start=FILE: prompt file")
    return start.replace("\\n", "\n")


def main(argv=None):
    import torch  # not at the top: tinylab loads first, with its Ctrl-C hook (tinylab/core/errors.py)

    a = SAMPLE.parse_args(argv, SAMPLE.argparser(__doc__.split("\n\n")[0]))
    start = read_prompt(a.start)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    ckpt = load_checkpoint(a.checkpoint)
    model = model_from_checkpoint(ckpt).to(device).eval()
    tok = tokenizer_for_checkpoint(ckpt, a.tokenizer_model, a.data_cache_dir)
    if tok.vocab_size != model.params.vocab_size:
        raise UserError(f"tokenizer has {tok.vocab_size} pieces but the model's vocabulary is {model.params.vocab_size}")
    ids = tok.encode(start, bos=True)
    new = a.max_new_tokens
    # the KV cache and sampling tables of num_samples x (prompt + max_new_tokens), before they are made
    check_generation(model, a.num_samples, len(ids), new, {"rows": "--num_samples", "new": "--max_new_tokens"})
    if len(ids) + new > model.params.max_seq_len:
        print(f"notice: prompt + {new} tokens exceed max_seq_len={model.params.max_seq_len}; beyond it the model "
              f"sees only its last {model.params.max_seq_len // 2} to {model.params.max_seq_len} tokens", file=sys.stderr)
    gen = torch.Generator(device=device).manual_seed(a.seed)
    x = torch.tensor([ids] * a.num_samples, dtype=torch.long, device=device)
    try:
        out = model.generate(x, new, temperature=a.temperature, top_k=a.top_k or None, generator=gen,
                             stop_token=tok.bos_id)  # a story ends where the next one starts
    except ValueError as e:  # NaN logits: a checkpoint of a diverged run
        raise UserError(f"{a.checkpoint}: {e}") from None
    for row in out.tolist():
        story = row[len(ids):]
        if tok.bos_id in story:
            story = story[:story.index(tok.bos_id)]
        print(tok.decode(ids[1:] + story))
        print("---------------")


if __name__ == "__main__":
    cli_main(main)
