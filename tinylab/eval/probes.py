"""Per-layer readouts of a frozen model: feature probes and lenses. One implementation serves the
offline tool (evaluation/probe.py) and the training loop (train.py probes=True / lenses=True).

Probes: can the six story features be read off a block's output? A bias-free linear head
dim -> 6 reads the mean of the block's output over the last POOL (10) positions of the story
only (BOS + the story; the instruction header removed), trained with BCE-with-logits against the
multi-hot labels of the example's `Features:` line; the loss is the sum over heads.
  - evaluation/probe.py: every block; pooled states computed once, then Adam (run_probes).
  - train.py probes=True, the original's in-loop probes: heads on blocks 0..n_layers-2 (the
    original's n_layers - 1 probes), trained on the training dataset's stories while the model is
    frozen; metrics loss/<key>/probe_<i>, acc/<key>/probe_<i>, acc/<key>/feat_<j>/probe_<i>
    (<key> = train, test, each eval dataset; feat_j = STORY_FEATURES[j]).
Lenses (train.py lenses=True): a bias-free linear map dim -> vocab per block 0..n_layers-2, read
on that block's output (before the final norm) at every position, trained with the next-token
loss on the frozen model's training batches (init_lens_with_unembed: starting as copies of the
output head); loss/<key>/probe_<i> is lens i's loss, probe_<n_layers-1> the model's own.
In both, loss/<key> (and loss/train) is the sum over heads: the original's objective.

The heads are not part of model.py's Transformer: the Trainer trains them instead of the model
(`Trainer(heads=...)`) and saves them in the checkpoint under their own entry ("probes" or
"lenses", beside "model"), so every tool loads such a checkpoint as a plain model.
train.py's keys for them (HEADS_KEYS) and their rules (check_heads) are declared here, read once
into HeadsOptions.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tinylab.core.checkpoint import clean_state_dict
from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.core.progress import progress
from tinylab.data.pretokenized import shard_paths
from tinylab.data.records import FEATURES, STORY_FEATURES
from tinylab.data.template import feature_labels, header_end, header_fields
from tinylab.eval.common import right_pad
from tinylab.eval.lm_eval import LMEvaluator, loss_batch_size
from tinylab.nn.fused_head import linear_cross_entropy

# probe label j is STORY_FEATURES[j]; outputs name it as the raw feature (Twist, BadEnding, ...)
LABEL_NAMES = [next(f for f in FEATURES if f.lower() == s) for s in STORY_FEATURES]
POOL = 10  # the original pools h[:, -10:]: the story's last 10 positions
HEAD_KINDS = ("probes", "lenses")  # the config keys, and the heads' checkpoint entries


# ---------------------------------------------------------------------- train.py's keys (docs/evaluation.md, "Probes and lenses in training")

HEADS_KEYS = [
    Key("probes", False, "train per-layer linear feature probes on blocks 0..n_layers-2 of the frozen model (story-only "
        "inputs, BCE on the Features labels): loss/<key>/probe_<i>, acc/<key>/probe_<i>, acc/<key>/feat_<j>/probe_<i>"),
    Key("probes_classes", len(STORY_FEATURES), "outputs per probe: the first N features in STORY_FEATURES order "
        "(twist, foreshadowing, dialogue, badending, moralvalue, conflict)", range=f"[1, {len(STORY_FEATURES)}]"),
    Key("lenses", False, "train a linear lens dim -> vocab per block 0..n_layers-2 of the frozen model (next-token loss "
        "at every position): loss/<key>/probe_<i>, i = n_layers-1 the model's own head"),
    Key("init_lens_with_unembed", False, "lenses start as copies of the output head (else N(0, 0.02))"),
]


@dataclass(frozen=True)
class HeadsOptions:
    """HEADS_KEYS' values: which heads a run trains on its frozen model (check_heads allows one kind)."""
    probes: bool = False
    lenses: bool = False
    probes_classes: int = len(STORY_FEATURES)  # outputs per probe: the first N of STORY_FEATURES
    init_lens_with_unembed: bool = False  # lenses start as copies of the output head

    @classmethod
    def from_config(cls, cfg) -> "HeadsOptions":
        return cls(cfg["probes"], cfg["lenses"], cfg["probes_classes"], cfg["init_lens_with_unembed"])

    @property
    def kind(self) -> Optional[str]:
        """"probes", "lenses" (also the heads' checkpoint entry) or None."""
        return next((k for k in HEAD_KINDS if getattr(self, k)), None)


