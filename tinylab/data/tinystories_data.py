"""The TinyStories data stages behind `python tinystories.py`: download, synthesize, train_vocab,
pretokenize (the transforms themselves are dataset_spec.py's; the layout is docs/data.md).

Layout under data_cache_dir:
    TinyStories_all_data/dataNN.json      raw shards (download or synthesize)
    tok{V}.model, tok{V}.vocab            tokenizer (train_vocab; without one tokenizer.py falls back to
                                          the shipped tokenizers/tok{V}.model, e.g. the study's tok8192)
    tok{V}/{dataset_name}/dataNN.bin      uint16 tokens, BOS before each example, + manifest.json
    llama2/{dataset_name}/                the same for vocab_size=0 (the Llama 2 tokenizer)

Everything written is atomic: files go to a temp name and are renamed, dataset and raw folders
are built in a hidden temp folder and renamed when complete, so an interrupted command never
leaves something that looks finished.
"""
import glob
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tarfile
import tempfile
import time

import numpy as np

from tinylab.core.errors import UserError
from tinylab.core.fileio import atomic_file, building_dir, umask, write_atomic
from tinylab.core.outputs import guard_file, guard_folder
from tinylab.core.progress import progress
from tinylab.data.dataset_spec import (
    STREAM_VOCAB_TEXT,
    check_dataset_name,
    dataset_dir,
    load_raw_shard,
    make_text,
    parse_spec,
    raw_data_dir,
    shard_rng,
)
from tinylab.data.synth_stories import FEATURE_PROBS, generate_shard
from tinylab.data.tokenizer import Tokenizer, load_tokenizer

DATA_URL = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStories_all_data.tar.gz"
ARCHIVE_NAME = "TinyStories_all_data.tar.gz"
FORMAT_VERSION = 1  # of the pretokenized dataset folder (manifest.json + dataNN.bin)
MAX_VOCAB = 65536  # ids are stored as uint16
ENCODE_CHUNK = 2048  # examples per sentencepiece call: bounded memory, negligible call overhead
SYNTH_MARKER = ".synthesized"  # in a raw folder made by `synthesize` (outputs.KINDS["raw_corpus"])


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def map_shards(fn, tasks, workers, initializer=None, initargs=()):
    """Run fn over tasks in a process pool (results in completion order), or in-process for one
    worker. Only small per-shard results come back, so memory does not grow with shard count."""
    if workers <= 1 or len(tasks) <= 1:
        if initializer:
            initializer(*initargs)
        yield from map(fn, tasks)
        return
    # fork: workers inherit the already-imported modules (spawn would re-import them per worker)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(min(workers, len(tasks)), _worker_init,
                                                  (initializer, initargs)) as pool:
        yield from pool.imap_unordered(fn, tasks)  # on Ctrl-C the parent stops the pool (terminate)


def _worker_init(initializer, initargs):
    # Ctrl-C reaches the whole process group: only the parent reacts (one line, temp folder
    # removed); workers printing their own KeyboardInterrupt tracebacks would bury it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer:
        initializer(*initargs)


# ----------------------------------------------------------------------------------------------
# raw shards

def raw_shards(data_cache_dir: str) -> list:
    folder = raw_data_dir(data_cache_dir)
    shards = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not shards:
        raise UserError(f"no raw shards in {folder}: run: python tinystories.py download "
                        f"--data_cache_dir={data_cache_dir} (real TinyStories) or python tinystories.py "
                        f"synthesize --data_cache_dir={data_cache_dir} (built-in procedural corpus)")
    return shards


# ----------------------------------------------------------------------------------------------
# download

