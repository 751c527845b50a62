"""How to grow: the typed options of one growth (GrowthOptions) and the keys they come from.

    GROWTH_KEYS        train.py's grow_* keys (in-run growth; GrowthOptions.from_config)
    GROW_SECTIONS      grow.py's flags for growing a checkpoint (the planner's are plan/options.py's)

The operator-specific keys are made from the registry (ops/): one grow_c_<setting> / --c_<setting>
per operator, --doubling's choices, the output names; adding an operator adds its keys.
"""
from dataclasses import dataclass
from typing import Optional

from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.growth.ops import OPERATORS
from tinylab.growth.ops.base import operator_names
from tinylab.growth.ops.depth import DEPTH_ID_KEY, GROW_DEPTH_ID, PLACEMENTS
from tinylab.growth.ops.width import GROW_WIDTH_MOMENTS, WIDTH_MOMENTS_KEY

MODES = ("target", "exact")
SYMMETRY_BREAKING = ("random", "split", "blockdiag", "off")
NONNEG = "[0, inf)"


@dataclass(init=False)
class GrowthOptions:
    doubling: str                   # an operator's name (ops/): weights | layers
    mode: str                       # target | exact
    symmetry_breaking: str          # random | split | blockdiag | off; "" = off in exact mode, else random
    sb_scale: float                 # random: R ~ N(0, (sb_scale * RMS(W))^2)
    sb_alpha: float                 # split: A = C = alpha*W, B = D = (1 - alpha)*W
    placement: str                  # layers: copy of layer i at 2i+1, or all copies after the stack
    seed: int
    c: dict                         # {operator: c}: S_target = S_pre / c (staged-training's constants, §7)
    rewarmup_iters: int
    # staged-training's own flags (grow.py; docs/growth.md §6.5)
    copy_layers: bool               # layers: plain copies (alternate_copy / append_copy), not identity
    restart_steps: Optional[int]    # the grown run's first step is restart_steps + 1
    restart_warmup_steps: int       # ... with a linear re-warmup over this many steps
    reset_lr_scheduler: bool        # False: keep the checkpoint's peak LR (with restart_steps)
    reset_optimizer: bool           # fresh optimizer state
    # staged-training's code on request (compat=original; docs/originals.md)
    width_moments: str              # weights: scaled | original (off-diagonal blocks' moments 0)
    depth_id: str                   # layers, identity variants: zero_output | original (plain copies)

    # the original's --doubling_layers values: (placement, plain copies?)
    DOUBLING_LAYERS = {name: v for op in OPERATORS for name, v in op.layer_variants.items()}

    def __init__(self, doubling: str, *, mode="target", symmetry_breaking="", sb_scale=0.5, sb_alpha=0.8,
                 placement="interleave", seed=0, rewarmup_iters=150, copy_layers=False, restart_steps=None,
                 restart_warmup_steps=0, reset_lr_scheduler=False, reset_optimizer=False, width_moments="scaled",
                 depth_id="zero_output", **constants):
        """`constants`: an operator's c by its flag name, c_width=2.0 (the others keep the
        registry's constants)."""
        by_flag = {op.c_flag: op.name for op in OPERATORS}
        unknown = sorted(set(constants) - set(by_flag))
        if unknown:  # as a dataclass would
            raise TypeError(f"GrowthOptions() got an unexpected keyword argument '{unknown[0]}'")
        self.doubling, self.mode, self.symmetry_breaking = doubling, mode, symmetry_breaking
        self.sb_scale, self.sb_alpha, self.placement, self.seed = sb_scale, sb_alpha, placement, seed
        self.c = {op.name: constants.get(op.c_flag, op.c) for op in OPERATORS}
        self.rewarmup_iters, self.copy_layers = rewarmup_iters, copy_layers
        self.restart_steps, self.restart_warmup_steps = restart_steps, restart_warmup_steps
        self.reset_lr_scheduler, self.reset_optimizer = reset_lr_scheduler, reset_optimizer
        self.width_moments, self.depth_id = width_moments, depth_id

    def check(self):
        for value, allowed, what in ((self.doubling, OPERATORS.names(), "doubling"), (self.mode, MODES, "mode"),
                                     (self.split, SYMMETRY_BREAKING, "symmetry_breaking"),
                                     (self.placement, PLACEMENTS, "placement"),
                                     (self.width_moments, GROW_WIDTH_MOMENTS.choices, "width_moments"),
                                     (self.depth_id, GROW_DEPTH_ID.choices, "depth_id")):
            if value not in allowed:
                raise UserError(f"{what} must be one of {', '.join(allowed)}, not '{value}'")
        op = OPERATORS.get(self.doubling)
        if self.mode == "exact" and op.exact is None:
            exact_ones = "/".join(o.setting for o in OPERATORS if o.exact is not None)
            raise UserError(f"mode=exact is {exact_ones}-only ({op.why_not_exact}); use mode=target for {op.name}")
        if self.mode == "exact" and self.width_moments == "original":
            raise UserError("mode=exact reproduces the small model's updates, which width_moments=original (zero "
                            "off-diagonal moments) does not: use width_moments=scaled, or mode=target")
        if not all(c >= 1 for c in self.c.values()):
            raise UserError(f"{' and '.join(o.c_flag for o in OPERATORS)} must be >= 1 (S_target = S_pre / c), "
                            f"got {', '.join(str(c) for c in self.c.values())}")
        if self.rewarmup_iters < 0 or self.sb_scale < 0:
            raise UserError("rewarmup_iters and sb_scale must be >= 0")
        if self.copy_layers and not op.layer_variants:
            raise UserError(f"plain layer copies (--doubling_layers *_copy) apply to --doubling "
                            f"{operator_names('layer_variants', ' / ')} only")
        self._check_restart_flags()
        return self

    def _check_restart_flags(self):
        if self.restart_warmup_steps and self.restart_steps is None:
            raise UserError("--restart_warmup_steps needs --restart_steps (the position the re-warmup starts from)")
        if self.reset_lr_scheduler and self.restart_steps is None:
            raise UserError("--reset_lr_scheduler needs --restart_steps: without a restart the grown run keeps its "
                            "schedule (target mode), and there is no restarted scheduler to reset")
        if self.mode == "exact" and (self.restart_steps is not None or self.reset_optimizer):
            raise UserError("mode=exact continues the small model's exact trajectory: --restart_steps and "
                            "--reset_optimizer belong to mode=target")

    @property
    def plain_copies(self) -> bool:
        """Layers are added as plain copies of the weights (*_copy, or depth_id=original): the
        function changes."""
        layered = bool(OPERATORS.get(self.doubling).layer_variants)
        return layered and (self.copy_layers or self.depth_id == "original")

    @property
    def split(self):
        return self.symmetry_breaking or ("off" if self.mode == "exact" else "random")

    @classmethod
    def from_config(cls, cfg, doubling, seed):
        """Options for in-run growth from train.py's grow_* config keys."""
        return cls(doubling, mode=cfg["grow_mode"], symmetry_breaking=cfg["grow_symmetry_breaking"], seed=seed,
                   rewarmup_iters=cfg["grow_rewarmup_iters"], width_moments=cfg["grow_width_moments"],
                   depth_id=cfg["grow_depth_id"], **{op.c_flag: cfg[f"grow_{op.c_flag}"] for op in OPERATORS}).check()


