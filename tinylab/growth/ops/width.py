"""Width doubling (docs/growth.md §3, §5, §6.2): `--doubling weights`.

dim, heads, kv heads and FFN hidden size doubled, head size kept (RoPE and the score scale
unchanged); every matrix in the block form [[A, B], [C, D]] with A + B = C + D = W; embedding
columns and RMSNorm gains duplicated; the final gain halved for a tied head, the untied head split
[A | B] with A + B = W. AdamW moments: each copy receives c times the small model's gradient, so
m -> c m and v -> c^2 v, steps kept. Symmetry breaking (§5) splits the duplicated input halves
unevenly, still exactly function-preserving. Mode exact (§6.2): per-parameter LR, eps, weight
decay and clip-norm multipliers that make the grown model's updates equal the small model's.
"""
import math

import torch

from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.growth.ops.base import GrowthOperator, explicit_hidden, register

C_WIDTH = 1.776  # staged-training's S_pre / S_target after width growth (§7)

# The moments of a doubled matrix: ours scale every block (each copy's gradient is c times the small
# one's, off-diagonal blocks included); staged-training's double_matrix_weight(is_grad=True) writes
# m/2, v/4 on the diagonal blocks only (the off-diagonal blocks' true gradient is not zero).
WIDTH_MOMENTS = ("scaled", "original")
GROW_WIDTH_MOMENTS = Key("grow_width_moments", "scaled", "width growth's AdamW moments of the doubled matrices: "
                         "scaled (every block c m, c^2 v) | original (staged-training's: m/2, v/4 on the diagonal "
                         "blocks, 0 off them; target mode only)", choices=WIDTH_MOMENTS)
WIDTH_MOMENTS_KEY = GROW_WIDTH_MOMENTS.replace(name="width_moments")
for _key in (GROW_WIDTH_MOMENTS, WIDTH_MOMENTS_KEY):
    declare_difference(_key, original="original", family="staged",
                       source="allenai/staged-training gpt_pretrain.py:119-128",
                       behaviour="the doubled matrices' Adam moments are m/2, v/4 on the diagonal blocks and 0 on the "
                       "off-diagonal blocks (the final LayerNorm's are copied unscaled, as ours)")

MATRICES = ("attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "attention.wo.weight",
            "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight")

# How width doubling treats each kind of parameter (§3, §6.2):
#   tiling of the tensor and of its moments, gradient factor c each copy receives (in units of the
#   small model's gradient), and the LR multiplier of exact mode (1/2 where the function depends on
#   the sum of two copies).
WIDTH_KINDS = {
    "matrix": ((2, 2), 0.5, 0.5),     # wq wk wv wo w1 w2 w3: [[A, B], [C, D]], A + B = C + D = W
    "fan_in": ((1, 2), 1.0, 0.5),     # untied head: [A | B], A + B = W (only the input doubles)
    "columns": ((1, 2), 0.5, 1.0),    # embedding: [E | E]
    "gain": ((2,), 0.5, 1.0),         # RMSNorm gains: [g; g]
    "half_gain": ((2,), 1.0, 0.5),    # final gain before a tied head: [g; g] / 2
}


def widened_args(args):
    return explicit_hidden(args, dim=2 * args.dim, n_heads=2 * args.n_heads, n_kv_heads=2 * args.kv_heads(),
                           hidden_dim=2 * args.ffn_hidden_dim())


def width_kind(name: str, tied: bool) -> str:
    if name == "tok_embeddings.weight":
        return "columns"
    if name == "output.weight":
        return "fan_in"
    if name == "norm.weight":
        return "half_gain" if tied else "gain"
    if name.endswith(("attention_norm.weight", "ffn_norm.weight")):
        return "gain"
    if name.endswith(MATRICES):
        return "matrix"
    raise UserError(f"cannot grow parameter '{name}' in width: not a parameter of this model family")


def input_halves(W, how, opts, gen):
    """(P, Q) with P + Q = W: how the two duplicated input halves share W (§5). Q = W - P rounds
    once, so P + Q equals W to the last bit or two in any precision."""
    if how == "random":
        # R from a CPU generator: the same R on every device and rank (in-place ops: this is
        # memory-bound on large models)
        rms = (torch.linalg.vector_norm(W) / W.numel() ** 0.5).item()
        dtype = W.dtype if W.dtype in (torch.float32, torch.float64) else torch.float32
        R = torch.randn(W.shape, generator=gen, dtype=dtype).mul_(opts.sb_scale * rms)
        P = R.to(device=W.device, dtype=W.dtype).add_(W, alpha=0.5)
    elif how == "split":
        P = opts.sb_alpha * W
    else:  # off (and blockdiag where only the input doubles): uniform halves, exact in binary
        P = W / 2
    return P, W - P


