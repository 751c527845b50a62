"""Flat uint16 token files: staged-training's memory-mapped format (its tools/mmap_dataset.py,
MMapTextDataset), read by evaluation/eval_wikitext.py's `eval --dataset=mmap` and `train`.

A token file is headerless uint16 token ids (native byte order, as numpy's memmap wrote them) and
nothing else: no manifest, no separators. With a block size b it is read as chunks of b - 2
consecutive tokens, chunk i = tokens [i(b - 2), (i + 1)(b - 2)), each wrapped as
[BOS] + chunk + [EOS] into a block of b tokens; the tokens after the last whole chunk are not
used. A block is scored (and trained on) as x = block[:-1], y = block[1:]: b - 1 predictions, the
EOS included, as GPT-2 with labels = input_ids did.

    TokenFile(path)   the file, checked: it exists, holds a whole number of tokens, is not empty
    ChunkBatches      the training batch source: a seeded shuffle of the chunks, exact resume
    ordered_batches   blocks in file order, batched (evaluation and validation)
"""
import hashlib
import json
import os

import numpy as np
import torch

from tinylab.core.errors import UserError

STATE_VERSION = 1  # of ChunkBatches.state_dict()
_SCAN = 1 << 24  # tokens per slice when scanning a file for its largest id


class TokenFile:
    """One flat uint16 token file, memory-mapped (the OS pages in only what is read)."""

    def __init__(self, path: str, what: str = "token file"):
        if os.path.isdir(path):
            raise UserError(f"{what} {path} is a folder, not a token file")
        if not os.path.isfile(path):
            raise UserError(f"{what} not found: {path}")
        size = os.path.getsize(path)
        if size % 2:
            raise UserError(f"{what} {path} has {size:,} bytes, not a whole number of uint16 tokens (2 bytes each): "
                            f"not a flat uint16 token file")
        if size == 0:
            raise UserError(f"{what} {path} is empty")
        self.path, self.what, self.n_tokens = path, what, size // 2
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        self._max = {}

    def n_chunks(self, block_size: int) -> int:
        return self.n_tokens // (block_size - 2)

    def check_chunks(self, block_size: int) -> int:
        """The number of blocks of block_size (at least one, else a UserError)."""
        if block_size < 3:
            raise UserError(f"--block-size={block_size}: a block of a token file holds BOS, at least one token and "
                            f"EOS (>= 3)")
        n = self.n_chunks(block_size)
        if n == 0:
            raise UserError(f"{self.what} {self.path} holds {self.n_tokens:,} tokens, fewer than one block's "
                            f"{block_size - 2} (--block-size={block_size} minus BOS and EOS)")
        return n

    def max_id(self, stop: int = None) -> int:
        """The largest token id among the first `stop` tokens (all by default)."""
        stop = self.n_tokens if stop is None else min(stop, self.n_tokens)
        if stop not in self._max:
            self._max[stop] = max(int(self.tokens[i:min(i + _SCAN, stop)].max()) for i in range(0, stop, _SCAN))
        return self._max[stop]

    def check_ids(self, vocab_size: int, stop: int = None, what: str = "the model's vocabulary"):
        """Every id among the first `stop` tokens is < vocab_size, else a UserError."""
        top = self.max_id(stop)
        if top >= vocab_size:
            raise UserError(f"{self.what} {self.path} holds token id {top}, outside {what} of {vocab_size} "
                            f"(ids 0..{vocab_size - 1}): was it tokenized with another tokenizer?")

    def blocks(self, chunk_ids, block_size: int, bos_id: int, eos_id: int) -> np.ndarray:
        """(len(chunk_ids), block_size) int64: [BOS] + chunk + [EOS] for each chunk index."""
        n = block_size - 2
        chunk_ids = np.asarray(chunk_ids, dtype=np.int64)
        out = np.empty((len(chunk_ids), block_size), dtype=np.int64)
        out[:, 0], out[:, -1] = bos_id, eos_id
        out[:, 1:-1] = self.tokens[chunk_ids[:, None] * n + np.arange(n, dtype=np.int64)]
        return out

    def identity(self) -> list:
        """What a data stream over this file depends on (its name and size, not its folder, so a
        run folder and its data may move)."""
        return [os.path.basename(self.path), self.n_tokens]


