"""T0 model batches (docs/t0.md §5-6): packed rows -> forward() arguments with segment ids (the
model attends within each example, causal or prefix-LM; tinylab.nn.attention.document_mask), per-example
position ids and target-only loss weights; T0Batches, the Trainer's batch source.

    batch, label_mask, label_seg = model_inputs(*arrays, prefixlm, device)
    T0Batches(stream, examples, ...)
"""
import torch

from tinylab.core.errors import UserError
from tinylab.nn.attention.masks import segment_positions as position_ids  # each example restarts at 0
from tinylab.t0.packing import PackedStream, rows_to_arrays

NORMALIZATIONS = ("token", "example", "token_microbatch")


def shift(token_ids, seg, is_input):
    """Model view of full rows (length L + 1): tokens, labels, the label mask (the label is a
    target token: input->first target and the EOS included, inputs and padding excluded), the
    label's segment, and the segment / is-input arrays aligned with the tokens."""
    tokens, labels = token_ids[:, :-1], token_ids[:, 1:]
    label_mask = ~is_input[:, 1:] & (seg[:, 1:] != 0)
    return tokens, labels, label_mask, seg[:, 1:], seg[:, :-1], is_input[:, :-1]


def loss_weights(label_mask, label_seg, normalization, n_groups=1):
    """Per-label weights for a whole global batch (rows in micro-batch order; n_groups =
    micro-batches x ranks), such that sum(weights * CE) is the loss:
      token             sum CE / N, N = target labels of the global batch
      example           mean over the batch's examples of each example's mean target CE
                        (counts by segment id, per row; BLOOMZ's --norm-target-loss)
      token_microbatch  each micro-batch's token mean, averaged over micro-batches (Megatron)
    """
    m = label_mask.to(torch.float64)
    if normalization == "token":
        return m / m.sum().clamp_min(1)
    if normalization == "example":
        n_seg = int(label_seg.max()) + 1 if label_seg.numel() else 1
        counts = torch.zeros(m.shape[0], n_seg, dtype=torch.float64).scatter_add_(1, label_seg.long(), m)
        counts[:, 0] = 0  # padding is no example
        n_examples = (counts > 0).sum().clamp_min(1)
        return m / counts.gather(1, label_seg.long()).clamp_min(1) / n_examples
    if normalization == "token_microbatch":
        g = m.view(n_groups, -1, m.shape[-1])
        return (g / g.sum((1, 2), keepdim=True).clamp_min(1) / n_groups).view_as(m)
    raise UserError(f"loss_normalization must be one of {', '.join(NORMALIZATIONS)}, not '{normalization}'")


def model_inputs(token_ids, seg, is_input, prefixlm, device):
    """forward() keyword arguments of packed rows (numpy or torch (R, L + 1)), on `device`, and
    the label mask / label segments (on the CPU) for loss weights. The batch carries segment ids
    (and, for prefix-LM, the input tokens' prefix_mask), not a (R, L, L) mask: the model builds
    its attention mask from them at each forward (model.Transformer.packed_attention)."""
    token_ids, seg, is_input = (torch.as_tensor(a) for a in (token_ids, seg, is_input))
    tokens, labels, label_mask, label_seg, tok_seg, tok_inp = shift(token_ids, seg, is_input)
    tok_seg = tok_seg.to(device)
    batch = {"tokens": tokens.to(device), "targets": labels.to(device), "segment_ids": tok_seg,
             "position_ids": position_ids(tok_seg)}
    if prefixlm:
        batch["prefix_mask"] = tok_inp.to(device)
    return batch, label_mask, label_seg



class T0Batches:
    """The Trainer's batch source for packed multitask finetuning.

    Each iteration's global batch (micro_steps x world x batch_size rows) is packed at once by
    every rank from the same seeded stream, so the loss normaliser (target labels or examples of
    the whole global batch) is known in advance without communication; this rank then yields its
    micro-batches. Loss weights make sum(weights * CE) over the global batch the loss, and
    loss_scale = world undoes DDP's gradient averaging. state_dict() is the stream position at
    an iteration boundary (exact resume, also with another world size).
    """
    VERSION = 1

    def __init__(self, stream: PackedStream, examples, batch_size, micro_steps, rank, world,
                 normalization, prefixlm, device, param_dtype=torch.float32, pad_id=0, identity=""):
        self.stream, self.examples = stream, examples
        self.batch_size, self.micro_steps, self.rank, self.world = batch_size, micro_steps, rank, world
        self.normalization, self.prefixlm, self.device = normalization, prefixlm, device
        self.param_dtype, self.pad_id, self.identity = param_dtype, pad_id, identity
        self.queue = []

    def __iter__(self):
        return self

    def _fill(self):
        n_groups = self.micro_steps * self.world
        rows = self.stream.next_rows(n_groups * self.batch_size)
        arrays = [torch.as_tensor(a) for a in rows_to_arrays(rows, self.examples, self.stream.row_len, self.pad_id)]
        _, _, label_mask, label_seg, _, _ = shift(*arrays)
        weights = loss_weights(label_mask, label_seg, self.normalization, n_groups)
        B = self.batch_size
        for m in range(self.micro_steps):
            g = m * self.world + self.rank  # micro-batch m of every rank, then the next m
            part = slice(g * B, (g + 1) * B)
            batch, _, _ = model_inputs(*(a[part] for a in arrays), self.prefixlm, self.device)
            batch["loss_weights"] = weights[part].to(device=self.device, dtype=self.param_dtype)
            batch["loss_scale"] = float(self.world)
            self.queue.append(batch)

    def __next__(self):
        if not self.queue:
            self._fill()
        return self.queue.pop(0)

    def state_dict(self):
        return {"version": self.VERSION, "identity": self.identity, "stream": self.stream.state_dict()}

    def load_state_dict(self, state):
        if state.get("version") != self.VERSION or state.get("identity") != self.identity:
            raise UserError("the checkpoint's data position belongs to another mixture (sources, weights, "
                            "tokenisation, max_seq_len, mixing, packing or seed changed); cannot resume it exactly "
                            "(a run started before packing=best_fit existed resumes with --packing=next_fit)")
        self.stream.load_state_dict(state["stream"])
        self.queue = []