def widen(W, kind, opts, gen):
    """One parameter doubled in width (§3)."""
    if kind in ("columns", "gain"):
        return W.repeat(*WIDTH_KINDS[kind][0])
    if kind == "half_gain":
        return W.repeat(2) / 2
    if kind == "matrix" and opts.split == "blockdiag":
        return torch.block_diag(W, W)  # A = D = W, B = C = 0 (staged-training's form, symmetric)
    P, Q = input_halves(W, opts.split, opts, gen)
    rows, cols = W.shape
    out = W.new_empty((2 * rows if kind == "matrix" else rows, 2 * cols))
    out[:rows, :cols], out[:rows, cols:] = P, Q  # input half 1 read with P, half 2 with Q
    if kind == "matrix":
        out[rows:] = out[:rows]  # output halves: original | copies
    return out


def widen_moments(state, kind, how="scaled"):
    """AdamW state of one parameter for its doubled tensor: each copy receives c times the small
    model's gradient, so m -> c*m, v -> c^2*v in every block (zero-valued blocks too); steps kept.
    how="original": a matrix's off-diagonal blocks get 0 (staged-training's mapping)."""
    tiling, c, _ = WIDTH_KINDS[kind]
    out = {}
    for key, t in state.items():
        if key == "step":
            out[key] = t.clone()
            continue
        small = t * (c if key == "exp_avg" else c * c)  # scaled small, then tiled: the large one is written once
        out[key] = torch.block_diag(small, small) if how == "original" and kind == "matrix" else small.repeat(*tiling)
    return out


def grow_width(weights, args, opt_state, opts, gen):
    """(weights, opt_state, kinds) of the model doubled in width; kinds: {name: WIDTH_KINDS key}."""
    new_weights, new_state, kinds = {}, {}, {}
    for name, W in weights.items():
        if name == "output.weight" and args.tie_embeddings:
            continue  # the same tensor as the embedding
        kinds[name] = width_kind(name, args.tie_embeddings)
        new_weights[name] = widen(W, kinds[name], opts, gen)
        if name in opt_state:
            new_state[name] = widen_moments(opt_state[name], kinds[name], opts.width_moments)
    if args.tie_embeddings:
        new_weights["output.weight"] = new_weights["tok_embeddings.weight"]
    return new_weights, new_state, kinds


def exact_overrides(kinds, old, adam_eps):
    """Per-parameter settings under which the grown model's AdamW updates equal the small model's
    (§6.2): eps x c (v was scaled by c^2), LR x 1/2 where two copies add up, weight decay x 2 there
    (lr * decay fixed), and the clip norm measured in small-model units (each copy's squared
    gradient norm weighted by 1 / (copies * c^2)). Composes with an earlier exact growth."""
    out = {}
    for name, kind in kinds.items():
        tiling, c, lr_mult = WIDTH_KINDS[kind]
        ov = (old or {}).get(name, {})
        copies = math.prod(tiling)
        eps = ov.get("eps") if ov.get("eps") is not None else adam_eps
        out[name] = {"lr_scale": ov.get("lr_scale", 1.0) * lr_mult, "eps": eps * c,
                     "weight_decay_scale": ov.get("weight_decay_scale", 1.0) / lr_mult,
                     "clip_weight": ov.get("clip_weight", 1.0) / (copies * c * c)}
    return out


@torch.no_grad()
def half_asymmetry(model, tokens):
    """max |x1 - x2| between the two halves of the final hidden state (§5's diagnostic): 0 right
    after width growth; stays 0 during training without symmetry breaking."""
    h = model._trunk(tokens)
    d = h.shape[-1] // 2
    return (h[..., :d] - h[..., d:]).abs().max().item()


WIDTH = register(GrowthOperator(
    name="weights", setting="width", display="width x2", c=C_WIDTH, slope_threshold=-0.0475,
    grown_args=widened_args, grow=grow_width, output_suffix=".doubled_weights", exact=exact_overrides,
    plan_default=True))
