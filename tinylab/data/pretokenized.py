"""Batches from a pretokenized dataset folder (dataNN.bin + manifest.json), for train.py.

Splits: shard 0 (data00.bin) is the test split (it doubles as validation); any other split name
reads shards 1.. . With split_shards_pretrain, pretraining reads the first int(0.8 * n) train
shards and fine-tuning (pretraining=False) the rest. Empty shards (a filter kept nothing there)
are skipped; a split with no data left is a UserError.

Windows: training mode cuts each shard into n = len // L - 1 non-overlapping windows of L + 1
tokens (x = w[:-1], y = w[1:], L = max_seq_len), ignoring example boundaries. BOS-aligned mode
(split_on_bos, for generation prompts and probes) starts a window at every BOS but the last,
keeping those with L input tokens.

Seeding (a deliberate deviation from llama2.c's `seed + 1337 * rank + worker`): all ranks read
ONE global window stream that depends only on `seed`. Epoch e visits the shards in the order
default_rng([seed, 1, e]).permutation and each shard's windows in the order
default_rng([seed, 2, e, shard]).permutation; global batch g is windows [g*B, (g+1)*B) of that
stream, and rank r of W takes global batches r, r+W, r+2W, ... So a W-process DDP run with
batch B sees exactly the data of a 1-process run with batch W*B (the DDP-vs-1-process loss test
relies on this), and any position of the stream can be computed without reading data, which
makes resume exact and cheap: the state is just how many windows all ranks have consumed.
"""
import glob
import hashlib
import json
import os

import numpy as np
import torch

from tinylab.core.errors import UserError, first_line
from tinylab.data.dataset_spec import infer_pretokenize_flags
from tinylab.data.records import dataset_dir
from tinylab.data.tokenizer import file_sha256, tokenizer_model_path

PRETRAIN_SHARD_PERCENTAGE = 0.8
FORMAT_VERSION = 1  # of manifest.json, written by tinystories.py pretokenize
STATE_VERSION = 1  # of BatchLoader.state_dict()
_ORDER, _PERM = 1, 2  # RNG stream tags: shard order / windows within a shard


def _rebuild_hint(data_cache_dir, vocab_size, dataset_name, tokenizer_model):
    flags = infer_pretokenize_flags(dataset_name)
    cmd = (f"python tinystories.py pretokenize --vocab_size={vocab_size} --data_cache_dir={data_cache_dir} "
           + " ".join(flags or []) + (" " if flags else "") + f"--dataset_name={dataset_name}")
    if tokenizer_model:
        cmd += f" --tokenizer_model={tokenizer_model}"
    if flags is None:
        cmd += " <the --filtering/--mix_match/... flags it was built with>"
    return cmd


# what train.py reads from a manifest, key by key (tinystories.py pretokenize writes the rest too)
MANIFEST_KEYS = {"format_version": int, "vocab_size": int, "tokenizer": dict, "shards": list}
SHARD_KEYS = {"file": str, "tokens": int}


def check_manifest(manifest, path):
    """A one-line UserError naming the first missing or mistyped entry of a manifest."""
    def bad(what):
        return UserError(f"{path}: {what}; rebuild the dataset with pretokenize")
    if not isinstance(manifest, dict):
        raise bad(f"expected a JSON object, got {type(manifest).__name__}")
    for key, t in MANIFEST_KEYS.items():
        if key not in manifest:
            raise bad(f"no '{key}' entry")
        if not isinstance(manifest[key], t) or isinstance(manifest[key], bool):
            raise bad(f"'{key}' should be {t.__name__}, not {type(manifest[key]).__name__}")
    if not isinstance(manifest["tokenizer"].get("sha256"), str):
        raise bad("'tokenizer' has no sha256 string")
    for i, shard in enumerate(manifest["shards"]):
        if not isinstance(shard, dict):
            raise bad(f"shards[{i}] is not an object")
        for key, t in SHARD_KEYS.items():
            if not isinstance(shard.get(key), t) or isinstance(shard.get(key), bool):
                raise bad(f"shards[{i}] has no {t.__name__} '{key}'")
        if os.path.basename(shard["file"]) != shard["file"] or not shard["file"].endswith(".bin"):
            raise bad(f"shards[{i}].file {shard['file']!r} is not a .bin file name")


