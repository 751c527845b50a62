"""Per-layer linear probes: can the six story features be read off a frozen model's hidden states?
(../shared/spec/tinystories-data.md §13)

    python evaluation/probe.py --checkpoint=out/ckpt.pt --dataset=pretrain-all

Inputs are story-only token sequences (BOS + the story after `Story:`; the instruction header is
removed) of examples of the pretokenized --dataset; train-split examples train the probes, test-split
(shard 0) examples measure them. The target is the 6-way multi-hot vector of the features the
example's `Features:` line names, so use a dataset whose headers are honest (pretrain-all, not an
adversarial one). Each transformer block gets its own bias-free linear head dim -> 6 reading the
mean of that block's output at the last --pool real positions; the loss is the sum over heads of
BCE-with-logits, Adam at a constant learning rate, on pooled states computed once (the model is
frozen). Reported: held-out accuracy (logit > 0) per layer and feature, with the majority-class
baseline in the summary.
Last stdout line: {"layers": [{"layer", "feature", "acc"}, ...]}.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dataset_spec import FEATURES, STORY_FEATURES, feature_labels, header_end, header_fields  # noqa: E402
from errors import UserError, cli_main  # noqa: E402
from evaluation.common import (model_parser, cache_dir_of, check_positive, emit, layout_vocab,  # noqa: E402
                               load_for_args, progress, right_pad)

# probe label j is STORY_FEATURES[j]; outputs name it as the raw feature (Twist, BadEnding, ...)
LABEL_NAMES = [next(f for f in FEATURES if f.lower() == s) for s in STORY_FEATURES]


def story_examples(data_dir, split, n, seed, tokenizer, max_len):
    """Up to n (story-only ids: BOS + story tokens, at most max_len; 6 labels) from the examples of
    `split`, visiting shards in order and each shard's examples in a seeded random order."""
    from pretok_data import shard_paths
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


def main(argv=None):
    from pretok_data import check_dataset, dataset_dir
    p = model_parser(__doc__)
    p.add_argument("--dataset", required=True, help="pretokenized dataset with honest Features lines (e.g. pretrain-all)")
    p.add_argument("--num_train", type=int, default=2000, help="train-split stories for fitting the probes")
    p.add_argument("--num_test", type=int, default=500, help="test-split stories for measuring them")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--probe_batch_size", type=int, default=128)
    p.add_argument("--pool", type=int, default=10, help="mean over this many last real positions")
    a = p.parse_args(argv)
    check_positive(num_train=a.num_train, num_test=a.num_test, iters=a.iters, lr=a.lr,
                   probe_batch_size=a.probe_batch_size, pool=a.pool, batch_size=a.batch_size)
    model, ckpt, tok = load_for_args(a)
    cache, vocab = cache_dir_of(ckpt, a.data_cache_dir), layout_vocab(ckpt, tok)
    check_dataset(cache, vocab, a.dataset, tok.model_path)
    torch.manual_seed(a.seed)
    r = run_probes(model, tok, dataset_dir(cache, vocab, a.dataset), a.num_train, a.num_test, a.iters, a.lr,
                   a.probe_batch_size, a.pool, a.seed)
    print(f"probes on {a.dataset}: {r['n_train']} train / {r['n_test']} held-out stories, "
          f"{a.iters} iterations, mean of the last {a.pool} positions")
    print("held-out accuracy   " + " ".join(f"{n[:13]:>13}" for n in LABEL_NAMES))
    for i in range(r["acc"].shape[0]):
        print(f"layer {i:<13} " + " ".join(f"{float(v):13.3f}" for v in r["acc"][i]))
    print("majority baseline   " + " ".join(f"{float(v):13.3f}" for v in r["baseline"]))
    emit(layers_json(r["acc"]), a.out)


if __name__ == "__main__":
    cli_main(main)
