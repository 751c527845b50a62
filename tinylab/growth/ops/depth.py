"""Depth doubling (docs/growth.md §4): `--doubling layers`.

Each layer is followed (interleave) or the stack is followed (append) by a copy whose output
projections (attention wo, SwiGLU w2) are zero, so both residual branches add nothing: the
function is unchanged, and from the second step everything learns. The copies start with fresh
AdamW moments; the old layers keep theirs under their new names. The original's
--doubling_layers *_copy makes plain copies of weights and moments instead (not
function-preserving). depth_id=original does what staged-training's *_id code really does
(plain copies, identity patterns in the original layers' moments). Depth growth has no exact mode:
the new layers learn.
"""
import torch

from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.growth.ops.base import GrowthOperator, explicit_hidden, register

C_DEPTH = 1.412  # staged-training's S_pre / S_target after depth growth (§7)
PLACEMENTS = ("interleave", "append")
ZEROED_IN_NEW_LAYERS = ("attention.wo.weight", "feed_forward.w2.weight")  # the residual-branch outputs

# staged-training's alternate_id / append_id (gpt_pretrain.py:1405-1443) flag both weight targets
# False, so the weights are plain copies; its identity flag reaches only the Adam moments of the
# *original* positions: both moments of a matrix become eye (fill_diagonal_), of a vector zeros
DEPTH_ID = ("zero_output", "original")
GROW_DEPTH_ID = Key("grow_depth_id", "zero_output", "layers, identity variants (alternate_id / append_id, the "
                    "default): zero_output (the copies' wo and w2 are zero: function-preserving; fresh moments) | "
                    "original (staged-training's code: plain weight copies, NOT loss-preserving; the copies get the "
                    "moments, the original layers identity-patterned moments)", choices=DEPTH_ID)
DEPTH_ID_KEY = GROW_DEPTH_ID.replace(name="depth_id")
for _key in (GROW_DEPTH_ID, DEPTH_ID_KEY):
    declare_difference(_key, original="original", family="staged",
                       source="allenai/staged-training gpt_pretrain.py:1405-1443",
                       behaviour="*_id copies every weight unchanged (nothing zeroed); the copies get copies of the Adam "
                       "moments, the original positions m = v = eye for matrices and 0 for vectors")


def deepened_args(args):
    return explicit_hidden(args, n_layers=2 * args.n_layers)


def layer_positions(n_layers, placement):
    """(position of old layer i, position of its new copy) for each i."""
    if placement == "interleave":
        return [(2 * i, 2 * i + 1) for i in range(n_layers)]
    return [(i, n_layers + i) for i in range(n_layers)]


def identity_pattern(t):
    """staged-training's deep_matrix_weight / deep_bias with is_identical: zeros, with ones on
    the main diagonal of a matrix (its q / k / v blocks each get one: our wq, wk, wv)."""
    out = torch.zeros_like(t)
    if out.dim() > 1:
        out.fill_diagonal_(1)
    return out


def layer_moments(state, original_id):
    """(state of the old layer's position, state of its copy, None = fresh moments)."""
    if not original_id:
        return state, None
    patterned = {k: v.clone() if k == "step" else identity_pattern(v) for k, v in state.items()}
    return patterned, {k: v.clone() for k, v in state.items()}


def grow_depth(weights, args, opt_state, opts, gen=None):
    """(weights, opt_state, None) of the model doubled in depth. The copies' output projections
    are zero, so both residual branches add nothing; at the first step only those get gradient,
    from the second everything learns. Copies start with no optimizer state (fresh moments, their
    own step 0); old layers keep theirs under their new names. With opts.copy_layers (the
    original's alternate_copy / append_copy) the copies are plain copies of the weights and
    moments: the function changes. With opts.depth_id == "original" the identity variants do what
    staged-training's code does: plain weight copies, and identity-patterned moments at the old
    layers' positions (layer_moments)."""
    positions = layer_positions(args.n_layers, opts.placement)
    original_id = opts.depth_id == "original" and not opts.copy_layers
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
        zeroed = rest in ZEROED_IN_NEW_LAYERS and not (opts.copy_layers or original_id)
        new_weights[f"layers.{copy_pos}.{rest}"] = torch.zeros_like(W) if zeroed else W.clone()
        if name in opt_state:
            old_state, copy_state = layer_moments(opt_state[name], original_id)
            new_state[f"layers.{old_pos}.{rest}"] = old_state
            if opts.copy_layers:  # the original's plain copies carry a copy of the moments too
                copy_state = {k: v.clone() for k, v in opt_state[name].items()}
            if copy_state is not None:
                new_state[f"layers.{copy_pos}.{rest}"] = copy_state
    return new_weights, new_state, None


DEPTH = register(GrowthOperator(
    name="layers", setting="depth", display="depth x2", c=C_DEPTH, slope_threshold=-0.0575,
    grown_args=deepened_args, grow=grow_depth, output_suffix=".doubled_layer", plan_default=True,
    why_not_exact="new layers learn, so depth growth cannot reproduce the small model's updates",
    threshold_help="grow depth when the slope rises above this",
    layer_variants={"alternate_id": ("interleave", False), "append_id": ("append", False),
                    "alternate_copy": ("interleave", True), "append_copy": ("append", True)}))