def _fetch(url: str, archive: str, timeout: float):
    """Stream `url` to `archive`, resuming a previous `.part` with an HTTP Range request."""
    import requests  # only this stage needs it

    part = archive + ".part"
    have = os.path.getsize(part) if os.path.exists(part) else 0
    headers = {"Accept-Encoding": "identity"}  # the bytes on disk must be the archive itself
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        with requests.get(url, stream=True, headers=headers, timeout=timeout) as r:
            if r.status_code == 416 and have:  # nothing left to fetch: the part is complete
                total = int(r.headers.get("Content-Range", "*/-1").split("/")[-1])
                if total == have:
                    os.replace(part, archive)
                    return
                os.remove(part)
                raise UserError(f"server refused to resume {part}; it was deleted, run the same command again")
            if r.status_code == 206:
                total = int(r.headers["Content-Range"].split("/")[-1])
                mode = "ab"
                print(f"resuming {archive} at {have} of {total} bytes")
            elif r.status_code == 200:  # no resume support (or a fresh start): from the beginning
                have, mode = 0, "wb"
                # without a Content-Length (chunked transfer) the size cannot be checked here: a cut
                # chunked stream raises in iter_content, and gzip's CRC catches the rest on unpacking
                total = int(r.headers["Content-Length"]) if "Content-Length" in r.headers else None
            else:
                raise UserError(f"download of {url} failed: HTTP {r.status_code} {r.reason}")
            with open(part, mode) as f, progress(total=total, initial=have, unit="B", unit_scale=True,
                                              unit_divisor=1024, desc=os.path.basename(archive)) as bar:
                # small blocks: an interrupted read loses at most one block of progress
                for block in r.iter_content(chunk_size=1 << 16):
                    f.write(block)
                    bar.update(len(block))
    except requests.RequestException as e:
        size = os.path.getsize(part) if os.path.exists(part) else 0
        raise UserError(f"download of {url} interrupted after {size} bytes ({type(e).__name__}); "
                        f"run the same command again to resume") from None
    size = os.path.getsize(part)
    if total is not None and size != total:
        raise UserError(f"downloaded {size} bytes of {archive} but the server announced {total}; "
                        f"run the same command again to resume")
    os.replace(part, archive)