def check_heads(cfg):
    if cfg["probes"] and cfg["lenses"]:
        raise UserError("probes=True and lenses=True: one kind of heads per run (the original logs both as "
                        "loss/<key>/probe_<i>, and trains them on different batches)")
    if cfg["init_lens_with_unembed"] and not cfg["lenses"]:
        raise UserError("init_lens_with_unembed=True needs lenses=True")
    kind = "probes" if cfg["probes"] else "lenses" if cfg["lenses"] else None
    if kind and cfg["grow_schedule"]:
        raise UserError(f"{kind}=True trains heads on a frozen model: it cannot grow (grow_schedule)")
    if kind == "probes" and (cfg["warmup_bsz"] or cfg["warmup_seq"]):
        raise UserError("probes=True reads whole stories: batch-size / sequence-length warmups do not apply")
    if kind and cfg["document_mask"]:
        raise UserError(f"{kind}=True trains heads on the frozen model's windows as they are: document_mask does not apply")
    if kind == "probes" and cfg["feature_eval"]:
        raise UserError("feature_eval judges generations, which a probes=True run does not make")


# ---------------------------------------------------------------------- inputs and labels

def story_and_labels(ids, tokenizer):
    """(BOS + story ids, labels) of the example that starts at ids[0] (a BOS; it ends at the next
    BOS): labels are the 6 multi-hot values of its `Features:` line, None when its header has no
    such line. None when the ids hold no whole header or no story token."""
    ids = [int(t) for t in ids]
    bos = tokenizer.bos_id
    if bos in ids[1:]:
        ids = ids[:ids.index(bos, 1)]
    try:
        h = header_end(ids, tokenizer)
    except ValueError:  # no 'Story:' line: not an example of the template, or cut by the window
        return None
    if h >= len(ids):
        return None
    features = header_fields(tokenizer.decode(ids[1:h])).get("Features")
    return [bos] + ids[h:], None if features is None else feature_labels(features)


def story_examples(data_dir, split, n, seed, tokenizer, max_len, header=False):
    """Up to n (story-only ids: BOS + story tokens, at most max_len; 6 labels) from the examples of
    `split`, visiting shards in order and each shard's examples in a seeded random order.
    header=True: the ids are the whole example (BOS, instruction header, story), as trained on.
    An example without a `Features:` line gets all-zero labels (check_feature_labels refuses such
    datasets for probes)."""
    bos = tokenizer.bos_id
    out = []
    for s, path in enumerate(shard_paths(data_dir, split)):
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        starts = np.flatnonzero(tokens == bos)
        ends = np.append(starts[1:], len(tokens))
        for i in np.random.default_rng([seed, s]).permutation(len(starts)):
            ids = tokens[starts[i]:ends[i]].tolist()
            example = story_and_labels(ids, tokenizer)
            if example is None:
                continue
            story, labels = example
            out.append(((ids if header else story)[:max_len], labels or [0] * len(STORY_FEATURES)))
            if len(out) >= n:
                return out
    return out


def check_feature_labels(data_dir, split, tokenizer, what, split_shards_pretrain=False, pretraining=True, n=64):
    """A UserError unless the first n examples of `split` name their features (`Features:` header
    lines): probes are trained and measured on those labels."""
    path = shard_paths(data_dir, split, split_shards_pretrain, pretraining)[0]
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    starts = np.flatnonzero(tokens == tokenizer.bos_id)[:n + 1]
    ends = np.append(starts[1:], len(tokens))
    examples = [story_and_labels(tokens[a:b].tolist(), tokenizer) for a, b in zip(starts[:n], ends[:n])]
    if not any(e is not None and e[1] is not None for e in examples):
        raise UserError(f"{what}: dataset {data_dir} has no feature labels (no 'Features:' header line in its first "
                        f"{len(examples)} examples; was it built with --instruction_subset without Features?); "
                        f"probes need them")


