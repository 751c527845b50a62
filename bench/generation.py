"""Wall time of train.py's generation evaluation: a 30-iteration run of the 8M shape with the
default generation settings, side by side with the same run without generations.

    python bench/generation.py [--threads=N] [--repeats=2] [--old] [--key=value ...]

The run is configs/base8M.py's shape (dim 288, 6 layers, vocab 8192, max_seq_len 256) with
batch 8, 30 iterations, eval_iters 2 and compile off, trained on the built-in corpus
(`tinystories.py synthesize`: 3 shards x 300 stories, pretokenized with tokenizers/tok8192.model
into a temporary folder). Evaluations at iterations 0 and 30 each generate 16 stories of up to
350 tokens (max_new_tokens's default) from test-split headers.

Every run is a process of its own (this script with --child: train.py's main() with
LMEvaluator.generate timed), and its wall time is measured from outside, from the interpreter's
start to its exit, as `time python train.py ...` would. The two settings alternate in ABBA order
(with generations first in even repeats, second in odd ones), so that the machine's drift and
whatever the first run after a pause pays fall on both. Every run and every pair is printed: the
pair's ratio (the run with generations over the one without) and the in-run ratio total /
(total - generation), which no drift between runs can move.

--old also times the generation before the rewrite (reconstructed below: every step past
max_seq_len re-encodes the last max_seq_len tokens without a cache, and rows generate all 350
tokens after their story has ended). --threads=N sets OMP_NUM_THREADS for every run (without it:
torch's default). Extra --key=value arguments go to train.py.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
# the parent only builds the corpus and times processes: torch, the model and train.py are
# imported by the runs (--child), not by it (a second or two of start-up less per bench)
from bench.measure import run_timed  # noqa: E402
from tinylab.data.dataset_spec import parse_spec  # noqa: E402
from tinylab.data.pretokenize import pretokenize  # noqa: E402
from tinylab.data.synthesize import synthesize  # noqa: E402


def old_generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, prompt_mask=None,
                 generator=None, stop_token=None):
    """Transformer.generate as it was before the rewrite (stop_token is ignored: rows never
    stopped), verbatim otherwise."""
    import torch
    with torch.no_grad():
        return _old_generate(self, idx, max_new_tokens, temperature, top_k, prompt_mask, generator)


def _old_generate(self, idx, max_new_tokens, temperature, top_k, prompt_mask, generator):
    import torch
    import torch.nn.functional as F

    from tinylab.nn.sampling import KVCache
    B, T = idx.shape
    L = self.params.max_seq_len
    total = T + max_new_tokens
    padded = prompt_mask is not None and not bool(prompt_mask.all())
    if padded:
        valid = torch.ones(B, total, dtype=torch.bool, device=idx.device)
        valid[:, :T] = prompt_mask
    dtype = next(self.parameters()).dtype
    cache = KVCache(self.params, B, min(total, L), idx.device, dtype) if T < L else None
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
    synthesize(root, num_shards=3, stories_per_shard=300, seed=0)
    shutil.copy(os.path.join(REPO, "tokenizers", "tok8192.model"), os.path.join(root, "tok8192.model"))
    pretokenize(root, 8192, parse_spec(), dataset_name="pretrain-all", seed=0, workers=1)


def torch_default_threads():
    import torch
    return f"(unset: torch default {torch.get_num_threads()})"


RESULT_LINE = re.compile(r"^bench-generation: (\S+) s, (\d+) tokens$", re.M)


def child(argv, old):
    """One run in this process: train.main(argv), then the seconds spent in LMEvaluator.generate
    and the tokens generated, as RESULT_LINE."""
    import model as model_lib
    import train
    from tinylab.core.errors import cli_main, leave_program
    from tinylab.eval.lm_eval import LMEvaluator
    spent, tokens = [0.0], [0]
    real_generate, real_eval_generate = model_lib.Transformer.generate, LMEvaluator.generate

    def eval_generate(self, *args, **kw):
        t = time.perf_counter()
        rows = real_eval_generate(self, *args, **kw)
        spent[0] += time.perf_counter() - t
        return rows

    def counting_generate(self, idx, *args, **kw):
        out = (old_generate if old else real_generate)(self, idx, *args, **kw)
        tokens[0] += out[:, idx.shape[1]:].numel()
        return out

    model_lib.Transformer.generate, LMEvaluator.generate = counting_generate, eval_generate
    try:
        cli_main(train.main, argv)  # train.py's own error boundary: one line, its exit code
    finally:
        leave_program()  # the process ends here, as `python train.py` does (its exit is timed too)
    print(f"bench-generation: {spent[0]:.3f} s, {tokens[0]} tokens")


def run_order(settings, repeats):
    """(repeat, setting) in the order the runs go: the first two settings ABBA (A first in even
    repeats, B first in odd ones), any further setting after them in every repeat."""
    for r in range(repeats):
        for setting in (settings[:2] if r % 2 == 0 else settings[1::-1]) + settings[2:]:
            yield r, setting


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS of every run (0: torch's default)")
    p.add_argument("--repeats", type=int, default=2, help="pairs of runs (ABBA order)")
    p.add_argument("--old", action="store_true", help="also time the generation before the rewrite (slow)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one run: a JSON [argv, old]
    args, overrides = p.parse_known_args()
    if args.child is not None:
        argv, old = json.loads(args.child)
        return child(argv, old)
    if args.repeats < 1:
        raise SystemExit("error: --repeats must be at least 1")
    env = dict(os.environ, WANDB_MODE="disabled")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    settings = [("default generation", [], False), ("max_new_tokens=0", ["--max_new_tokens=0"], False)]
    if args.old:
        settings.append(("before the rewrite", [], True))
    runs = {name: [] for name, _, _ in settings}  # (wall s, generation s, tokens) per repeat
    with tempfile.TemporaryDirectory() as root:
        built_in_corpus(os.path.join(root, "data"))
        print(f"{'run':>3} {'setting':20s} {'wall s':>7} {'CPU s':>7} {'generation s':>12} {'tokens':>6} {'load':>5}",
              flush=True)
        for r, (name, extra, old) in run_order(settings, args.repeats):
            run_dir = os.path.join(root, f"run-{r}-{settings.index((name, extra, old))}")
            argv = [os.path.join(REPO, "configs", "base8M.py"), f"--data_cache_dir={root}/data",
                    # base8M's own schedule (lr_decay_iters = its max_iters): the first steps of its warmup
                    "--dataset_name=pretrain-all", "--batch_size=8", "--max_iters=30", "--lr_decay_iters=100000",
                    "--eval_iters=2",
                    "--compile=False", "--device=cpu", "--dtype=float32", "--wandb_log=False",
                    f"--out_dir={run_dir}", *overrides, *extra]
            cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps([argv, old])]
            load = os.getloadavg()[0]
            wall, cpu, text, code = run_timed(cmd, REPO, env, run_dir + ".log")
            found = RESULT_LINE.findall(text)
            if code != 0 or not found:
                raise SystemExit(f"the {name!r} run failed (exit {code}); the end of its output:\n{text[-3000:]}")
            gen, tokens = float(found[-1][0]), int(found[-1][1])
            runs[name].append((wall, gen, tokens))
            print(f"{r:>3} {name:20s} {wall:7.1f} {cpu:7.1f} {gen:12.1f} {tokens:6d} {load:5.1f}", flush=True)
    print(f"8M shape, batch 8, 30 iterations, 2 evaluations x 16 prompts x up to 350 tokens, "
          f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS') or torch_default_threads()}"
          + (f"; train.py overrides {' '.join(overrides)}" if overrides else "") + "; whole-process wall time, every pair:")
    base = runs["max_new_tokens=0"]
    for name, results in runs.items():
        if name == "max_new_tokens=0":
            continue
        pairs = [w / b[0] for (w, _, _), b in zip(results, base)]
        inrun = [w / (w - g) for w, g, _ in results]
        print(f"  {name}: vs the run without generations " + " ".join(f"{x:.2f}" for x in pairs)
              + f" (median {statistics.median(pairs):.2f}); in-run total / (total - generation) "
              + " ".join(f"{x:.2f}" for x in inrun) + f" (median {statistics.median(inrun):.2f}); generation "
              + " ".join(f"{g:.1f}" for _, g, _ in results) + " s")


if __name__ == "__main__":
    main()