def check_special_ids(bos_id: int, eos_id: int, vocab_size: int, where: str):
    for name, i in (("BOS", bos_id), ("EOS", eos_id)):
        if not 0 <= i < vocab_size:
            raise UserError(f"the {name} id {i} ({where}) is outside the model's vocabulary of {vocab_size}")


def to_xy(blocks: np.ndarray, device="cpu"):
    w = torch.from_numpy(blocks)
    x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
    device = torch.device(device)
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def ordered_batches(tf: TokenFile, block_size: int, batch_size: int, bos_id: int, eos_id: int, max_batches: int = 0):
    """Blocks in file order, batch_size per batch (the last one may be smaller), the first
    max_batches batches (0 = all): a list of (B, block_size) int64 arrays, read when iterated."""
    n = tf.check_chunks(block_size)
    starts = range(0, n, batch_size)
    if max_batches:
        starts = starts[:max_batches]
    for s in starts:
        yield tf.blocks(np.arange(s, min(s + batch_size, n)), block_size, bos_id, eos_id)


class ChunkBatches:
    """Infinite, seeded, exactly resumable (x, y) int64 batches of shape (batch_size,
    block_size - 1) over the chunks of one token file, for the one training loop (trainer.py).

    Order: epoch e visits the chunks in the order default_rng([seed, e]).permutation(n). The
    stream runs on through the epochs without a break, so every batch is full (the original's
    DataLoader(shuffle=True) ended each epoch with a smaller batch). Global batch g is stream
    positions [g*B, (g+1)*B); rank r of W processes takes global batches r, r+W, r+2W, ..., so W
    processes with batch B see the data of one process with batch W*B. A position is computed,
    never read, so the state is one number: the chunks all ranks have consumed."""

    def __init__(self, tf: TokenFile, block_size, batch_size, bos_id, eos_id, seed, rank=0, world_size=1,
                 device="cpu"):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.tf, self.block_size, self.batch_size = tf, block_size, batch_size
        self.bos_id, self.eos_id, self.seed = bos_id, eos_id, seed
        self.rank, self.world_size, self.device = rank, world_size, device
        self.n = tf.check_chunks(block_size)
        key = json.dumps([seed, block_size, bos_id, eos_id, tf.identity()])
        self._stream_id = hashlib.sha256(key.encode()).hexdigest()[:16]
        self._base = 0  # chunks consumed (all ranks) before this run: resume
        self._batches = 0  # batches this rank has produced since
        self._perms = {}

    def _perm(self, epoch):
        if epoch not in self._perms:
            if len(self._perms) > 1:  # only the current and the next epoch are ever needed
                del self._perms[min(self._perms)]
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perms[epoch]

    def chunk_ids(self, global_batch: int) -> np.ndarray:
        positions = self._base + global_batch * self.batch_size + np.arange(self.batch_size, dtype=np.int64)
        epochs, within = np.divmod(positions, self.n)
        out = np.empty(self.batch_size, dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._perm(int(e))[within[sel]]
        return out

    def __iter__(self):
        return self

    def __next__(self):
        ids = self.chunk_ids(self._batches * self.world_size + self.rank)
        self._batches += 1
        return to_xy(self.tf.blocks(ids, self.block_size, self.bos_id, self.eos_id), self.device)

    def state_dict(self) -> dict:
        """The position after the batches produced so far, all ranks stepping together. JSON-able."""
        return {"version": STATE_VERSION, "stream": self._stream_id,
                "chunks_consumed": self._base + self._batches * self.world_size * self.batch_size,
                "batch_size": self.batch_size, "world_size": self.world_size}

    def load_state_dict(self, state: dict):
        """Continue after `state`: the next batch is the one the uninterrupted run would produce."""
        if state.get("version") != STATE_VERSION or "chunks_consumed" not in state:
            raise UserError("the checkpoint's data loader state is not a token-file position (was it written by "
                            "another command?); cannot resume it here")
        if state["stream"] != self._stream_id:
            raise UserError("the checkpoint's data loader state belongs to another data stream (the training file, "
                            "--block-size, --data-seed or the BOS/EOS ids changed); cannot resume its position")
        self._base = int(state["chunks_consumed"])
        self._batches = 0