class ProbeBatches:
    """Probe batches from BOS-aligned windows (a pretokenized.BatchLoader with split_on_bos): each
    window's story only (BOS + the story, cut at the next example's BOS), right-padded, as dicts
    {tokens (B, T), lengths (B,), labels (B, n_classes) float}. Windows without a whole header
    or without a `Features:` line are left out (the original dropped such batches). The position
    (state_dict) is the window loader's, so a run resumes exactly."""

    def __init__(self, windows, tokenizer, n_classes=len(STORY_FEATURES), max_tries=100):
        self.windows, self.tokenizer, self.n_classes, self.max_tries = windows, tokenizer, n_classes, max_tries

    def __iter__(self):
        return self

    def __next__(self):
        for _ in range(self.max_tries):
            x, _ = next(self.windows)
            rows = [story_and_labels(r, self.tokenizer) for r in x.tolist()]
            rows = [r for r in rows if r is not None and r[1] is not None]
            if rows:
                device = x.device
                return {"tokens": right_pad([s for s, _ in rows]).to(device),
                        "lengths": torch.tensor([len(s) for s, _ in rows], device=device),
                        "labels": torch.tensor([l[:self.n_classes] for _, l in rows], dtype=torch.float32, device=device)}
        raise UserError(f"{self.max_tries} batches of {x.shape[1]}-token windows held no labelled story after a "
                        f"whole instruction header: raise max_seq_len")

    def state_dict(self):
        return self.windows.state_dict()

    def load_state_dict(self, state):
        self.windows.load_state_dict(state)


# ---------------------------------------------------------------------- pooled block outputs

def pool_last(h, lengths, pool=POOL):
    """(B, dim): the mean of h (B, T, dim) over each row's last `pool` real positions (row b is
    real up to lengths[b]; a shorter row: all of it); half precision is summed in float32."""
    dt = torch.float32 if h.dtype in (torch.float16, torch.bfloat16) else h.dtype
    pos = torch.arange(h.shape[1], device=h.device)[None, :]
    lengths = lengths.to(h.device)[:, None]
    w = ((pos < lengths) & (pos >= lengths - pool)).to(dt)
    return torch.einsum("bt,btd->bd", w / w.sum(dim=1, keepdim=True), h.to(dt))


class _Pooled(list):
    """Transformer._trunk's `collect`: keeps the pooled output of the first n blocks instead of
    their (B, T, dim) states."""

    def __init__(self, lengths, n, pool):
        super().__init__()
        self.lengths, self.n, self.pool = lengths, n, pool

    def append(self, h):
        if len(self) < self.n:
            super().append(pool_last(h, self.lengths, self.pool))


def block_states(model, tokens, lengths, n_blocks, pool=POOL):
    """(B, n_blocks, dim): blocks 0..n_blocks-1's outputs pooled over each right-padded
    row's last `pool` real positions (causal attention: padding never changes them)."""
    pooled = _Pooled(lengths, n_blocks, pool)
    model._trunk(tokens, collect=pooled)
    return torch.stack(pooled, dim=1)


@torch.no_grad()
def pooled_states(model, sequences, pool=POOL, batch_size=16):
    """(N, n_layers, dim) float32 on the CPU: every block's pooled output for each sequence."""
    device = next(model.parameters()).device
    feats = []
    bar = progress(total=len(sequences), desc="hidden states", unit="story")
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start:start + batch_size]
        lengths = torch.tensor([len(s) for s in chunk])
        feats.append(block_states(model, right_pad(chunk).to(device), lengths, model.params.n_layers, pool).float().cpu())
        bar.update(len(chunk))
    bar.close()
    return torch.cat(feats)


# ---------------------------------------------------------------------- the heads

class LayerHeads(nn.ModuleList):
    """One bias-free nn.Linear(dim, out_dim) per block, initialised N(0, 0.02) (as the original's
    model initialised its probes and lenses). attach(model) freezes the model and keeps it outside
    the module (not a submodule), so the optimizer, DDP and the checkpoint entry `name` see only
    the heads; forward(**batch) then sets last_losses (one per head) and last_loss, their sum."""
    name = None

    def __init__(self, n_heads, dim, out_dim):
        super().__init__(nn.Linear(dim, out_dim, bias=False) for _ in range(n_heads))
        for head in self:
            nn.init.normal_(head.weight, mean=0.0, std=0.02)
        self.base, self.last_loss, self.last_losses = None, None, None

    def attach(self, model):
        model.requires_grad_(False)
        object.__setattr__(self, "base", model)  # a plain attribute: not registered as a submodule
        return self

    def load(self, state, source):
        own = self.state_dict()
        shapes = {k: tuple(v.shape) for k, v in state.items()}
        if shapes != {k: tuple(v.shape) for k, v in own.items()}:
            raise UserError(f"{source}: its {self.name} ({len(state)} heads, {sorted(set(shapes.values()))}) do not fit "
                            f"this model ({len(own)} heads of {tuple(own['0.weight'].shape)})")
        self.load_state_dict(state)


