"""`tinystories.py pretokenize`: transform, template and encode every raw shard into
<data_cache_dir>/tok{V}/<dataset_name>/dataNN.bin (uint16 ids, BOS before each example, no EOS)
+ manifest.json (how it was made). The output is byte-identical for the same inputs and seed,
whatever the number of workers: each shard has its own RNG (records.shard_rng). The folder
appears only when complete (built in a hidden temp folder, renamed)."""
import hashlib
import itertools
import json
import os
import time

import numpy as np

from tinylab.core.errors import UserError
from tinylab.core.fileio import atomic_file, building_dir, write_atomic
from tinylab.core.outputs import guard_folder
from tinylab.core.progress import progress
from tinylab.data.dataset_spec import parse_spec
from tinylab.data.records import (
    MAX_VOCAB,
    check_dataset_name,
    dataset_dir,
    load_raw_shard,
    raw_data_dir,
    raw_shards,
    shard_rng,
)
from tinylab.data.template import make_text
from tinylab.data.tokenizer import Tokenizer, load_tokenizer
from tinylab.data.workers import default_workers, map_shards

FORMAT_VERSION = 1  # of the pretokenized dataset folder (manifest.json + dataNN.bin)
ENCODE_CHUNK = 2048  # examples per sentencepiece call: bounded memory, negligible call overhead

_WORKER = {}  # per-process state of a pretokenize worker, set once by _init_worker


def _init_worker(tokenizer_path, options, seed, out_dir):
    _WORKER.update(tok=Tokenizer(tokenizer_path), spec=parse_spec(**options), seed=seed, out_dir=out_dir)


def _pretokenize_shard(task):
    """Transform, template and encode one raw shard into <out_dir>/dataNN.bin, streaming chunks
    to disk so memory stays bounded by the shard's JSON."""
    index, path = task
    tok, spec = _WORKER["tok"], _WORKER["spec"]
    records = load_raw_shard(path)
    rng = shard_rng(_WORKER["seed"], index)
    header_keys = spec.header_keys
    name = os.path.splitext(os.path.basename(path))[0] + ".bin"
    kept = tokens = 0
    digest = hashlib.sha256()
    with atomic_file(os.path.join(_WORKER["out_dir"], name)) as f:
        for start in range(0, len(records), ENCODE_CHUNK):
            texts = []
            for i in range(start, min(start + ENCODE_CHUNK, len(records))):
                example = spec.transform(records[i], rng)
                if example is not None:
                    texts.append(make_text(example, rng, header_keys))
            if not texts:
                continue
            ids = tok.encode_batch(texts, bos=True, eos=False)
            n = sum(map(len, ids))
            # vocab <= 65536 was checked up front, so every id fits; fromiter overflows otherwise
            data = np.fromiter(itertools.chain.from_iterable(ids), dtype="<u2", count=n).tobytes()
            f.write(data)
            digest.update(data)
            kept += len(texts)
            tokens += n
    return {"index": index, "file": name, "source": os.path.basename(path), "examples": len(records),
            "kept": kept, "tokens": tokens, "sha256": digest.hexdigest()}


def kept_fraction(shards) -> float:
    """The mean over shards of kept / examples, as the original reported it, over the shards that
    hold examples: an empty raw shard ([]) has no fraction to count (0 of 0 is not 0% kept)."""
    fractions = [r["kept"] / r["examples"] for r in shards if r["examples"]]
    return sum(fractions) / len(fractions)


def pretokenize_command(data_cache_dir, vocab_size, options, dataset_name, seed, tokenizer_model=None) -> str:
    """The command line that rebuilds a dataset (recorded in its manifest)."""
    parts = ["python tinystories.py pretokenize", f"--vocab_size={vocab_size}", f"--data_cache_dir={data_cache_dir}"]
    parts += [f"--{k}={v}" for k, v in options.items() if v is not None]
    parts += [f"--dataset_name={dataset_name}", f"--seed={seed}"]
    if tokenizer_model:
        parts.append(f"--tokenizer_model={tokenizer_model}")
    return " ".join(parts)


