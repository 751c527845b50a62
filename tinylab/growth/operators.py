"""Staged training: grow a whole training state (weights, AdamW state, schedule position, data
cursor) to twice the width or twice the depth, preserving the model's function exactly.

    python grow.py --doubling weights --resume out/ckpt.pt --out_dir out_wide   # width x2
    python grow.py --doubling layers  --resume out/ckpt.pt --out_dir out_deep   # depth x2
    python train.py configs/x.py --init_from=resume_train --out_dir=out_wide    # continue

Math and rationale: docs/growth.md (sections cited as §).
  - width (§3): dim, heads, kv heads and FFN hidden size doubled, head size kept (RoPE and the score
    scale unchanged); every matrix in the block form [[A, B], [C, D]] with A + B = C + D = W;
    embedding columns and RMSNorm gains duplicated; the final gain halved for a tied head, the
    untied head split [A | B] with A + B = W.
  - depth (§4): each layer followed (interleave) or the stack followed (append) by a copy whose
    output projections (attention wo, SwiGLU w2) are zero.
  - optimizer state (§6) mapped by parameter name: width copies get c·m and c²·v (c = the factor
    of the small model's gradient each copy receives, all blocks), steps kept; new layers fresh.
  - mode exact (§6.2): per-parameter LR, eps, weight-decay and clip-norm multipliers
    (`param_overrides`) so the grown model's updates reproduce the small model's (width only).
    mode target (§6.3, default): no multipliers; the LR schedule moves back to
    S_target = S_pre / c with a linear re-warmup. `iter_num` keeps counting optimizer steps (the
    data cursor continues, nothing is replayed); the schedule position is iter_num - shift
    (`lr_rewarmup["shift"]`), so the run ends when the position reaches max_iters.
  - symmetry breaking (§5) for the duplicated halves, still exactly function-preserving.
In-run growth (train.py's grow_schedule) applies the same operator through `grow_in_run`.
"""
import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from model import ModelArgs, Transformer
from tinylab.core import memory_budget
from tinylab.core.checkpoint import clean_state_dict, load_weights, model_from_checkpoint
from tinylab.core.errors import UserError, first_line
from tinylab.data.dataset_spec import dataset_dir
from tinylab.data.pretokenized import BatchLoader
from tinylab.training.optim import build_optimizer, optimizer_param_names
from tinylab.training.options import OptimizerOptions

DOUBLINGS = ("weights", "layers")
C_WIDTH, C_DEPTH = 1.776, 1.412  # staged-training's S_pre / S_target after width / depth growth (§7)
MODES = ("target", "exact")
SYMMETRY_BREAKING = ("random", "split", "blockdiag", "off")
PLACEMENTS = ("interleave", "append")
ADAM_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
# limits on the grown model (independent of max_seq_len): beyond these a model cannot be trained
# by this project anyway, and the growth itself would exhaust memory
MAX_DIM, MAX_LAYERS, MAX_PARAMS = 32768, 1024, 20e9

MATRICES = ("attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "attention.wo.weight",
            "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight")
ZEROED_IN_NEW_LAYERS = ("attention.wo.weight", "feed_forward.w2.weight")  # the residual-branch outputs

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