class ProbeHeads(LayerHeads):
    """Feature probes: (B, P, dim) pooled states -> (B, P, n_classes) logits, head i on block i."""
    name = "probes"

    def __init__(self, n_probes, dim, n_classes=len(STORY_FEATURES), pool=POOL):
        super().__init__(n_probes, dim, n_classes)
        self.n_classes, self.pool = n_classes, pool

    def logits(self, pooled):
        return torch.stack([head(pooled[:, i]) for i, head in enumerate(self)], dim=1)

    def forward(self, tokens, lengths, labels, return_logits=True):
        logits = self.logits(block_states(self.base, tokens, lengths, len(self), self.pool))
        self.last_losses = probe_losses(logits, labels)
        self.last_loss = self.last_losses.sum()
        return logits if return_logits else None

    def batches(self, windows, tokenizer):
        return ProbeBatches(windows, tokenizer, self.n_classes)

    def eval_metrics(self, batch, key):
        acc = probe_accuracy(self(**batch), batch["labels"])
        out = {f"loss/{key}": self.last_loss}
        for i in range(len(self)):
            out[f"loss/{key}/probe_{i}"] = self.last_losses[i]
            out[f"acc/{key}/probe_{i}"] = acc[i].mean()
            for j in range(self.n_classes):
                out[f"acc/{key}/feat_{j}/probe_{i}"] = acc[i, j]
        return out


def probe_losses(logits, labels):
    """(P,): each head's BCE-with-logits, the mean over examples and labels (the original's)."""
    target = labels[:, None, :].expand_as(logits).to(torch.float32)
    return F.binary_cross_entropy_with_logits(logits.float(), target, reduction="none").mean(dim=(0, 2))


def probe_accuracy(logits, labels):
    """(P, n_classes): accuracy of each head (logit > 0) on each label."""
    return ((logits > 0) == labels[:, None, :].bool()).float().mean(dim=0)


def _next_token_loss(h, weight, targets):
    # the model's own loss: fused head + cross-entropy (no (N, vocab) logits)
    return linear_cross_entropy(h.reshape(-1, h.shape[-1]), weight, targets.reshape(-1))


class LensHeads(LayerHeads):
    """Lenses: block i's output (B, T, dim), before the final norm -> (B, T, vocab) logits."""
    name = "lenses"

    def init_from_unembedding(self, model):
        for lens in self:
            lens.weight.data.copy_(model.output.weight.data)  # a copy: the model's head stays frozen

    def forward(self, tokens, targets, return_logits=False):
        hs = []
        self.base._trunk(tokens, collect=hs)
        losses = [_next_token_loss(h, lens.weight, targets) for h, lens in zip(hs, self)]
        losses.append(_next_token_loss(self.base.norm(hs[-1]), self.base.output.weight, targets))
        dt = torch.float64 if hs[0].dtype == torch.float64 else torch.float32
        self.last_losses = torch.stack([loss.to(dt) for loss in losses])
        self.last_loss = self.last_losses.sum()
        return None

    def batches(self, windows, tokenizer):
        return windows  # the language-modelling windows themselves

    def eval_metrics(self, batch, key):
        self(*batch)
        out = {f"loss/{key}": self.last_loss}
        out.update({f"loss/{key}/probe_{i}": v for i, v in enumerate(self.last_losses)})
        return out


def saved_heads(ckpt, kind):
    """The checkpoint's state of `kind` heads: this project's entry ckpt[kind], else the
    original's model state-dict entries `<kind>.<i>.weight` (its model.py held them); or None."""
    if ckpt is None:
        return None
    if ckpt.get(kind) is not None:
        return ckpt[kind]
    prefix = kind + "."
    state = {k[len(prefix):]: v for k, v in clean_state_dict(ckpt["model"]).items() if k.startswith(prefix)}
    return state or None


def heads_for_config(cfg, model, ckpt=None):
    """probes=True / lenses=True: the heads a Trainer trains over `model` (build_heads); else None."""
    from tinylab.core.run_keys import StartOptions
    return build_heads(HeadsOptions.from_config(cfg), StartOptions.from_config(cfg).resumes, model, ckpt)