# ---------------------------------------------------------------------- train.py's keys

GROW_MODE = Key("grow_mode", "target", "target: schedule back to S_pre/c + LR re-warmup | exact: reproduce the "
                "small model's updates (width only)", choices=MODES)
GROW_SB = Key("grow_symmetry_breaking", "", "how the duplicated halves split each matrix; '' = random (target), "
              "off (exact)", choices=("",) + SYMMETRY_BREAKING)
SB_KEY = GROW_SB.replace(name="symmetry_breaking")
for _key in (GROW_SB, SB_KEY):  # staged-training's double_matrix_weight: [[W, 0], [0, W]]
    declare_difference(_key, original="blockdiag", family="staged", source="allenai/staged-training gpt_pretrain.py:119-126",
                       behaviour="width doubling writes every matrix block-diagonal [[W, 0], [0, W]]: the copies never "
                       "differ (no symmetry breaking)")
GROW_C = [Key(f"grow_{op.c_flag}", op.c, f"target mode: S_target = S_pre / c after {op.setting} growth",
              range="[1, inf)") for op in OPERATORS]
GROW_REWARMUP = Key("grow_rewarmup_iters", 150, "target mode: linear LR re-warmup iterations after growth",
                    range=NONNEG)
GROWTH_KEYS = [
    Key("grow_schedule", "", "grow inside the run: '2000:weights,6000:layers' (double width / depth after those "
        "iterations) or 'auto:weights,layers' (when the paper's slope rule fires on loss/test; docs/growth.md §7)"),
    GROW_MODE, GROW_SB, *GROW_C, GROW_REWARMUP, GROW_WIDTH_MOMENTS, GROW_DEPTH_ID,
]

