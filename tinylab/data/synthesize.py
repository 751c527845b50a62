"""`tinystories.py synthesize`: the built-in procedural corpus (synth_stories.py) as raw shards in
the TinyStories schema, one worker task per shard. The folder appears only when complete, with a
marker that records how it was made, so the same command again has nothing to do."""
import glob
import json
import os
import time

from tinylab.core.errors import UserError
from tinylab.core.fileio import building_dir, write_atomic
from tinylab.core.outputs import guard_folder
from tinylab.core.progress import progress
from tinylab.data.records import raw_data_dir
from tinylab.data.synth_stories import FEATURE_PROBS, generate_shard
from tinylab.data.workers import map_shards

SYNTH_MARKER = ".synthesized"  # in a raw folder made by `synthesize` (outputs.KINDS["raw_corpus"])


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
