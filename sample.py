"""Sample stories from a checkpoint.

    python sample.py --checkpoint=out/ckpt.pt --start="Features: Twist\\nWords: run, ball, red\\nStory:" \\
        --num_samples=3 --max_new_tokens=300 --temperature=0.8 --top_k=100 --seed=1

`--start` is the prompt (a literal "\\n" in it is a newline; FILE:path reads it from a file);
BOS is prepended as in training. The tokenizer is the one the checkpoint was trained with
(`data_cache_dir` / `vocab_size` / `tokenizer_model` of its config) unless --tokenizer_model says
otherwise. The story ends where the model starts the next example (BOS).
"""
import argparse
import sys

import torch

from tinylab.checkpoint import load_checkpoint, model_from_checkpoint
from tinylab.errors import UserError, cli_main
from tinylab.tokenizer import tokenizer_for_checkpoint


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="out/ckpt.pt")
    p.add_argument("--start", default="Features: Twist\\nWords: run, ball, red\\nStory:")
    p.add_argument("--num_samples", type=int, default=1)
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=0, help="0 = no top-k filtering")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--tokenizer_model", default="")
    p.add_argument("--data_cache_dir", default="")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)

    ckpt = load_checkpoint(args.checkpoint)
    model = model_from_checkpoint(ckpt).to(args.device).eval()
    tok = tokenizer_for_checkpoint(ckpt, args.tokenizer_model, args.data_cache_dir)
    if tok.vocab_size != model.params.vocab_size:
        raise UserError(f"tokenizer has {tok.vocab_size} pieces but the model's vocabulary is {model.params.vocab_size}")
    start = args.start
    if start.startswith("FILE:"):
        with open(start[5:]) as f:
            start = f.read()
    start = start.replace("\\n", "\n")
    ids = tok.encode(start, bos=True)
    new = args.max_new_tokens
    if len(ids) + new > model.params.max_seq_len:
        print(f"notice: prompt + {new} tokens exceed max_seq_len={model.params.max_seq_len}; beyond it the model "
              f"sees only the last {model.params.max_seq_len} tokens (as llama2.c)", file=sys.stderr)
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    x = torch.tensor([ids] * args.num_samples, dtype=torch.long, device=args.device)
    out = model.generate(x, new, temperature=args.temperature, top_k=args.top_k or None, generator=gen)
    for row in out.tolist():
        story = row[len(ids):]
        if tok.bos_id in story:
            story = story[:story.index(tok.bos_id)]
        print(tok.decode(ids[1:] + story))
        print("---------------")


if __name__ == "__main__":
    cli_main(main)
