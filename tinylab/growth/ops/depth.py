"""Depth doubling (docs/growth.md §4): `--doubling layers`.

Each layer is followed (interleave) or the stack is followed (append) by a copy whose output
projections (attention wo, SwiGLU w2) are zero, so both residual branches add nothing: the
function is unchanged, and from the second step everything learns. The copies start with fresh
AdamW moments; the old layers keep theirs under their new names. The original's
--doubling_layers *_copy makes plain copies of weights and moments instead (not
function-preserving). Depth growth has no exact mode: the new layers learn.
"""
import torch

from tinylab.growth.ops.base import GrowthOperator, explicit_hidden, register

C_DEPTH = 1.412  # staged-training's S_pre / S_target after depth growth (§7)
PLACEMENTS = ("interleave", "append")
ZEROED_IN_NEW_LAYERS = ("attention.wo.weight", "feed_forward.w2.weight")  # the residual-branch outputs


def deepened_args(args):
    return explicit_hidden(args, n_layers=2 * args.n_layers)


def layer_positions(n_layers, placement):
    """(position of old layer i, position of its new copy) for each i."""
    if placement == "interleave":
        return [(2 * i, 2 * i + 1) for i in range(n_layers)]
    return [(i, n_layers + i) for i in range(n_layers)]


def grow_depth(weights, args, opt_state, opts, gen=None):
    """(weights, opt_state, None) of the model doubled in depth. The copies' output projections
    are zero, so both residual branches add nothing; at the first step only those get gradient,
    from the second everything learns. Copies start with no optimizer state (fresh moments, their
    own step 0); old layers keep theirs under their new names. With opts.copy_layers (the
    original's alternate_copy / append_copy) the copies are plain copies of the weights and
    moments: the function changes."""
    positions = layer_positions(args.n_layers, opts.placement)
    new_weights, new_state = {}, {}
    for name, W in weights.items():
        if not name.startswith("layers."):
            new_weights[name] = W
            if name in opt_state:
                new_state[name] = opt_state[name]
            continue
        _, i, rest = name.split(".", 2)
        old_pos, copy_pos = positions[int(i)]
        new_weights[f"layers.{old_pos}.{rest}"] = W
        zeroed = rest in ZEROED_IN_NEW_LAYERS and not opts.copy_layers
        new_weights[f"layers.{copy_pos}.{rest}"] = torch.zeros_like(W) if zeroed else W.clone()
        if name in opt_state:
            new_state[f"layers.{old_pos}.{rest}"] = opt_state[name]
            if opts.copy_layers:  # the original's plain copies carry a copy of the moments too
                new_state[f"layers.{copy_pos}.{rest}"] = {k: v.clone() for k, v in opt_state[name].items()}
    return new_weights, new_state, None


DEPTH = register(GrowthOperator(
    name="layers", setting="depth", display="depth x2", c=C_DEPTH, slope_threshold=-0.0575,
    grown_args=deepened_args, grow=grow_depth, output_suffix=".doubled_layer", plan_default=True,
    why_not_exact="new layers learn, so depth growth cannot reproduce the small model's updates",
    threshold_help="grow depth when the slope rises above this",
    layer_variants={"alternate_id": ("interleave", False), "append_id": ("append", False),
                    "alternate_copy": ("interleave", True), "append_copy": ("append", True)}))
