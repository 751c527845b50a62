"""Batch-size and sequence-length warmup (staged-training's --warmup_bsz / --warmup_seq).

Both grow linearly with the number of tokens trained on so far (one counter, global over the
processes, kept in the checkpoint, so a resumed run makes the same choices):

    batch:     B(t) = start + (B - start) * min(1, tokens / warmup_bsz) sequences, where
               B = batch_size * gradient_accumulation_steps is the configured global batch;
               reached with fewer micro-steps (B(t) // batch_size, at least one per process) and
               micro-batches truncated to B(t) // micro-steps rows, as the original
               truncated its batches and lowered its accumulation;
    sequence:  L(t) = start + (max_seq_len - start) * min(1, tokens / warmup_seq) tokens, every
               window truncated to its first L(t) tokens.

The original starts both at 64 (`warmup_bsz_start`, `warmup_seq_start`). Rows and tokens cut off
a fetched batch are not trained on (the loader's position still moves by whole batches), which
keeps the data stream, and therefore resume and DDP, exactly as without warmup.
"""
from dataclasses import dataclass
from typing import Optional

from tinylab.core.config import COUNT, NONNEG, Key
from tinylab.core.errors import UserError

# train.py's "data" section lists these among the data keys (tinylab/schema.py)
WARMUP_KEYS = [
    Key("warmup_bsz", 0, "tokens over which the global batch grows from warmup_bsz_start sequences to "
        "batch_size * gradient_accumulation_steps (staged-training's --warmup_bsz); 0 = off", range=NONNEG),
    Key("warmup_bsz_start", 64, "sequences in the first batch of a batch-size warmup", range=COUNT),
    Key("warmup_seq", 0, "tokens over which the sequence length grows from warmup_seq_start to max_seq_len "
        "(staged-training's --warmup_seq); 0 = off", range=NONNEG),
    Key("warmup_seq_start", 64, "tokens per sequence at the start of a sequence-length warmup", range=COUNT),
]


@dataclass
class BatchWarmup:
    batch_size: int        # rows of a full micro-batch (per process)
    accum: int             # global micro-steps of a full batch (gradient_accumulation_steps)
    max_seq_len: int
    bsz_tokens: int = 0    # warmup_bsz: tokens over which the batch grows (0: no batch warmup)
    bsz_start: int = 64    # sequences in the first batch
    seq_tokens: int = 0    # warmup_seq: tokens over which the sequence length grows
    seq_start: int = 64    # tokens per sequence at the start

    @classmethod
    def from_config(cls, cfg) -> Optional["BatchWarmup"]:
        if not (cfg["warmup_bsz"] or cfg["warmup_seq"]):
            return None
        return cls(cfg["batch_size"], cfg["gradient_accumulation_steps"], cfg["max_seq_len"], cfg["warmup_bsz"],
                   cfg["warmup_bsz_start"], cfg["warmup_seq"], cfg["warmup_seq_start"])

    def check_config(self):
        """What a warmup needs of the configuration (any number of processes)."""
        batch = self.batch_size * self.accum
        if self.bsz_tokens and self.bsz_start >= batch:
            raise UserError(f"warmup_bsz_start={self.bsz_start} sequences is not below the global batch it should "
                            f"grow to (batch_size * gradient_accumulation_steps = {batch}): raise "
                            f"gradient_accumulation_steps or lower warmup_bsz_start")
        if self.seq_tokens and self.seq_start >= self.max_seq_len:
            raise UserError(f"warmup_seq_start={self.seq_start} is not below max_seq_len={self.max_seq_len}")

    def check(self, world: int):
        if self.bsz_tokens and self.bsz_start < world:
            raise UserError(f"warmup_bsz_start={self.bsz_start} is smaller than the number of processes ({world}): "
                            f"every process needs at least one sequence per step")
        return self

    def plan(self, tokens_seen: int, world: int):
        """(micro-steps per process, rows per micro-batch, tokens per row) of the next step."""
        micro, rows = self.accum // world, self.batch_size
        if self.bsz_tokens:
            final = self.batch_size * self.accum
            current = int(self.bsz_start + (final - self.bsz_start) * min(1.0, tokens_seen / self.bsz_tokens))
            if current < final:
                steps = min(self.accum, max(1, current // self.batch_size))
                steps = max(world, -(-steps // world) * world)  # a whole number of micro-steps per process
                micro, rows = steps // world, max(1, min(self.batch_size, current // steps))
        seq = self.max_seq_len
        if self.seq_tokens:
            seq = int(self.seq_start + (self.max_seq_len - self.seq_start) * min(1.0, tokens_seen / self.seq_tokens))
        return micro, rows, min(seq, self.max_seq_len)


def check_warmups(cfg):
    warmup = BatchWarmup.from_config(cfg)
    if warmup is not None:
        warmup.check_config()


def truncate(batch: dict, rows: int, seq: int) -> dict:
    """The first `rows` windows of a language-modelling batch, cut to their first `seq` tokens."""
    return {k: v[:rows, :seq] for k, v in batch.items()}