def check_dataset(data_cache_dir, vocab_size, dataset_name, tokenizer_model=None) -> dict:
    """Return the manifest of <cache>/tok{V}/<name> (vocab 0: <cache>/llama2/<name>) after checking
    that it exists, is complete, and was made with this vocabulary and tokenizer file."""
    folder = dataset_dir(data_cache_dir, vocab_size, dataset_name)
    path = os.path.join(folder, "manifest.json")
    if not os.path.isfile(path):
        what = "has no manifest.json" if os.path.isdir(folder) else "not found"
        raise UserError(f"dataset {folder} {what}: run: "
                        f"{_rebuild_hint(data_cache_dir, vocab_size, dataset_name, tokenizer_model)}")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except ValueError as e:  # (UnicodeDecodeError is a ValueError too)
        raise UserError(f"corrupt {path} ({first_line(e, 80)}); rebuild the dataset with pretokenize") from None
    check_manifest(manifest, path)
    if manifest["format_version"] != FORMAT_VERSION:
        raise UserError(f"{path} has format version {manifest.get('format_version')}, this code reads "
                        f"{FORMAT_VERSION}; rebuild the dataset with pretokenize")
    if vocab_size > 0 and manifest["vocab_size"] != vocab_size:
        raise UserError(f"dataset {folder} was tokenized with {manifest['vocab_size']} pieces but "
                        f"vocab_size={vocab_size}")
    try:  # the file the programs will use (tokenizer.py), or none: training itself does not need it
        tok_path = tokenizer_model_path(data_cache_dir, vocab_size, tokenizer_model)
    except UserError:
        tok_path = None
    if tok_path:
        sha = file_sha256(tok_path)
        if sha != manifest["tokenizer"]["sha256"]:
            raise UserError(f"dataset {folder} was tokenized with a different tokenizer than {tok_path} "
                            f"(sha256 {manifest['tokenizer']['sha256'][:12]}... vs {sha[:12]}...): "
                            f"rebuild it with pretokenize or restore the tokenizer it was made with")
    for shard in manifest["shards"]:
        p = os.path.join(folder, shard["file"])
        if not os.path.isfile(p) or os.path.getsize(p) != 2 * shard["tokens"]:
            raise UserError(f"{p} is missing or has the wrong size; rebuild the dataset with pretokenize")
    return manifest


def shard_paths(data_dir, split, split_shards_pretrain=False, pretraining=True) -> list:
    """The non-empty .bin shards of `split` (see the module docstring)."""
    paths = sorted(glob.glob(os.path.join(data_dir, "*.bin")))
    if not paths:
        raise UserError(f"no .bin shards in {data_dir}: build the dataset with python tinystories.py pretokenize")
    if split == "test":
        paths = paths[:1]
    else:
        paths = paths[1:]
        if split_shards_pretrain:
            cut = int(len(paths) * PRETRAIN_SHARD_PERCENTAGE)
            paths = paths[:cut] if pretraining else paths[cut:]
    paths = [p for p in paths if os.path.getsize(p) > 0]
    if not paths:
        part = "" if not split_shards_pretrain or split == "test" else \
            (" (pretraining part)" if pretraining else " (fine-tuning part)")
        raise UserError(f"split '{split}'{part} of {data_dir} has no non-empty shard "
                        f"(shard 0 is the test split, shards 1.. train; the filter may have kept nothing there)")
    return paths