def build_heads(options: HeadsOptions, resumes: bool, model, ckpt=None):
    """The heads a Trainer trains over `model` (frozen by attach), on its device, restored from the
    checkpoint when it has them (saved_heads); None without probes / lenses. A run resumed from
    this project's checkpoint (`resumes`: resume_train) must keep the kind of heads it trained."""
    kind = options.kind
    saved = [k for k in HEAD_KINDS if (ckpt or {}).get(k) is not None]
    if resumes and saved and kind is None:
        raise UserError(f"the checkpoint's run trains {saved[0]} on a frozen model: resume it with {saved[0]}=True")
    if resumes and kind is not None and saved_heads(ckpt, kind) is None:
        raise UserError(f"{kind}=True with init_from=resume_train, but the checkpoint has no {kind}: start them "
                        f"with init_from=resume_model (its weights, fresh {kind})")
    if kind is None:
        return None
    p = model.params
    if p.n_layers < 2:
        raise UserError(f"{kind}=True needs n_layers >= 2 (heads on blocks 0..n_layers-2, as the original)")
    if kind == "probes":
        heads = ProbeHeads(p.n_layers - 1, p.dim, options.probes_classes)
    else:
        heads = LensHeads(p.n_layers - 1, p.dim, p.vocab_size)
    state = saved_heads(ckpt, kind)
    if state is not None:
        heads.load(state, "the checkpoint")
    elif kind == "lenses" and options.init_lens_with_unembed:
        heads.init_from_unembedding(model)
    w = model.output.weight
    return heads.to(device=w.device, dtype=w.dtype)


class HeadsEvaluator(LMEvaluator):
    """train.py's evaluation of a probes / lenses run: each loss set's (train, test, every eval
    dataset) head metrics, the mean over eval_iters fixed batches, named as the original's; a lens
    run also makes the usual generations (of the frozen model), a probe run none (as the original)."""

    def __init__(self, cfg, run, tokenizer, generation, heads):
        super().__init__(cfg, run, tokenizer, generation)
        self.heads = heads

    def loss_metrics(self, model):
        cfg, probes = self.cfg, isinstance(self.heads, ProbeHeads)
        metrics = {}
        for name, (data_dir, split) in self.loss_sets.items():
            windows = self.loader(data_dir, split, loss_batch_size(cfg), split_on_bos=probes)
            batches = self.heads.batches(windows, self.tokenizer)
            sums = {}
            for _ in range(cfg["eval_iters"]):
                for k, v in self.heads.eval_metrics(next(batches), name).items():
                    sums[k] = sums.get(k, 0.0) + v.detach().float()
            metrics.update({k: (v / cfg["eval_iters"]).item() for k, v in sums.items()})
        return metrics

    def __call__(self, model, iter_num, generations):
        return super().__call__(model, iter_num, generations and not isinstance(self.heads, ProbeHeads))


# ---------------------------------------------------------------------- offline (evaluation/probe.py)

def train_probes(train_x, train_y, iters=2000, lr=1e-3, batch_size=128, seed=0):
    """ProbeHeads over pooled states train_x (N, L, dim) with labels train_y (N, 6): one head per
    layer, trained jointly with Adam on the summed per-head BCE (each head gets its own gradient)."""
    n, n_layers, dim = train_x.shape
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        probes = ProbeHeads(n_layers, dim, train_y.shape[1])
    opt = torch.optim.Adam(probes.parameters(), lr=lr)
    y = train_y.float()
    for _ in progress(range(iters), desc="probes", unit="it"):
        idx = torch.randint(0, n, (min(batch_size, n),), generator=gen)
        probe_losses(probes.logits(train_x[idx]), y[idx]).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return probes.requires_grad_(False)


def run_probes(model, tokenizer, data_dir, num_train=2000, num_test=500, iters=2000, lr=1e-3,
               batch_size=128, pool=POOL, seed=0):
    """Extract, train and measure; returns dict(acc (L, 6), baseline (6,), n_train, n_test)."""
    max_len = model.params.max_seq_len
    train = story_examples(data_dir, "train", num_train, seed, tokenizer, max_len)
    test = story_examples(data_dir, "test", num_test, seed, tokenizer, max_len)
    if len(train) < 2 or len(test) < 1:
        raise UserError(f"{data_dir} has too few stories for probes ({len(train)} train, {len(test)} test)")
    tx, ty = pooled_states(model, [s for s, _ in train], pool), torch.tensor([l for _, l in train])
    vx, vy = pooled_states(model, [s for s, _ in test], pool), torch.tensor([l for _, l in test])
    probes = train_probes(tx, ty, iters, lr, batch_size, seed)
    rate = vy.float().mean(dim=0)
    return {"acc": probe_accuracy(probes.logits(vx), vy), "baseline": torch.maximum(rate, 1 - rate),
            "n_train": len(train), "n_test": len(test)}


def layers_json(acc):
    return {"layers": [{"layer": i, "feature": LABEL_NAMES[j], "acc": round(float(acc[i, j]), 6)}
                       for i in range(acc.shape[0]) for j in range(acc.shape[1])]}