@dataclass
class GrowthOptions:
    doubling: str                   # weights | layers
    mode: str = "target"            # target | exact
    symmetry_breaking: str = ""     # random | split | blockdiag | off; "" = off in exact mode, else random
    sb_scale: float = 0.5           # random: R ~ N(0, (sb_scale * RMS(W))^2)
    sb_alpha: float = 0.8           # split: A = C = alpha*W, B = D = (1 - alpha)*W
    placement: str = "interleave"   # layers: copy of layer i at 2i+1, or all copies after the stack
    seed: int = 0
    c_width: float = C_WIDTH        # S_target = S_pre / c (staged-training's constants, §7)
    c_depth: float = C_DEPTH
    rewarmup_iters: int = 150
    # staged-training's own flags (grow.py; docs/growth.md §6.5)
    copy_layers: bool = False               # layers: plain copies (alternate_copy / append_copy), not identity
    restart_steps: Optional[int] = None     # the grown run's first step is restart_steps + 1
    restart_warmup_steps: int = 0           # ... with a linear re-warmup over this many steps
    reset_lr_scheduler: bool = False        # False: keep the checkpoint's peak LR (with restart_steps)
    reset_optimizer: bool = False           # fresh optimizer state

    # the original's --doubling_layers values: (placement, plain copies?)
    DOUBLING_LAYERS = {"alternate_id": ("interleave", False), "append_id": ("append", False),
                       "alternate_copy": ("interleave", True), "append_copy": ("append", True)}

    def check(self):
        for value, allowed, what in ((self.doubling, DOUBLINGS, "doubling"), (self.mode, MODES, "mode"),
                                     (self.split, SYMMETRY_BREAKING, "symmetry_breaking"),
                                     (self.placement, PLACEMENTS, "placement")):
            if value not in allowed:
                raise UserError(f"{what} must be one of {', '.join(allowed)}, not '{value}'")
        if self.mode == "exact" and self.doubling == "layers":
            raise UserError("mode=exact is width-only (new layers learn, so depth growth cannot reproduce the "
                            "small model's updates); use mode=target for layers")
        if not (self.c_width >= 1 and self.c_depth >= 1):
            raise UserError(f"c_width and c_depth must be >= 1 (S_target = S_pre / c), got {self.c_width}, {self.c_depth}")
        if self.rewarmup_iters < 0 or self.sb_scale < 0:
            raise UserError("rewarmup_iters and sb_scale must be >= 0")
        if self.copy_layers and self.doubling != "layers":
            raise UserError("plain layer copies (--doubling_layers *_copy) apply to --doubling layers only")
        if self.restart_warmup_steps and self.restart_steps is None:
            raise UserError("--restart_warmup_steps needs --restart_steps (the position the re-warmup starts from)")
        if self.reset_lr_scheduler and self.restart_steps is None:
            raise UserError("--reset_lr_scheduler needs --restart_steps: without a restart the grown run keeps its "
                            "schedule (target mode), and there is no restarted scheduler to reset")
        if self.mode == "exact" and (self.restart_steps is not None or self.reset_optimizer):
            raise UserError("mode=exact continues the small model's exact trajectory: --restart_steps and "
                            "--reset_optimizer belong to mode=target")
        return self

    @property
    def split(self):
        return self.symmetry_breaking or ("off" if self.mode == "exact" else "random")

    @classmethod
    def from_config(cls, cfg, doubling, seed):
        """Options for in-run growth from train.py's grow_* config keys."""
        return cls(doubling=doubling, mode=cfg["grow_mode"], symmetry_breaking=cfg["grow_symmetry_breaking"],
                   seed=seed, c_width=cfg["grow_c_width"], c_depth=cfg["grow_c_depth"],
                   rewarmup_iters=cfg["grow_rewarmup_iters"]).check()


# ---------------------------------------------------------------------- shapes

def grown_args(args: ModelArgs, doubling: str) -> ModelArgs:
    """The grown model's arguments; hidden_dim is explicit (the llama2.c rule need not give 2f)."""
    d = asdict(args)
    d["hidden_dim"] = args.ffn_hidden_dim()
    if doubling == "weights":
        d.update(dim=2 * args.dim, n_heads=2 * args.n_heads, n_kv_heads=2 * args.kv_heads(),
                 hidden_dim=2 * args.ffn_hidden_dim())
    else:
        d["n_layers"] = 2 * args.n_layers
    return ModelArgs(**d)


def meta_model(args: ModelArgs) -> Transformer:
    """The model's structure (names, shapes, tying) without allocating or initialising weights."""
    with torch.device("meta"):
        return Transformer(args)


def check_limits(args: ModelArgs):
    n = meta_model(args).num_params()
    if args.dim > MAX_DIM or args.n_layers > MAX_LAYERS or n > MAX_PARAMS:
        raise UserError(f"the grown model (dim {args.dim}, {args.n_layers} layers, {n / 1e9:.2f}B parameters) exceeds "
                        f"grow.py's limits (dim <= {MAX_DIM}, layers <= {MAX_LAYERS}, <= {MAX_PARAMS / 1e9:.0f}B parameters)")


# ---------------------------------------------------------------------- width (§3)

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


def widen_moments(state, kind):
    """AdamW state of one parameter for its doubled tensor: each copy receives c times the small
    model's gradient, so m -> c*m, v -> c^2*v in every block (zero-valued blocks too); steps kept."""
    tiling, c, _ = WIDTH_KINDS[kind]
    out = {}
    for key, t in state.items():
        if key == "step":
            out[key] = t.clone()
        else:  # scale the small tensor, then tile it (the large one is written once)
            out[key] = (t * (c if key == "exp_avg" else c * c)).repeat(*tiling)
    return out