class BatchLoader:
    """Infinite, seeded, resumable (x, y) int64 batches of shape (batch_size, max_seq_len)."""

    def __init__(self, data_dir, split, batch_size, max_seq_len, seed, rank=0, world_size=1,
                 split_on_bos=False, split_shards_pretrain=False, pretraining=True, bos_id=1, device="cpu"):
        if batch_size < 1 or max_seq_len < 1:
            raise UserError(f"batch_size and max_seq_len must be >= 1, got {batch_size}, {max_seq_len}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if seed < 0:
            raise UserError(f"seed must be >= 0 for the data loader, got {seed}")
        self.paths = shard_paths(data_dir, split, split_shards_pretrain, pretraining)
        self.batch_size, self.seq_len, self.seed = batch_size, max_seq_len, seed
        self.rank, self.world_size = rank, world_size
        self.split_on_bos, self.device = split_on_bos, torch.device(device)
        # zero-copy: the OS pages in only the windows that are read
        self._shards = [np.memmap(p, dtype=np.uint16, mode="r") for p in self.paths]
        if split_on_bos:
            # window starts: every BOS but the last, with L + 1 tokens available after it
            self._starts = []
            for m in self._shards:
                bos = np.flatnonzero(m == bos_id)[:-1]
                self._starts.append(bos[bos + max_seq_len + 1 <= len(m)])
            counts = [len(s) for s in self._starts]
        else:
            counts = [max(len(m) // max_seq_len - 1, 0) for m in self._shards]
        self._counts = np.array(counts, dtype=np.int64)
        self.windows_per_epoch = int(self._counts.sum())
        if self.windows_per_epoch == 0:
            mode = "BOS-aligned windows" if split_on_bos else "windows"
            raise UserError(f"split '{split}' of {data_dir} is too small for {mode} of {max_seq_len + 1} tokens")
        key = json.dumps([seed, max_seq_len, split_on_bos, bos_id, counts, [os.path.basename(p) for p in self.paths]])
        self._stream_id = hashlib.sha256(key.encode()).hexdigest()[:16]
        self._base = 0  # global windows consumed before this run (resume)
        self._batches = 0  # batches this rank has produced since
        self._epochs = {}  # epoch -> (shard order, cumulative window ends in that order)
        self._perms = {}  # (epoch, shard) -> window permutation

    @classmethod
    def from_options(cls, data, split, seed, **kwargs) -> "BatchLoader":
        """The loader of `split` of the training dataset of `data` (an options.LMDataOptions): its
        folder, batch size, sequence length and shard split; `kwargs` as the constructor's."""
        return cls(data.dataset_dir(), split, data.batch_size, data.max_seq_len, seed,
                   split_shards_pretrain=data.split_shards_pretrain, pretraining=data.pretraining, **kwargs)

    # --- the global stream ---------------------------------------------------------------------

    def _epoch_layout(self, epoch):
        if epoch not in self._epochs:
            if len(self._epochs) > 1:  # only the current and next epoch are ever needed
                old = min(self._epochs)
                del self._epochs[old]
                self._perms = {k: v for k, v in self._perms.items() if k[0] != old}
            order = np.random.default_rng([self.seed, _ORDER, epoch]).permutation(len(self._shards))
            self._epochs[epoch] = (order, np.cumsum(self._counts[order]))
        return self._epochs[epoch]

    def _perm(self, epoch, shard):
        if (epoch, shard) not in self._perms:
            rng = np.random.default_rng([self.seed, _PERM, epoch, shard])
            self._perms[(epoch, shard)] = rng.permutation(int(self._counts[shard]))
        return self._perms[(epoch, shard)]

    def _locate(self, positions):
        """Global window positions -> (shard index, start token) arrays, without reading data."""
        shards = np.empty(len(positions), dtype=np.int64)
        starts = np.empty(len(positions), dtype=np.int64)
        epochs, within = np.divmod(positions, self.windows_per_epoch)
        for epoch in np.unique(epochs):
            sel = np.flatnonzero(epochs == epoch)
            order, ends = self._epoch_layout(int(epoch))
            k = np.searchsorted(ends, within[sel], side="right")
            shard = order[k]
            local = within[sel] - (ends[k] - self._counts[shard])
            for s in np.unique(shard):
                rows = shard == s
                window = self._perm(int(epoch), int(s))[local[rows]]
                starts[sel[rows]] = self._starts[s][window] if self.split_on_bos else window * self.seq_len
                shards[sel[rows]] = s
        return shards, starts

    def _batch(self, global_batch):
        positions = self._base + global_batch * self.batch_size + np.arange(self.batch_size, dtype=np.int64)
        shards, starts = self._locate(positions)
        out = np.empty((self.batch_size, self.seq_len + 1), dtype=np.int64)
        offsets = np.arange(self.seq_len + 1, dtype=np.int64)
        for s in np.unique(shards):
            rows = np.flatnonzero(shards == s)
            out[rows] = self._shards[s][starts[rows, None] + offsets]  # one fancy-index read per shard
        w = torch.from_numpy(out)
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    # --- iteration and resume -------------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        batch = self._batch(self._batches * self.world_size + self.rank)
        self._batches += 1
        return batch

    def state_dict(self) -> dict:
        """The position after the batches produced so far, assuming all ranks step together (the
        checkpointing rank's view). JSON-able."""
        return {"version": STATE_VERSION, "stream": self._stream_id,
                "windows_consumed": self._base + self._batches * self.world_size * self.batch_size,
                "batch_size": self.batch_size, "world_size": self.world_size}

    def load_state_dict(self, state: dict):
        """Continue after `state`: the next batch is the one the uninterrupted run would produce,
        also with another world size or per-rank batch size (positions are global windows)."""
        if state.get("version") != STATE_VERSION:
            raise UserError(f"data loader state version {state.get('version')} is not {STATE_VERSION}")
        if state["stream"] != self._stream_id:
            raise UserError("the checkpoint's data loader state belongs to another data stream (dataset, "
                            "split, seed, max_seq_len or BOS mode changed); cannot resume its position")
        self._base = int(state["windows_consumed"])
        self._batches = 0