def pretokenize(data_cache_dir: str, vocab_size: int, spec, dataset_name: str = None, seed: int = 0,
                workers: int = None, tokenizer_model: str = None, force: bool = False) -> dict:
    """Build <cache>/tok{V}/<name>/ (one dataNN.bin per raw shard + manifest.json); returns the
    manifest. An existing dataset of that name is refused, or with `force` moved aside to
    <name>.previous-<time>."""
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    name = check_dataset_name(dataset_name or spec.name())
    shards = raw_shards(data_cache_dir)
    tok = load_tokenizer(data_cache_dir, vocab_size, tokenizer_model)
    if tok.vocab_size > MAX_VOCAB:
        raise UserError(f"tokenizer {tok.model_path} has {tok.vocab_size} pieces: ids >= {MAX_VOCAB} "
                        f"do not fit the uint16 .bin format")
    final = dataset_dir(data_cache_dir, vocab_size, name)
    guard_folder(final, "dataset", force, [tokenizer_model], "dataset", "--force")
    print(f"dataset {name}" + (f" (spec {spec.name()})" if name != spec.name() else "") + f" -> {final}")
    t0 = time.time()
    with building_dir(final) as tmp:
        results = _encode_shards(shards, workers, (tok.model_path, spec.options(), seed, tmp))
        _check_kept(results, spec, data_cache_dir)
        manifest = {
            "format_version": FORMAT_VERSION,
            "dataset_name": name,
            "spec": spec.name(),
            "options": spec.options(),
            "seed": seed,
            "vocab_size": tok.vocab_size,
            "vocab_size_flag": vocab_size,
            "tokenizer": {"file": os.path.basename(tok.model_path), "sha256": tok.sha256,
                          "vocab_size": tok.vocab_size, "bos_id": tok.bos_id},
            "format": {"dtype": "uint16", "byteorder": "little", "bos_before_each_example": True, "eos": False},
            "examples": sum(r["examples"] for r in results),
            "kept_examples": sum(r["kept"] for r in results),
            "kept_fraction": kept_fraction(results),
            "tokens": sum(r["tokens"] for r in results),
            "shards": results,
            "command": pretokenize_command(data_cache_dir, vocab_size, spec.options(), name, seed, tokenizer_model),
        }
        write_atomic(os.path.join(tmp, "manifest.json"), (json.dumps(manifest, indent=2) + "\n").encode())
    dt = time.time() - t0
    print(f"kept fraction {manifest['kept_fraction']:.5f} (mean over non-empty shards); {manifest['kept_examples']} "
          f"examples, {manifest['tokens']} tokens in {dt:.1f}s ({manifest['tokens'] / dt:,.0f} tokens/s)")
    return manifest


def _encode_shards(shards, workers, initargs) -> list:
    """The per-shard results, in shard order, with a progress display of the running totals."""
    results = [None] * len(shards)
    with progress(total=len(shards), unit="shard", desc="pretokenize") as bar:
        for r in map_shards(_pretokenize_shard, list(enumerate(shards)), workers, _init_worker, initargs):
            results[r["index"]] = r
            bar.update(1)
            done = [x for x in results if x]
            bar.set_postfix(stories=sum(x["kept"] for x in done), tokens=sum(x["tokens"] for x in done))
    for r in results:
        del r["index"]
    return results


def _check_kept(results, spec, data_cache_dir):
    """A dataset without a single example is an error; empty raw shards are a notice."""
    kept = sum(r["kept"] for r in results)
    empty = [r["source"] for r in results if r["examples"] == 0]
    if kept == 0:
        total = sum(r["examples"] for r in results)
        raise UserError(f"{spec.dropping_flags()} keeps no story of the {total} in "
                        f"{raw_data_dir(data_cache_dir)}" if total else
                        f"the raw shards in {raw_data_dir(data_cache_dir)} hold no stories (all {len(results)} "
                        f"are empty lists)")
    if empty:
        print(f"notice: {len(empty)} raw shard(s) hold no stories ([]): {', '.join(empty[:8])}"
              f"{', ...' if len(empty) > 8 else ''}; their .bin files are empty and kept_fraction leaves them out")
