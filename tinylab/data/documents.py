"""Document masks in pretraining (train.py's `document_mask`, `document_positions`).

A training window is L + 1 tokens cut from the concatenated stories, each story starting with
BOS, so a window usually holds the end of one story and the start of the next (or several). By
default every token attends to the whole window before it, other stories included (llama2.c,
nanoGPT; nanoGPT issue #320). With document_mask=True each token attends only within its own
story: the window's segment ids (nn.attention.bos_segments: a BOS opens a segment, the tokens
before the first BOS are one) go to model.forward as `segment_ids`, and the attention backend
builds the mask from them, as for T0's packed rows (SDPA's dense (B, 1, T, T) mask on the CPU,
FlexAttention's block mask on CUDA). The targets are unchanged: a story's last token still learns
to predict the BOS that ends it.

document_positions=True also restarts the RoPE positions at every BOS (position_ids), so a story
sees the positions it has alone at generation time. It needs document_mask: without the mask a
token would attend to the previous story's tokens at negative relative distances, which RoPE
never meets otherwise. With the mask it changes only rounding: RoPE's attention scores depend on
relative positions alone, and within one story those are the same either way.

The loss evaluations (loss/train, loss/test, loss/<name>) use the same masking as training; the
generation evaluation is unchanged (its prompts are single stories and a row stops at BOS).
"""
from dataclasses import dataclass

from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.nn.attention.masks import bos_segments, segment_positions

DOCUMENT_MASK = Key("document_mask", False, "each token attends only within its own story (the window split at "
                    "BOS), in training and the loss evaluations; False: across the whole window (llama2.c)")
DOCUMENT_POSITIONS = Key("document_positions", False, "with document_mask: RoPE positions restart at 0 at every "
                         "BOS (only rounding changes: RoPE is relative)")
DOCUMENT_KEYS = [DOCUMENT_MASK, DOCUMENT_POSITIONS]


@dataclass(frozen=True)
class DocumentOptions:
    mask: bool = False  # document_mask
    positions: bool = False  # document_positions

    @classmethod
    def from_config(cls, cfg) -> "DocumentOptions":
        return cls(cfg["document_mask"], cfg["document_positions"])

    def inputs(self, tokens, bos_id) -> dict:
        """model.forward's extra keyword arguments for windows `tokens` (B, T): {} without
        document_mask, else their segment ids (and position ids), made on the tokens' device."""
        if not self.mask:
            return {}
        seg = bos_segments(tokens, bos_id)
        return {"segment_ids": seg, "position_ids": segment_positions(seg)} if self.positions else {"segment_ids": seg}


def check_documents(cfg):
    if cfg["document_positions"] and not cfg["document_mask"]:
        raise UserError("document_positions=True needs document_mask=True (without the mask a token would see the "
                        "previous story at negative RoPE distances)")


class DocumentBatches:
    """The Trainer's batch source with document masks: the window loader's (x, y) as forward()
    keyword arguments with the windows' segment ids (and position ids). Its position is the
    loader's (state_dict), so resume is exact and unchanged."""

    def __init__(self, windows, bos_id, options: DocumentOptions):
        self.windows, self.bos_id, self.options = windows, bos_id, options

    def __iter__(self):
        return self

    def __next__(self):
        x, y = next(self.windows)
        return {"tokens": x, "targets": y, **self.options.inputs(x, self.bos_id)}

    def state_dict(self):
        return self.windows.state_dict()

    def load_state_dict(self, state):
        self.windows.load_state_dict(state)
