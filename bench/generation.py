"""Wall time of train.py's generation evaluation: a 30-iteration run of the 8M shape with the
default generation settings, side by side with the same run without generations.

    python bench/generation.py [--threads=N] [--repeats=1] [--old] [--key=value ...]

The run is configs/base8M.py's shape (dim 288, 6 layers, vocab 8192, max_seq_len 256) with
batch 8, 30 iterations, eval_iters 2 and compile off, trained on the built-in corpus
(`tinystories.py synthesize`: 3 shards x 300 stories, pretokenized with tokenizers/tok8192.model
into a temporary folder). Evaluations at iterations 0 and 30 each generate 16 stories of up to
350 tokens (max_new_tokens's default) from test-split headers. Each setting runs train.py's
main() in this process; the generation share is the time spent in LMEvaluator.generate.

--old also times the generation before the rewrite (reconstructed below: every step past
max_seq_len re-encodes the last max_seq_len tokens without a cache, and rows generate all 350
tokens after their story has ended). Extra --key=value arguments go to train.py. With
--repeats=N the settings alternate N times and each keeps its best time (CPU timings on shared
machines drift).
"""
import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import model as model_lib  # noqa: E402
import train  # noqa: E402
from tinylab import tinystories_data  # noqa: E402
from tinylab.dataset_spec import parse_spec  # noqa: E402
from tinylab.lm_eval import LMEvaluator  # noqa: E402


@torch.no_grad()
def old_generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, prompt_mask=None,
                 generator=None, stop_token=None):
    """Transformer.generate as it was before the rewrite (stop_token is ignored: rows never
    stopped), verbatim otherwise."""
    B, T = idx.shape
    L = self.params.max_seq_len
    total = T + max_new_tokens
    padded = prompt_mask is not None and not bool(prompt_mask.all())
    if padded:
        valid = torch.ones(B, total, dtype=torch.bool, device=idx.device)
        valid[:, :T] = prompt_mask
    dtype = next(self.parameters()).dtype
    cache = model_lib.KVCache(self.params, B, min(total, L), idx.device, dtype) if T < L else None
    out = idx
    for step in range(max_new_tokens):
        n = out.shape[1]
        if cache is not None and n > cache.capacity:
            cache = None  # the window slides: every step re-reads the last L tokens
        w0 = 0 if cache is not None else max(0, n - L)
        q0 = n - 1 if (cache is not None and step > 0) else w0
        mask = pos = None
        if padded:
            keys = valid[:, w0:n]
            causal = torch.ones(n - q0, n - w0, dtype=torch.bool, device=idx.device).tril(q0 - w0)
            itself = torch.eye(n - w0, dtype=torch.bool, device=idx.device)[q0 - w0:]
            mask = (causal[None] & keys[:, None, :]) | itself[None]
            pos = (keys.long().cumsum(1) - 1).clamp_min(0)[:, q0 - w0:]
        logits = self(out[:, q0:], attn_mask=mask, position_ids=pos, kv_cache=cache)[:, -1, :]
        if temperature == 0.0:
            next_tok = torch.argmax(logits, dim=-1, keepdim=True)
        else:
            logits = logits.float() / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            next_tok = torch.multinomial(probs, num_samples=1, generator=generator)
        out = torch.cat((out, next_tok), dim=1)
    return out


def built_in_corpus(root):
    tinystories_data.synthesize(root, num_shards=3, stories_per_shard=300, seed=0)
    shutil.copy(os.path.join(REPO, "tokenizers", "tok8192.model"), os.path.join(root, "tok8192.model"))
    tinystories_data.pretokenize(root, 8192, parse_spec(), dataset_name="pretrain-all", seed=0, workers=1)


def timed_run(argv, old):
    """(total wall s, generation s, generated tokens) of one train.py run."""
    spent, tokens = [0.0], [0]
    real_generate, real_eval_generate = model_lib.Transformer.generate, LMEvaluator.generate

    def eval_generate(self, model, data_dir, iter_num):
        t = time.perf_counter()
        rows = real_eval_generate(self, model, data_dir, iter_num)
        spent[0] += time.perf_counter() - t
        return rows

    def counting_generate(self, idx, *args, **kw):
        out = (old_generate if old else real_generate)(self, idx, *args, **kw)
        tokens[0] += out[:, idx.shape[1]:].numel()
        return out

    model_lib.Transformer.generate, LMEvaluator.generate = counting_generate, eval_generate
    log = io.StringIO()
    try:
        t = time.perf_counter()
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            train.main(argv)
        return time.perf_counter() - t, spent[0], tokens[0]
    except BaseException:
        print(log.getvalue()[-3000:])
        raise
    finally:
        model_lib.Transformer.generate, LMEvaluator.generate = real_generate, real_eval_generate


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--old", action="store_true", help="also time the generation before the rewrite (slow)")
    args, overrides = p.parse_known_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("WANDB_MODE", "disabled")
    settings = [("default generation", [], False), ("max_new_tokens=0", ["--max_new_tokens=0"], False)]
    if args.old:
        settings.append(("before the rewrite", [], True))
    best = {}
    with tempfile.TemporaryDirectory() as root:
        built_in_corpus(os.path.join(root, "data"))
        for r in range(max(1, args.repeats)):
            for k, (name, extra, old) in enumerate(settings):
                argv = [os.path.join(REPO, "configs", "base8M.py"), f"--data_cache_dir={root}/data",
                        "--dataset_name=pretrain-all", "--batch_size=8", "--max_iters=30", "--eval_iters=2",
                        "--compile=False", "--device=cpu", "--dtype=float32", "--wandb_log=False",
                        f"--out_dir={root}/run-{r}-{k}", *overrides, *extra]
                result = timed_run(argv, old)
                print(f"  {name:20s} total {result[0]:6.1f} s, generation {result[1]:6.1f} s", flush=True)
                if name not in best or result[0] < best[name][0]:
                    best[name] = result
    print(f"8M shape, batch 8, 30 iterations, 2 evaluations x 16 prompts x up to 350 tokens, "
          f"torch threads {torch.get_num_threads()}, best of {max(1, args.repeats)}:")
    base = best["max_new_tokens=0"][0]
    for name, (total, gen, tokens) in best.items():
        line = f"  {name:20s} {total:6.1f} s = {total / base:.2f}x the run without generations"
        if tokens:
            # the same ratio from within the run (immune to drift between runs): total / (total - generation)
            line += (f"; generation {gen:.1f} s ({gen / total * 100:.0f}%, {tokens} tokens), "
                     f"{total / (total - gen):.2f}x its own time without it")
        print(line)


if __name__ == "__main__":
    main()
