"""Benchmark: pretokenize throughput vs raw sentencepiece encoding, and peak memory vs shard count.

    python bench/pretokenize.py [--num_shards=8] [--stories_per_shard=5000] [--workers=N]
        [--vocab_size=2048 | --tokenizer_model=PATH] [--data_cache_dir=DIR] [--repeats=2]

On a synthesized corpus (made in DIR, a temp folder by default) it measures
  1. `pretokenize` end to end (process pool start, JSON load, transforms, template, encode,
     uint16 write, manifest), in tokens/s;
  2. sentencepiece alone encoding the very same texts with the same number of worker processes
     (texts and tokenizer preloaded in the workers, only the encode calls timed), in tokens/s;
  3. their ratio (target >= 0.8: the pipeline adds little beyond the tokenizer);
  4. the peak RSS of the largest process of a `tinystories.py pretokenize` run, for N and 2N
     shards of the same size (it should not grow with the shard count).
Best of --repeats for the timings. The numbers in docs/data.md come from this script.
"""
import argparse
import multiprocessing
import os
import pickle
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tinylab.data.dataset_spec import parse_spec  # noqa: E402
from tinylab.data.pretokenize import pretokenize  # noqa: E402
from tinylab.data.records import load_raw_shard, raw_shards, shard_rng  # noqa: E402
from tinylab.data.synthesize import synthesize  # noqa: E402
from tinylab.data.template import make_text  # noqa: E402
from tinylab.data.tokenizer import Tokenizer  # noqa: E402
from tinylab.data.vocab import train_vocab  # noqa: E402
from tinylab.data.workers import default_workers  # noqa: E402

_RAW = {}


def _init_raw(tokenizer_path, texts_path):
    _RAW["tok"] = Tokenizer(tokenizer_path)
    with open(texts_path, "rb") as f:
        _RAW["texts"] = pickle.load(f)


def _ready(_):
    return os.getpid()


def _encode(index):
    ids = _RAW["tok"].encode_batch(_RAW["texts"][index], bos=True)
    return sum(map(len, ids))


def pipeline_texts(cache, seed=0):
    """The exact strings pretokenize encodes without transforms (same per-shard RNG use)."""
    out = []
    for index, path in enumerate(raw_shards(cache)):
        rng = shard_rng(seed, index)
        out.append([make_text(example, rng) for example in load_raw_shard(path)])
    return out


def time_pipeline(cache, vocab, tokenizer_model, workers):
    t0 = time.perf_counter()
    m = pretokenize(cache, vocab, parse_spec(), dataset_name="bench", workers=workers,
                    tokenizer_model=tokenizer_model)
    return m["tokens"], time.perf_counter() - t0


def time_raw(tokenizer_path, texts_path, num_shards, workers):
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers, _init_raw, (tokenizer_path, texts_path)) as pool:
        pool.map(_ready, range(4 * workers))  # workers started and initialised before timing
        t0 = time.perf_counter()
        tokens = sum(pool.map(_encode, range(num_shards), chunksize=1))
        return tokens, time.perf_counter() - t0


def peak_rss_mb(cache, vocab, tokenizer_model, workers):
    """Max RSS (MB) over the pretokenize command and its workers, via wait4's rusage."""
    cmd = [sys.executable, os.path.join(REPO, "tinystories.py"), "pretokenize", f"--vocab_size={vocab}",
           f"--data_cache_dir={cache}", "--dataset_name=bench_rss", f"--workers={workers}",
           f"--tokenizer_model={tokenizer_model}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"pretokenize failed: {' '.join(cmd)}")
    return usage.ru_maxrss / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num_shards", type=int, default=8)
    p.add_argument("--stories_per_shard", type=int, default=5000)
    p.add_argument("--workers", type=int, default=default_workers())
    p.add_argument("--vocab_size", type=int, default=2048, help="trained on 2 shards unless --tokenizer_model")
    p.add_argument("--tokenizer_model", default=None, help="use this tokenizer instead of training one")
    p.add_argument("--data_cache_dir", default=None, help="default: a temp folder, deleted afterwards")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cache = args.data_cache_dir or tmp
        big = os.path.join(cache, "double")  # 2N shards of the same size, for the memory check
        synthesize(cache, args.num_shards, args.stories_per_shard, seed=0, workers=args.workers)
        synthesize(big, 2 * args.num_shards, args.stories_per_shard, seed=0, workers=args.workers)
        if args.tokenizer_model:
            tok_path = args.tokenizer_model
            vocab = Tokenizer(tok_path).vocab_size
        else:
            vocab = args.vocab_size
            tok_path = train_vocab(cache, vocab, vocab_shards=2)
        texts_path = os.path.join(cache, "bench_texts.pkl")
        with open(texts_path, "wb") as f:
            pickle.dump(pipeline_texts(cache), f)

        runs = [time_pipeline(cache, vocab, args.tokenizer_model, args.workers) for _ in range(args.repeats)]
        tokens, t_pipe = min(runs, key=lambda r: r[1])
        raw = [time_raw(tok_path, texts_path, args.num_shards, args.workers) for _ in range(args.repeats)]
        raw_tokens, t_raw = min(raw, key=lambda r: r[1])
        assert raw_tokens == tokens, (raw_tokens, tokens)  # the same texts, the same tokens
        rss = peak_rss_mb(cache, vocab, tok_path, args.workers)
        rss2 = peak_rss_mb(big, vocab, tok_path, args.workers)

    print()
    print(f"corpus: {args.num_shards} shards x {args.stories_per_shard} synthesized stories, "
          f"{tokens:,} tokens (vocab {vocab}), {args.workers} workers, {os.cpu_count()} CPUs")
    print(f"pretokenize (end to end)  : {tokens / t_pipe:12,.0f} tokens/s  ({t_pipe:.2f} s)")
    print(f"sentencepiece encode only : {tokens / t_raw:12,.0f} tokens/s  ({t_raw:.2f} s)")
    print(f"ratio                     : {t_raw / t_pipe:12.2f}  (target >= 0.8)")
    print(f"peak RSS, {args.num_shards:2d} shards       : {rss:9.0f} MB")
    print(f"peak RSS, {2 * args.num_shards:2d} shards       : {rss2:9.0f} MB")


if __name__ == "__main__":
    main()
