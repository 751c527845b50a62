"""A validation (or test) group's loss as Megatron-DeepSpeed computes it (`valid_groups=blended`;
docs/t0.md, "Megatron-DeepSpeed's data and arguments"; megatron/training.py evaluate, 1015-1087):

  - the group is one dataset: each source next-fit packed on its own, the rows blended by weight
    (BlendableDataset: row i from the source maximising w * max(i, 1) - rows taken), every row
    from one source; too-long examples as too_long_examples says;
  - its loss is the plain mean over eval_iters micro-batches of each micro-batch's loss (the token
    mean of its target labels; with loss_normalization=example, its examples' mean), with no
    per-source weighting: sources weigh by their rows and target tokens;
  - the iterator is built once and continues: the evaluation at iteration it reads the rows
    [k n, (k + 1) n) of the group's stream, n = eval_iters * batch_size and
    k = max(ceil(it / eval_interval) - 1, 0), so Megatron's evaluations at eval_interval,
    2 eval_interval, ... (and the end) read consecutive rows; the evaluation at iteration 0 (which
    Megatron does not make) reads the first evaluation's rows. k comes from the iteration, so a
    resumed run reads what the uninterrupted one read. Test groups are evaluated once (k = 0).
"""
import numpy as np

from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.t0.batches import loss_weights, model_inputs
from tinylab.t0.packing import PackedStream, rows_to_arrays

VALID_GROUPS = Key("valid_groups", "per_source", "how a validation / test group is scored: "
                   "per_source = each source on its own fixed rows (the group's rows shared by weight), the "
                   "weighted mean of their token-mean losses | blended = Megatron's: one stream of single-source "
                   "rows blended by weight, the mean of eval_iters micro-batch losses, each evaluation reading the "
                   "stream's next rows", choices=("per_source", "blended"))
declare_difference(VALID_GROUPS, original="blended", family="t0",
                   behaviour="a group is one BlendableDataset of next-fit packed sources; its loss is the mean of "
                             "eval_iters x micro-batch losses, and its iterator continues across evaluations",
                   source="bigscience-workshop/Megatron-DeepSpeed megatron/training.py:1077")


def eval_position(it, eval_interval):
    """k: which block of rows the evaluation at iteration `it` reads (see the module docstring)."""
    return max(-(-it // max(1, eval_interval)) - 1, 0)


class BlendedRows:
    """A group's rows as Megatron's validation iterator gives them: `block(k)` is rows
    [k n, (k + 1) n) of one seeded PackedStream(mixing="row", packing="next_fit") over its sources,
    as token / segment / is-input arrays. The stream is kept, so consecutive blocks cost only
    their own rows; an earlier block restarts it."""

    def __init__(self, examples, weights, row_len, seed, n_rows, too_long="drop", pad_id=0):
        self.examples, self.weights, self.row_len, self.seed = examples, weights, row_len, seed
        self.n_rows, self.too_long, self.pad_id = n_rows, too_long, pad_id
        self.stream, self.pos = None, 0

    def block(self, k):
        start = k * self.n_rows
        if self.stream is None or start < self.pos:
            self.stream = PackedStream([e.lengths() for e in self.examples], self.weights, self.row_len, self.seed,
                                       mixing="row", packing="next_fit", too_long=self.too_long)
            self.pos = 0
        while self.pos < start:
            self.stream.next_row()
            self.pos += 1
        rows = self.stream.next_rows(self.n_rows)
        self.pos += self.n_rows
        return rows_to_arrays(rows, self.examples, self.row_len, self.pad_id)


def microbatch_mean_loss(model, arrays, batch_size, normalization, prefixlm, device):
    """The mean over consecutive micro-batches of `batch_size` rows of each one's own loss: token
    mean (loss_normalization token / token_microbatch) or mean over its examples (example)."""
    per_microbatch = "example" if normalization == "example" else "token"
    losses = []
    for start in range(0, len(arrays[0]), batch_size):
        batch, label_mask, label_seg = model_inputs(*(a[start:start + batch_size] for a in arrays), prefixlm, device)
        weights = loss_weights(label_mask, label_seg, per_microbatch)
        model(**batch, loss_weights=weights.to(device), return_logits=False)
        losses.append(model.last_loss.item())
    return float(np.mean(losses))