def grow_width(weights, args, opt_state, opts, gen):
    """Return (weights, args, opt_state, kinds) of the model doubled in width."""
    new_weights, new_state, kinds = {}, {}, {}
    for name, W in weights.items():
        if name == "output.weight" and args.tie_embeddings:
            continue  # the same tensor as the embedding
        kinds[name] = width_kind(name, args.tie_embeddings)
        new_weights[name] = widen(W, kinds[name], opts, gen)
        if name in opt_state:
            new_state[name] = widen_moments(opt_state[name], kinds[name])
    if args.tie_embeddings:
        new_weights["output.weight"] = new_weights["tok_embeddings.weight"]
    return new_weights, grown_args(args, "weights"), new_state, kinds


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


# ---------------------------------------------------------------------- depth (§4)

def layer_positions(n_layers, placement):
    """(position of old layer i, position of its new copy) for each i."""
    if placement == "interleave":
        return [(2 * i, 2 * i + 1) for i in range(n_layers)]
    return [(i, n_layers + i) for i in range(n_layers)]


def grow_depth(weights, args, opt_state, opts):
    """Return (weights, args, opt_state) of the model doubled in depth. The copies' output
    projections are zero, so both residual branches add nothing; at the first step only those get
    gradient, from the second everything learns. Copies start with no optimizer state (fresh
    moments, their own step 0); old layers keep theirs under their new names. With
    opts.copy_layers (the original's alternate_copy / append_copy) the copies are plain copies of
    the weights and moments: the function changes."""
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
    return new_weights, grown_args(args, "layers"), new_state


# ---------------------------------------------------------------------- optimizer state by name (§6)

def optimizer_state_by_name(ckpt, shapes):
    """{parameter name: AdamW state} of a checkpoint, checked against the model's parameters
    (`shapes`: {name: shape}). Structure and every moment's shape are checked here: a malformed
    state would otherwise be grown, written, and fail only inside AdamW when train.py resumes."""
    opt = ckpt.get("optimizer")
    if opt is None:
        return {}
    opt_name = ckpt.get("optimizer_name", "adamw")
    if opt_name != "adamw":
        raise UserError(f"the checkpoint's optimizer state is {opt_name}; grow.py maps AdamW state only "
                        "(grow the weights of a resume_model copy, or train the small model with AdamW)")
    saved = ckpt.get("param_names")
    if saved is None:
        raise UserError("the checkpoint has optimizer state but no param_names, so its state cannot be mapped "
                        "by name (checkpoints written by this project's train.py have them)")
    if not isinstance(saved, (list, tuple)):
        raise UserError(f"the checkpoint's param_names is a {type(saved).__name__}, not a list of names")
    if sorted(map(str, saved)) != sorted(shapes):
        unknown = sorted(set(map(str, saved)) - set(shapes))[:3] or sorted(set(shapes) - set(map(str, saved)))[:3]
        raise UserError(f"the checkpoint's optimizer state does not match the model's parameters "
                        f"(unknown or missing parameter names: {', '.join(unknown) or 'a name listed twice'})")
    if not (isinstance(opt, dict) and isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list)
            and opt["param_groups"] and all(isinstance(g, dict) for g in opt["param_groups"])):
        raise UserError("the checkpoint's optimizer entry is not a torch optimizer state dict "
                        "(it needs a 'state' dict and a non-empty 'param_groups' list)")
    by_name = {}
    for index, st in opt["state"].items():
        # torch keys the state by int position in param_groups; other keys would be dropped on load
        if type(index) is not int or not 0 <= index < len(saved):
            raise UserError(f"the checkpoint's optimizer state has index {index!r:.40} but only {len(saved)} "
                            f"param_names (indices 0-{len(saved) - 1})")
        name = saved[index]
        if not isinstance(st, dict):
            raise UserError(f"the optimizer state of {name} is not a dict")
        unknown = [k for k in st if k not in ADAM_STATE_KEYS]
        if unknown:
            raise UserError(f"unknown optimizer state '{unknown[0]}' for {name}; grow.py maps AdamW's "
                            f"{', '.join(ADAM_STATE_KEYS)}")
        missing = [k for k in ("step", "exp_avg", "exp_avg_sq") if st and k not in st]
        if missing:  # AdamW initialises only an empty state; a partial one fails at its first step
            raise UserError(f"the optimizer state of {name} has no {missing[0]}")
        if st and not (isinstance(st["step"], torch.Tensor) and st["step"].numel() == 1):
            raise UserError(f"the optimizer state of {name}: step must be a one-element tensor")
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if key in st and not isinstance(st[key], torch.Tensor):
                raise UserError(f"the optimizer state of {name}: {key} is a {type(st[key]).__name__}, not a tensor")
            if key in st and tuple(st[key].shape) != shapes[name]:
                raise UserError(f"the checkpoint's optimizer state is inconsistent: {key} of {name} has shape "
                                f"{tuple(st[key].shape)}, the parameter {shapes[name]}")
        by_name[name] = st
    return by_name


