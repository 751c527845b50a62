"""What a growth operator is, the registry of them, and the limits every grown shape meets.

An operator registers one `GrowthOperator` in its own module (ops/width.py, ops/depth.py); every
reader (grow.py's --doubling, train.py's grow_schedule, the planner's --operators, the grow_c_* /
c_* / threshold_* keys) takes names and values from OPERATORS, never from literals.
"""
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

from model import ModelArgs, Transformer
from tinylab.core.errors import UserError
from tinylab.core.registry import Registry

OPERATORS = Registry("growth operator")

# limits on the grown model (independent of max_seq_len): beyond these a model cannot be trained
# by this project anyway, and the growth itself would exhaust memory
MAX_DIM, MAX_LAYERS, MAX_PARAMS = 32768, 1024, 20e9


@dataclass(frozen=True)
class GrowthOperator:
    """One growth operator: its names, its constants, and its two functions.

    grown_args(args) -> the grown model's ModelArgs (hidden_dim explicit).
    grow(weights, args, opt_state, opts, gen) -> (weights, opt_state, info): the grown weights
        and AdamW state by parameter name (a parameter without state starts with fresh moments);
        `info` is what `exact` needs (None when the operator has no exact mode). `opts` is a
        GrowthOptions, `gen` a seeded CPU generator for symmetry breaking.
    exact(info, old_overrides, adam_eps) -> param_overrides under which the grown model's
        updates reproduce the small model's (mode=exact); None: target mode only.
    """
    name: str                  # --doubling, grow_schedule, --operators; the checkpoint's growth records
    setting: str               # names its settings: grow_c_<setting>, --c_<setting>, --threshold_<setting>
    display: str               # the planner's name of one growth ("width x2")
    c: float                   # target mode: S_target = S_pre / c (staged-training's constants, §7)
    slope_threshold: float     # the rule grows when d log10 L / d log10 C rises above this (§7)
    grown_args: Callable
    grow: Callable
    output_suffix: str         # grow.py without --out_dir writes <checkpoint><output_suffix>
    exact: Optional[Callable] = None
    why_not_exact: str = ""    # for the error line when mode=exact is asked of an operator without it
    # the original's --doubling_layers names of this operator: {name: (placement, plain copies?)};
    # an operator with them adds layers (--placement and --doubling_layers apply)
    layer_variants: dict = field(default_factory=dict)
    threshold_help: str = ""   # --threshold_<setting>'s help ('' = "grow <setting> when ... rises above this")
    # among the planner's default candidates (--operators): c and slope_threshold are calibrated
    # (the paper's, §7); other operators are planned when --operators names them
    plan_default: bool = False

    @property
    def c_flag(self) -> str:
        return f"c_{self.setting}"

    @property
    def threshold_flag(self) -> str:
        return f"threshold_{self.setting}"


def plan_defaults() -> tuple:
    """The operators the planner combines unless --operators says otherwise."""
    return tuple(op.name for op in OPERATORS if op.plan_default)


def operator_names(having="", sep=", ") -> str:
    """'weights, layers': the registered names (those whose field `having` is set), for help texts
    and error lines."""
    return sep.join(op.name for op in OPERATORS if not having or getattr(op, having))


def explicit_hidden(args: ModelArgs, **changes) -> ModelArgs:
    """`args` with `changes` and hidden_dim written out (the llama2.c rule need not give the same
    hidden size for a grown dim, and a grown checkpoint must describe exactly its weights)."""
    d = asdict(args)
    d["hidden_dim"] = args.ffn_hidden_dim()
    d.update(changes)
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


def grown_args(args: ModelArgs, doubling: str) -> ModelArgs:
    """The arguments of `args` grown by the operator named `doubling`."""
    return OPERATORS.get(doubling).grown_args(args)


def register(op: GrowthOperator) -> GrowthOperator:
    """Add `op` to OPERATORS under its name (each operator module calls this once)."""
    return OPERATORS.register(op.name, op)