# ---------------------------------------------------------------------- grow.py's keys (growing a checkpoint)

GROW_KEYS = [
    Key("doubling", None, " | ".join(f"{op.name} ({op.display})" for op in OPERATORS), type=str,
        choices=OPERATORS.names()),
    Key("resume", None, "checkpoint file or a folder holding ckpt.pt", type=str, nonempty=True, input=True),
    Key("out_dir", None, f"folder for the grown ckpt.pt (default: <checkpoint>"
        f"{' / '.join(op.output_suffix for op in OPERATORS)} beside the input, the original's names)", type=str,
        nonempty=True, output="grown_checkpoint", output_path=False),
    GROW_MODE.replace(name="mode"),
    SB_KEY,
    Key("sb_scale", 0.5, "symmetry_breaking=random: R ~ N(0, (sb_scale * RMS(W))^2)", range=NONNEG),
    Key("sb_alpha", 0.8, "symmetry_breaking=split: A = C = alpha W, B = D = (1 - alpha) W", range="[0, 1]"),
    Key("placement", "interleave", "layers: the copy of layer i at 2i + 1, or all copies after the stack",
        choices=PLACEMENTS),
    Key("seed", 0, "seed of the symmetry-breaking noise", range=NONNEG),
    *[k.replace(name=k.name[len("grow_"):]) for k in GROW_C],
    GROW_REWARMUP.replace(name="rewarmup_iters"),
    Key("force", False, "replace an existing grown checkpoint or plan (never a training run's checkpoint)"),
]

STAGED_TRAINING_KEYS = [
    Key("doubling_layers", None, "layers: alternate_id | append_id (function-preserving: the copies' output "
        "projections are zero; = --placement interleave | append) | alternate_copy | append_copy (plain "
        "copies, NOT loss-preserving: the loss change is printed)", type=str,
        choices=tuple(GrowthOptions.DOUBLING_LAYERS)),
    Key("restart_steps", None, "the grown run's schedule position: its first step is restart_steps + 1 "
        "(replaces target mode's S_pre / c)", type=int, range=NONNEG),
    Key("restart_warmup_steps", 0, "with --restart_steps: a linear re-warmup over this many steps, the "
        "original's get_restart_linear_schedule_with_warmup", range=NONNEG),
    Key("reset_lr_scheduler", False, "the grown run takes its peak learning rate from the config it is resumed "
        "with (without it, with --restart_steps, the checkpoint's learning_rate is kept, as a restored "
        "LambdaLR keeps its base_lrs)"),
    Key("reset_optimizer", False, "drop the optimizer state: the grown run starts with fresh AdamW moments"),
    WIDTH_MOMENTS_KEY,
    DEPTH_ID_KEY,
]

GROW_SECTIONS = [("growth", GROW_KEYS),
                 ("the staged-training repository's flags (docs/growth.md §6.5)", STAGED_TRAINING_KEYS)]