def optimizer_state_dict(args, cfg, overrides, by_name, old):
    """A torch AdamW state dict for the model `args` describes: the parameter groups exactly as
    train.py will build them (same grouping, names, hyperparameters), the state filled by name.
    Implementation flags (fused on CUDA, foreach) are taken from the old state dict `old`, since
    the structure is built on the meta device."""
    opt = build_optimizer(meta_model(args), OptimizerOptions.from_config(cfg), overrides)
    names = optimizer_param_names(opt)
    sd = opt.state_dict()
    flags = {k: v for k, v in old["param_groups"][0].items() if k in ("foreach", "fused", "capturable")}
    for group in sd["param_groups"]:
        group.update(flags)
    sd["state"] = {i: by_name[n] for i, n in enumerate(names) if by_name.get(n)}
    return sd, names


# ---------------------------------------------------------------------- the whole training state

WEIGHTS_MISMATCH = "the checkpoint's weights do not match its model_args (incompatible shapes or names)"


def check_checkpoint(ckpt):
    """The entries growth reads besides the optimizer state, checked before any work (a missing
    iter_num used to surface only after the grown checkpoint had been written)."""
    model = ckpt.get("model")
    if not isinstance(model, dict) or not all(isinstance(t, torch.Tensor) for t in model.values()):
        raise UserError("the checkpoint's 'model' entry is not a state dict of tensors")
    if not isinstance(ckpt.get("model_args"), dict):
        raise UserError("the checkpoint's 'model_args' entry is not a dict")
    if not isinstance(ckpt.get("config") or {}, dict):
        raise UserError("the checkpoint's 'config' entry is not a dict")
    if "iter_num" not in ckpt:
        raise UserError("the checkpoint has no 'iter_num' (growth continues its iteration count; "
                        "checkpoints written by train.py have it)")
    if type(ckpt["iter_num"]) is not int or ckpt["iter_num"] < 0:
        raise UserError(f"the checkpoint's iter_num must be an int >= 0, not {ckpt['iter_num']!r:.40}")
    rw = ckpt.get("lr_rewarmup")
    if rw is not None and not (isinstance(rw, dict) and type(rw.get("shift", 0)) is int):
        raise UserError(f"the checkpoint's lr_rewarmup must be None or {{'start', 'iters', 'shift'}}, not {rw!r:.60}")


def checked_small_model(args, weights):
    """The meta model `args` describes, with the weights checked against it. Runs before
    check_limits, so broken model_args (silently filled with ModelArgs' 7B defaults) are reported
    as a mismatch, not as a grown model beyond the size limits."""
    # layer count first: building the meta model costs time per layer, and n_layers may be anything
    if args.n_layers != len({k.split(".")[1] for k in weights if k.startswith("layers.")}):
        raise UserError(WEIGHTS_MISMATCH)
    try:
        small = meta_model(args)
    except (AssertionError, TypeError, ValueError, ZeroDivisionError, OverflowError, RuntimeError) as e:
        raise UserError(f"the checkpoint's model_args do not describe a model ({first_line(e)})")
    expected = small.state_dict()
    if set(weights) != set(expected) or any(tuple(weights[k].shape) != tuple(v.shape) for k, v in expected.items()):
        raise UserError(WEIGHTS_MISMATCH)
    return small


