"""What grow.py prints about a growth: one summary line, and the loss just before and after."""
import torch

from model import ModelArgs
from tinylab.core.checkpoint import model_from_checkpoint
from tinylab.core.errors import UserError
from tinylab.data.pretokenized import BatchLoader
from tinylab.data.records import dataset_dir
from tinylab.growth.ops import OPERATORS


def growth_summary(ckpt, grown, opts) -> str:
    """One line: what grew, and where the schedule continues."""
    old, new = ModelArgs.from_dict(ckpt["model_args"]), grown["model_args"]
    sched = grown.get("lr_rewarmup") or {}
    was = ckpt["iter_num"] - (ckpt.get("lr_rewarmup") or {}).get("shift", 0)
    if opts.mode == "exact":
        where = "; exact continuation"
    else:
        where = (f"; schedule position {grown['iter_num'] - sched['shift']} (was {was}), LR re-warmup over "
                 f"{sched['iters']} iterations")
        if "base_lr" in sched:
            where += f" to the checkpoint's learning_rate {sched['base_lr']:g}"
    if grown.get("optimizer") is None and ckpt.get("optimizer") is not None:
        where += "; optimizer state reset"
    layers = (f", layers {'copied' if opts.plain_copies else 'identity'} ({opts.placement})"
              if OPERATORS.get(opts.doubling).layer_variants else "")
    return (f"grew {opts.doubling} ({opts.mode}, symmetry breaking {opts.split}{layers}): dim {old.dim} -> "
            f"{new['dim']}, layers {old.n_layers} -> {new['n_layers']}, heads {old.n_heads} -> {new['n_heads']}, "
            f"hidden {old.ffn_hidden_dim()} -> {new['hidden_dim']}; iteration {grown['iter_num']}{where}")


@torch.no_grad()
def loss_change(ckpt, grown, cfg, batch_size=4, max_len=256):
    """(loss before, loss after, what it was measured on): a few test windows of the dataset the
    checkpoint's config names, if it is here, else seeded random tokens."""
    small = model_from_checkpoint(ckpt).eval()
    big = model_from_checkpoint(grown).eval()
    seq = min(max_len, small.params.max_seq_len)
    vocab = small.params.vocab_size
    folder = dataset_dir(cfg["data_cache_dir"], 0 if cfg.get("vocab_source") == "llama2" else vocab,
                         cfg["dataset_name"])
    try:
        x, y = next(iter(BatchLoader(folder, "test", batch_size, seq, seed=0)))
        what = f"{batch_size} test windows of {folder}"
    except UserError:  # no such dataset here (a checkpoint from elsewhere): the function still shows
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, vocab, (batch_size, seq + 1), generator=gen)
        x, y, what = tokens[:, :-1], tokens[:, 1:], f"{batch_size}x{seq} random tokens (no dataset found)"
    if x.max() >= vocab:
        raise UserError(f"the test data of {folder} has ids beyond the model's vocabulary ({vocab})")
    small(x, y, return_logits=False)
    big(x, y, return_logits=False)
    return small.last_loss.item(), big.last_loss.item(), what
