"""Per-layer linear probes on a frozen model's hidden states: can the six story features be read
off each block's output? (evaluation/probe.py; docs/evaluation.md)"""
import numpy as np
import torch
import torch.nn.functional as F

from tinylab.dataset_spec import (
    FEATURES,
    STORY_FEATURES,
    feature_labels,
    header_end,
    header_fields,
)
from tinylab.errors import UserError
from tinylab.eval_common import right_pad
from tinylab.pretokenized import shard_paths
from tinylab.progress import progress

# probe label j is STORY_FEATURES[j]; outputs name it as the raw feature (Twist, BadEnding, ...)
LABEL_NAMES = [next(f for f in FEATURES if f.lower() == s) for s in STORY_FEATURES]


def story_examples(data_dir, split, n, seed, tokenizer, max_len):
    """Up to n (story-only ids: BOS + story tokens, at most max_len; 6 labels) from the examples of
    `split`, visiting shards in order and each shard's examples in a seeded random order."""
    bos = tokenizer.bos_id
    out = []
    for s, path in enumerate(shard_paths(data_dir, split)):
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        starts = np.flatnonzero(tokens == bos)
        ends = np.append(starts[1:], len(tokens))
        for i in np.random.default_rng([seed, s]).permutation(len(starts)):
            ids = tokens[starts[i]:ends[i]].tolist()
            try:
                h = header_end(ids, tokenizer)
            except ValueError:  # no 'Story:' line: not an example of the template
                continue
            story = ids[h:]
            if not story:
                continue
            labels = feature_labels(header_fields(tokenizer.decode(ids[1:h])).get("Features", ""))
            out.append((([bos] + story)[:max_len], labels))
            if len(out) >= n:
                return out
    return out


@torch.no_grad()
def pooled_states(model, sequences, pool=10, batch_size=16):
    """(N, n_layers, dim) float32: per block, the mean output over each sequence's last `pool`
    real positions. Right padding leaves the real positions untouched (causal attention)."""
    device = next(model.parameters()).device
    feats = []
    bar = progress(total=len(sequences), desc="hidden states", unit="story")
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start:start + batch_size]
        hs = torch.stack(model.hidden_states(right_pad(chunk).to(device)), dim=1).float().cpu()  # (B, L, T, dim)
        for i, s in enumerate(chunk):
            feats.append(hs[i, :, max(0, len(s) - pool):len(s)].mean(dim=1))
        bar.update(len(chunk))
    bar.close()
    return torch.stack(feats)


def train_probes(train_x, train_y, iters=2000, lr=1e-3, batch_size=128, seed=0):
    """One bias-free linear head per layer, trained jointly (the summed BCE of independent heads
    gives each head its own gradient). train_x (N, L, dim), train_y (N, 6). Returns (L, dim, 6)."""
    n, n_layers, dim = train_x.shape
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n_layers, dim, train_y.shape[1], generator=gen) * dim ** -0.5).requires_grad_()
    opt = torch.optim.Adam([w], lr=lr)
    y = train_y.float()
    for _ in progress(range(iters), desc="probes", unit="it"):
        idx = torch.randint(0, n, (min(batch_size, n),), generator=gen)
        logits = torch.einsum("bld,ldk->blk", train_x[idx], w)
        loss = F.binary_cross_entropy_with_logits(logits, y[idx, None, :].expand_as(logits), reduction="none")
        loss.mean(dim=(0, 2)).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return w.detach()


def probe_accuracy(w, x, y):
    """(L, 6) accuracy of each layer's head on each label."""
    pred = torch.einsum("bld,ldk->blk", x, w) > 0
    return (pred == y[:, None, :].bool()).float().mean(dim=0)


def run_probes(model, tokenizer, data_dir, num_train=2000, num_test=500, iters=2000, lr=1e-3,
               batch_size=128, pool=10, seed=0):
    """Extract, train and measure; returns dict(acc (L, 6), baseline (6,), n_train, n_test)."""
    max_len = model.params.max_seq_len
    train = story_examples(data_dir, "train", num_train, seed, tokenizer, max_len)
    test = story_examples(data_dir, "test", num_test, seed, tokenizer, max_len)
    if len(train) < 2 or len(test) < 1:
        raise UserError(f"{data_dir} has too few stories for probes ({len(train)} train, {len(test)} test)")
    tx, ty = pooled_states(model, [s for s, _ in train], pool), torch.tensor([l for _, l in train])
    vx, vy = pooled_states(model, [s for s, _ in test], pool), torch.tensor([l for _, l in test])
    w = train_probes(tx, ty, iters, lr, batch_size, seed)
    rate = vy.float().mean(dim=0)
    return {"acc": probe_accuracy(w, vx, vy), "baseline": torch.maximum(rate, 1 - rate),
            "n_train": len(train), "n_test": len(test)}


def layers_json(acc):
    return {"layers": [{"layer": i, "feature": LABEL_NAMES[j], "acc": round(float(acc[i, j]), 6)}
                       for i in range(acc.shape[0]) for j in range(acc.shape[1])]}