def target_schedule(ckpt, opts):
    """Mode target (§6.3): the schedule position jumps back from S_pre to S_target = S_pre / c and
    the LR re-warms linearly over rewarmup_iters; iteration counting (and data) continue."""
    it = ckpt["iter_num"]
    shift = (ckpt.get("lr_rewarmup") or {}).get("shift", 0)
    s_pre = it - shift
    c = opts.c_width if opts.doubling == "weights" else opts.c_depth
    s_target = int(round(s_pre / c))
    return {"start": it, "iters": opts.rewarmup_iters, "shift": shift + s_pre - s_target}


def check_restart(opts, cfg):
    """--restart_steps S and --restart_warmup_steps R against the checkpoint's config `cfg`: the
    grown run trains from position S + 1 until its position reaches max_iters, so S must lie
    before the schedule's end and the re-warmup (positions S .. S + R) must end by max_iters."""
    s, r = opts.restart_steps, opts.restart_warmup_steps
    if s is None:
        return
    end = cfg["lr_decay_iters"] or cfg["max_iters"]
    if s >= cfg["max_iters"] or s >= end:
        raise UserError(f"--restart_steps={s} is beyond the run's schedule (max_iters={cfg['max_iters']}, "
                        f"lr_decay_iters={cfg['lr_decay_iters']}): the grown run would have nothing left to train")
    if r > cfg["max_iters"] - s:
        raise UserError(f"--restart_warmup_steps={r} is longer than what is left of the schedule after "
                        f"--restart_steps={s}: max_iters={cfg['max_iters']} (the checkpoint's config) - {s} = "
                        f"{cfg['max_iters'] - s} steps; the grown run would end inside its re-warmup")


def restart_schedule(ckpt, opts, cfg):
    """grow.py --restart_steps S [--restart_warmup_steps R] (staged-training's restart): the grown
    run's first step is at schedule position S + 1, re-warming linearly from position S over R
    steps (optim.lr_at); iteration counting and data continue. Without --reset_lr_scheduler the
    checkpoint's peak learning rate stays (a restored LambdaLR keeps its base_lrs)."""
    check_restart(opts, cfg)
    it, s = ckpt["iter_num"], opts.restart_steps
    rewarmup = {"start": it, "iters": opts.restart_warmup_steps, "shift": it - (s + 1), "ramp_from": s}
    if not opts.reset_lr_scheduler:
        rewarmup["base_lr"] = cfg["learning_rate"]
    return rewarmup