def _extract(archive: str, target: str):
    """Unpack into a temp folder, refusing members that are not plain files/folders inside it,
    then rename the folder holding the .json shards to `target`."""
    parent = os.path.dirname(os.path.abspath(target))
    tmp = tempfile.mkdtemp(prefix=".tmp_extract_", dir=parent)
    try:
        try:
            with tarfile.open(archive, "r:*") as tar:
                for member in progress(tar, desc=f"unpacking {os.path.basename(archive)}", unit=" files"):
                    name = os.path.normpath(member.name)
                    if os.path.isabs(name) or name == ".." or name.startswith(".." + os.sep):
                        raise UserError(f"unsafe path '{member.name}' in {archive}: refusing to unpack it")
                    if not (member.isfile() or member.isdir()):
                        raise UserError(f"unsafe member '{member.name}' (link or device) in {archive}: "
                                        f"refusing to unpack it")
                    tar.extract(member, tmp, filter="data")
        except (tarfile.TarError, EOFError, OSError) as e:
            reason = " ".join(str(e).split())
            raise UserError(f"{archive} is not a readable tar.gz ({reason}); delete it and run download again") from None
        folders = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(tmp, "**", "*.json"), recursive=True)})
        if len(folders) != 1:
            raise UserError(f"{archive} should hold one folder of .json shards, found {len(folders)}")
        os.chmod(folders[0], 0o777 & ~umask())
        os.rename(folders[0], target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download(data_cache_dir: str, data_url: str = DATA_URL, timeout: float = 60):
    """Download and unpack TinyStories; each step is skipped when its result exists."""
    raw = raw_data_dir(data_cache_dir)
    if glob.glob(os.path.join(raw, "*.json")):
        print(f"{raw} already has the raw shards, nothing to do")
        return raw
    os.makedirs(data_cache_dir, exist_ok=True)
    archive = os.path.join(data_cache_dir, ARCHIVE_NAME)
    if os.path.exists(archive):
        print(f"{archive} already downloaded")
    else:
        print(f"downloading {data_url} to {archive}")
        _fetch(data_url, archive, timeout)
    if os.path.exists(raw):  # an empty or foreign folder would block the rename
        raise UserError(f"{raw} exists but holds no .json shards; remove it and run download again")
    _extract(archive, raw)
    shards = sorted(glob.glob(os.path.join(raw, "*.json")))
    print(f"unpacked {len(shards)} shards into {raw}")
    return raw


# ----------------------------------------------------------------------------------------------
# synthesize

def _synth_shard(task):
    index, seed, stories, out_dir = task
    records = generate_shard(seed, index, stories)
    write_atomic(os.path.join(out_dir, f"data{index:02d}.json"), json.dumps(records).encode())
    return len(records)


def synthesize(data_cache_dir: str, num_shards: int = 10, stories_per_shard: int = 4000, seed: int = 0,
               workers: int = 1, force: bool = False):
    """Write the built-in procedural corpus as raw shards in the TinyStories schema. The same
    corpus already there is kept (nothing to do); another one is moved aside only with `force`."""
    if num_shards < 1 or stories_per_shard < 1:
        raise UserError("--num_shards and --stories_per_shard must be >= 1 (shard 0 is the test split, "
                        "so use at least 2 shards to have training data)")
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    raw = raw_data_dir(data_cache_dir)
    info = {"num_shards": num_shards, "stories_per_shard": stories_per_shard, "seed": seed,
            "feature_probs": FEATURE_PROBS}
    if os.path.exists(raw) and not os.path.exists(os.path.join(raw, SYNTH_MARKER)):
        raise UserError(f"{raw} exists and was not made by synthesize (downloaded TinyStories?); "
                        f"use another --data_cache_dir or remove it first")
    if _same_corpus(raw, info):
        print(f"{raw} already holds this corpus ({num_shards} shards x {stories_per_shard} stories, seed {seed}); "
              f"nothing to do")
        return raw
    guard_folder(raw, "raw_corpus", force, flag="raw corpus", force_flag="--force")
    t0 = time.time()
    with building_dir(raw) as tmp:
        tasks = [(i, seed, stories_per_shard, tmp) for i in range(num_shards)]
        with progress(total=num_shards * stories_per_shard, unit=" stories", desc="synthesize") as bar:
            for n in map_shards(_synth_shard, tasks, workers):
                bar.update(n)
        write_atomic(os.path.join(tmp, SYNTH_MARKER), json.dumps(info, indent=2).encode())
    print(f"wrote {num_shards} shards x {stories_per_shard} stories to {raw} in {time.time() - t0:.1f}s")
    return raw


def _same_corpus(raw: str, info: dict) -> bool:
    """`raw` holds the complete corpus synthesize would write for `info`."""
    try:
        with open(os.path.join(raw, SYNTH_MARKER)) as f:
            made = json.load(f)
    except (OSError, ValueError):
        return False
    shards = [os.path.join(raw, f"data{i:02d}.json") for i in range(info["num_shards"])]
    return made == json.loads(json.dumps(info)) and all(os.path.isfile(p) for p in shards) and \
        len(glob.glob(os.path.join(raw, "*.json"))) == info["num_shards"]


# ----------------------------------------------------------------------------------------------
# train_vocab

def train_vocab(data_cache_dir: str, vocab_size: int, vocab_shards: int = 10, seed: int = 0,
                keep_text: bool = False, force: bool = False):
    """Train a sentencepiece BPE tokenizer <cache>/tok{V}.model on the template text of the first
    `vocab_shards` raw shards (the test shard included, as for the released tok8192). An existing
    tokenizer (perhaps the released one, copied in) is replaced only with `force`."""
    import sentencepiece as spm

    if vocab_size <= 0:
        raise UserError("train_vocab needs --vocab_size > 0 (0 means the Llama 2 tokenizer, which is not trained here)")
    if vocab_size > MAX_VOCAB:
        raise UserError(f"--vocab_size={vocab_size} does not fit the uint16 .bin format (at most {MAX_VOCAB})")
    if vocab_shards < 1:
        raise UserError(f"--vocab_shards must be >= 1, got {vocab_shards}")
    shards = raw_shards(data_cache_dir)[:vocab_shards]
    prefix = os.path.join(data_cache_dir, f"tok{vocab_size}")
    outputs = [(prefix + ".model", "sentencepiece"), (prefix + ".vocab", "sentencepiece")] + \
        ([(os.path.join(data_cache_dir, "tiny.txt"), "text")] if keep_text else [])
    existing = [p for p, _ in outputs if os.path.lexists(p)]
    if existing and not force:
        raise UserError(f"{existing[0]} already exists (datasets made with it would no longer match a new one); "
                        f"use --force to replace it")
    for path, kind in outputs:  # with --force: still never another kind of file, or a run's
        guard_file(path, kind, force, flag="train_vocab output")
    try:
        tmp = tempfile.mkdtemp(prefix=".tmp_vocab_", dir=data_cache_dir)
    except OSError as e:  # named by the tokenizer asked for, not by a temp name that never existed
        raise OSError(e.errno, e.strerror, prefix + ".model") from None
    try:
        text_file = os.path.join(tmp, "tiny.txt")
        with open(text_file, "w", encoding="utf-8") as out:
            for index, path in enumerate(progress(shards, desc="writing vocab text", unit="shard")):
                rng = shard_rng(seed, index, STREAM_VOCAB_TEXT)
                for i, example in enumerate(load_raw_shard(path)):
                    out.write(make_text(example, rng) + "\n")
        print(f"training a {vocab_size}-piece BPE vocabulary on {os.path.getsize(text_file) / 1e6:.1f} MB of text")
        # the original's options (docs/data.md, "Tokenizers"); its self_test_sample_size=0 is the
        # default, and newer sentencepiece versions print a deprecation warning when it is passed,
        # so it is left out
        try:
            spm.SentencePieceTrainer.train(
                input=text_file, model_prefix=os.path.join(tmp, f"tok{vocab_size}"), model_type="bpe",
                vocab_size=vocab_size, input_format="text", character_coverage=1.0,
                num_threads=default_workers(), split_digits=True, allow_whitespace_only_pieces=True,
                byte_fallback=True, unk_surface=r" \342\201\207 ", normalization_rule_name="identity",
                minloglevel=0 if sys.stderr.isatty() else 1)  # its log is the progress display
        except RuntimeError as e:  # e.g. a vocabulary too large for the text, or too small for its characters
            reason = str(e).strip().splitlines()[-1].split("] ")[-1]  # without the C++ source location
            raise UserError(f"sentencepiece could not train {vocab_size} pieces: {reason}") from None
        os.replace(os.path.join(tmp, f"tok{vocab_size}.vocab"), prefix + ".vocab")
        os.replace(os.path.join(tmp, f"tok{vocab_size}.model"), prefix + ".model")
        if keep_text:
            os.replace(text_file, os.path.join(data_cache_dir, "tiny.txt"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"trained tokenizer is in {prefix}.model")
    return prefix + ".model"


# ----------------------------------------------------------------------------------------------
# pretokenize

_WORKER = {}  # per-process state of a pretokenize worker, set once by _init_pretok_worker


def _init_pretok_worker(tokenizer_path, options, seed, out_dir):
    _WORKER.update(tok=Tokenizer(tokenizer_path), spec=parse_spec(**options), seed=seed, out_dir=out_dir)


def _pretokenize_shard(task):
    """Transform, template and encode one raw shard into <out_dir>/dataNN.bin, streaming chunks
    to disk so memory stays bounded by the shard's JSON."""
    index, path = task
    tok, spec = _WORKER["tok"], _WORKER["spec"]
    records = load_raw_shard(path)
    rng = shard_rng(_WORKER["seed"], index)
    name = os.path.splitext(os.path.basename(path))[0] + ".bin"
    kept = tokens = 0
    digest = hashlib.sha256()
    with atomic_file(os.path.join(_WORKER["out_dir"], name)) as f:
        for start in range(0, len(records), ENCODE_CHUNK):
            texts = []
            for i in range(start, min(start + ENCODE_CHUNK, len(records))):
                example = spec.transform(records[i], rng)
                if example is not None:
                    texts.append(make_text(example, rng, spec.subset))
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
    manifest. The output is byte-identical for the same inputs and seed, whatever `workers`. An
    existing dataset of that name is refused, or with `force` moved aside to <name>.previous-<time>."""
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
    results = [None] * len(shards)
    with building_dir(final) as tmp:
        initargs = (tok.model_path, spec.options(), seed, tmp)
        with progress(total=len(shards), unit="shard", desc="pretokenize") as bar:
            for r in map_shards(_pretokenize_shard, list(enumerate(shards)), workers, _init_pretok_worker, initargs):
                results[r["index"]] = r
                bar.update(1)
                done = [x for x in results if x]
                bar.set_postfix(stories=sum(x["kept"] for x in done), tokens=sum(x["tokens"] for x in done))
        for r in results:
            del r["index"]
        kept = sum(r["kept"] for r in results)
        empty = [r["source"] for r in results if r["examples"] == 0]
        if kept == 0:
            total = sum(r["examples"] for r in results)
            raise UserError(f"--filtering={spec.filtering} keeps no story of the {total} in "
                            f"{raw_data_dir(data_cache_dir)}" if total else
                            f"the raw shards in {raw_data_dir(data_cache_dir)} hold no stories (all {len(results)} "
                            f"are empty lists)")
        if empty:
            print(f"notice: {len(empty)} raw shard(s) hold no stories ([]): {', '.join(empty[:8])}"
                  f"{', ...' if len(empty) > 8 else ''}; their .bin files are empty and kept_fraction leaves them out")
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
            "kept_examples": kept,
            "kept_fraction": kept_fraction(results),
            "tokens": sum(r["tokens"] for r in results),
            "shards": results,
            "command": pretokenize_command(data_cache_dir, vocab_size, spec.options(), name, seed, tokenizer_model),
        }
        write_atomic(os.path.join(tmp, "manifest.json"), (json.dumps(manifest, indent=2) + "\n").encode())
    dt = time.time() - t0
    print(f"kept fraction {manifest['kept_fraction']:.5f} (mean over non-empty shards); {kept} examples, "
          f"{manifest['tokens']} tokens in {dt:.1f}s ({manifest['tokens'] / dt:,.0f} tokens/s)")
    return manifest