def grow_checkpoint(ckpt: dict, opts: GrowthOptions, cfg: dict) -> dict:
    """The grown training state as a new checkpoint dict (the input is not modified). `cfg` is the
    whole training config whose optimizer settings the grown optimizer state must match (grow.py:
    the checkpoint's own config over the schema's defaults)."""
    opts.check()
    check_checkpoint(ckpt)
    args = ModelArgs.from_dict(ckpt["model_args"])
    weights = clean_state_dict(ckpt["model"])
    if args.tie_embeddings and "output.weight" not in weights and "tok_embeddings.weight" in weights:
        weights["output.weight"] = weights["tok_embeddings.weight"]
    small = checked_small_model(args, weights)
    new_args = grown_args(args, opts.doubling)
    check_limits(new_args)
    # and what this machine can hold of it: the grown weights and moments, beside the checkpoint
    grown_shape = memory_budget.Shape.from_model_args(new_args)
    if grown_shape is not None:
        keeps_moments = ckpt.get("optimizer") is not None and not opts.reset_optimizer
        memory_budget.check(memory_budget.growth_estimate(grown_shape, keeps_moments), str(next(iter(weights.values())).device))
    if opts.mode == "exact" and (args.dropout > 0 or cfg["dropout"] > 0):
        raise UserError("mode=exact needs dropout=0 (dropout masks differ between the halves)")
    opt_state = optimizer_state_by_name(ckpt, {n: tuple(p.shape) for n, p in small.named_parameters()})

    overrides = None
    with torch.no_grad():
        if opts.doubling == "weights":
            gen = torch.Generator().manual_seed(opts.seed)
            weights, new_args, opt_state, kinds = grow_width(weights, args, opt_state, opts, gen)
            if opts.mode == "exact":
                overrides = exact_overrides(kinds, ckpt.get("param_overrides"), cfg["adam_eps"])
        else:
            weights, new_args, opt_state = grow_depth(weights, args, opt_state, opts)

    grown = dict(ckpt)  # iter_num, best_val_loss, rng, loader, scaler, ... carry over unchanged
    model_args = asdict(new_args)
    grown["model"] = weights
    grown["model_args"] = model_args
    grown["config"] = {**(ckpt.get("config") or {}),
                       **{k: model_args[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim")}}
    grown["param_overrides"] = overrides
    if opts.restart_steps is not None:
        grown["lr_rewarmup"] = restart_schedule(ckpt, opts, cfg)
    elif opts.mode == "target":
        grown["lr_rewarmup"] = target_schedule(ckpt, opts)
    if opts.reset_optimizer:
        grown["optimizer"], grown["param_names"] = None, None
    elif ckpt.get("optimizer") is not None:
        grown["optimizer"], grown["param_names"] = optimizer_state_dict(new_args, cfg, overrides, opt_state,
                                                                         ckpt["optimizer"])
    return grown


# ---------------------------------------------------------------------- in-run growth and diagnostics

@torch.no_grad()
def batch_loss(model, batch, autocast=None):
    """The model's loss on one batch (a dict of forward keyword arguments), dropout off."""
    was_training = model.training
    model.eval()
    with autocast or nullcontext():
        model(**{k: v for k, v in batch.items() if k != "loss_scale"}, return_logits=False)
    model.train(was_training)
    return model.last_loss.item()


@torch.no_grad()
def half_asymmetry(model, tokens):
    """max |x1 - x2| between the two halves of the final hidden state (§5's diagnostic): 0 right
    after width growth; stays 0 during training without symmetry breaking."""
    h = model._trunk(tokens)
    d = h.shape[-1] // 2
    return (h[..., :d] - h[..., d:]).abs().max().item()


# slope thresholds of the oracle-free growth rule (§7): the smoothed slope of log10 loss against
# log10 compute rises above these at the pre-growth point (weights, layers) / the optimality point
SLOPE_THRESHOLDS = {"weights": -0.0475, "layers": -0.0575, "optimality": -0.052}


def loss_slopes(compute, losses, window=5):
    """s = d log10 L / d log10 C between consecutive points, smoothed by a trailing running mean
    over `window` slopes; s[i] belongs to point i (None for the first point)."""
    raw = [None] + [(math.log10(losses[i]) - math.log10(losses[i - 1])) / (math.log10(compute[i]) - math.log10(compute[i - 1]))
                    for i in range(1, len(compute))]
    return [None if i == 0 else sum(raw[max(1, i - window + 1):i + 1]) / (i + 1 - max(1, i - window + 1))
            for i in range(len(raw))]


def growth_point(compute, losses, threshold, window=5):
    """Index of the first point after the steepest smoothed slope where the slope rises above
    `threshold` (SLOPE_THRESHOLDS), or None if it has not yet."""
    s = loss_slopes(compute, losses, window)
    valid = [i for i in range(len(s)) if s[i] is not None]
    if not valid:
        return None
    steepest = min(valid, key=lambda i: s[i])
    return next((i for i in valid if i > steepest and s[i] > threshold), None)


def parse_grow_schedule(cfg) -> dict:
    """{iteration: doubling} from config grow_schedule="2000:weights,6000:layers", with the other
    grow_* keys checked up front (a mistake should stop the run before training, not at growth)."""
    text = cfg["grow_schedule"].strip()
    if not text or parse_auto_growth(cfg) is not None:
        return {}
    schedule = {}
    for entry in text.split(","):
        it, _, doubling = entry.strip().partition(":")
        if not it.strip().isdigit() or not doubling:
            raise UserError(f"grow_schedule entry '{entry}' is not ITER:weights or ITER:layers")
        it = int(it)
        if it < 1 or it in schedule:  # (one past the run's end is simply never reached)
            raise UserError(f"grow_schedule iteration {it} must be >= 1 and appear once")
        schedule[it] = doubling.strip()
        GrowthOptions.from_config(cfg, schedule[it], seed=0)
    if cfg["optimizer"] != "adamw":
        raise UserError(f"grow_schedule needs optimizer=adamw (growth maps AdamW state only), not {cfg['optimizer']}")
    if cfg["grow_mode"] == "exact" and cfg["dropout"] > 0:
        raise UserError("grow_mode=exact needs dropout=0 (dropout masks differ between the halves)")
    return schedule


def unreachable_growth(cfg, schedule):
    """(iteration, end) of the first grow_schedule iteration that a run starting at iteration 0
    never reaches, or None. The run ends when its schedule position reaches max_iters; growth
    runs after the step that makes iter_num its iteration, so max_iters itself is reached, and
    each target-mode growth before moves the position back (S_pre -> S_pre / c), so the run's
    end, max_iters + the shifts so far, moves on with it."""
    shift = 0
    for it in sorted(schedule):
        if it > cfg["max_iters"] + shift:
            return it, cfg["max_iters"] + shift
        if cfg["grow_mode"] == "target":
            opts = GrowthOptions.from_config(cfg, schedule[it], seed=0)
            shift = target_schedule({"iter_num": it, "lr_rewarmup": {"shift": shift}}, opts)["shift"]
    return None


def parse_auto_growth(cfg):
    """The operators of grow_schedule="auto" / "auto:weights,layers" (grow by the paper's slope
    rule when it fires, these operators in turn; bare "auto" is one width growth), or None."""
    text = cfg["grow_schedule"].strip()
    if not text.startswith("auto"):
        return None
    head, sep, ops = text.partition(":")
    if head != "auto":
        raise UserError(f"grow_schedule={text!r}: write auto or auto:OP[,OP...] (OP weights or layers)")
    ops = [o.strip() for o in ops.split(",")] if sep else ["weights"]
    if "" in ops:  # "auto:" or "auto:weights,": an operator left out is a mistake, not bare auto's default
        raise UserError(f"grow_schedule={text!r} names {'no operator' if not any(ops) else 'an empty operator'} "
                        f"after auto: (write auto:weights,layers, or bare auto for one width growth)")
    for op in ops:
        GrowthOptions.from_config(cfg, op, seed=0)
    if cfg["optimizer"] != "adamw":
        raise UserError(f"grow_schedule needs optimizer=adamw (growth maps AdamW state only), not {cfg['optimizer']}")
    if cfg["grow_mode"] != "target":
        raise UserError("grow_schedule=auto grows where the paper's rule says, in its target mode: use grow_mode=target")
    return ops


def grow_in_run(trainer, doubling, batch):
    """Grow the trainer's model and optimizer in-process, at the end of an iteration: the same
    operator as the CLI, applied to the running state's checkpoint dict, then installed (optimizer
    rebuilt, compile/DDP re-wrapped). The data loader is left alone, so no batch repeats. Logs the
    loss on `batch` (the next training batch) just before and after."""
    cfg, run = trainer.cfg, trainer.run
    before = batch_loss(trainer.raw_model, batch, run.autocast)
    small_params = trainer.raw_model.num_params()
    opts = GrowthOptions.from_config(cfg, doubling, seed=cfg["seed"] + trainer.iter_num)
    state = trainer.checkpoint_dict(loader_state=None)
    grown = grow_checkpoint(state, opts, cfg)
    args = ModelArgs.from_dict({**grown["model_args"], "max_seq_len": cfg["max_seq_len"], "dropout": cfg["dropout"]})
    model = Transformer(args).to(device=run.device, dtype=run.param_dtype)  # built in the run's precision
    load_weights(model, grown["model"])
    trainer.install(model, grown)
    after = batch_loss(trainer.raw_model, batch, run.autocast)
    p = trainer.raw_model.params
    rec = {"iter": trainer.iter_num, "doubling": doubling, "mode": opts.mode, "symmetry_breaking": opts.split,
           "loss_before": before, "loss_after": after, "delta_loss": after - before,
           "params_before": small_params, "params_after": trainer.raw_model.num_params(),
           "dim": p.dim, "n_layers": p.n_layers, "n_heads": p.n_heads, "hidden_dim": p.ffn_hidden_dim(),
           "lr_rewarmup": grown.get("lr_rewarmup")}
    if run.master:
        print(f"grew {doubling} at iter {trainer.iter_num}: {small_params / 1e6:.2f}M -> {rec['params_after'] / 1e6:.2f}M "
              f"parameters, loss on the next batch {before:.6f} -> {after:.6f} (delta {after - before:+.2e})")
    trainer.logger.log(rec, kind="growth")
    return rec


# ---------------------------------------------------------------------- grow.py's report

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
    layers = f", layers {'copied' if opts.copy_layers else 'identity'} ({opts.placement})" if opts.doubling == "layers" else ""
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
