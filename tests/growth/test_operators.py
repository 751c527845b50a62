"""The growth-operator registry (tinylab/growth/ops/): every entry complete, every reader fed from
it (the keys, grow.py, the planner), an unknown name one line, and every registered operator
function-preserving on its whole training state. A new operator module is covered here without
an edit: the tests iterate over OPERATORS."""
import ast
import glob
import os

import pytest
import torch
from conftest import REPO, assert_one_line_error, run_main, tiny_model

from model import ModelArgs, Transformer
from tinylab.core.checkpoint import load_weights, model_args_dict
from tinylab.core.errors import UserError
from tinylab.core.registry import Registry
from tinylab.growth.ops import OPERATORS, GrowthOperator
from tinylab.growth.ops.depth import PLACEMENTS
from tinylab.growth.options import GrowthOptions
from tinylab.growth.plan.options import PlanOptions
from tinylab.growth.rule import SLOPE_THRESHOLDS
from tinylab.growth.state import grow_checkpoint
from tinylab.schema import GROW, TRAIN
from tinylab.training.optim import build_optimizer, optimizer_param_names
from tinylab.training.options import OptimizerOptions

NAMES = OPERATORS.names()
CFG = dict(TRAIN.defaults(), learning_rate=1e-2, adam_eps=1e-6, max_iters=100, warmup_iters=2, dropout=0.0)


def test_the_width_and_depth_operators_are_registered_in_order():
    assert NAMES[:2] == ("weights", "layers")  # the order of --help, error lines and the planner's candidates
    assert all(OPERATORS.get(n).plan_default for n in NAMES[:2])  # the paper's calibrated c and thresholds
    assert all(isinstance(op, GrowthOperator) for op in OPERATORS)


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_has_every_field(name):
    op = OPERATORS.get(name)
    assert op.name == name and op.setting.isidentifier() and op.display
    assert isinstance(op.c, float) and op.c >= 1
    assert isinstance(op.slope_threshold, float) and op.slope_threshold < 0
    assert callable(op.grown_args) and callable(op.grow)
    assert op.output_suffix.startswith(".") and op.output_suffix != ".pt"
    if op.exact is None:
        assert op.why_not_exact  # the error line says why
    else:
        assert callable(op.exact)
    assert isinstance(op.plan_default, bool)
    for variant, (placement, copies) in op.layer_variants.items():
        assert placement in PLACEMENTS and isinstance(copies, bool), variant
    # the names its settings go by are unique across the registry
    assert [o.setting for o in OPERATORS].count(op.setting) == 1
    assert [o.output_suffix for o in OPERATORS].count(op.output_suffix) == 1


@pytest.mark.parametrize("name", NAMES)
def test_every_reader_takes_the_entry(name):
    op = OPERATORS.get(name)
    assert name in GROW.keys["doubling"].choices and op.display in GROW.keys["doubling"].help
    assert TRAIN.keys[f"grow_c_{op.setting}"].default == op.c and GROW.keys[f"c_{op.setting}"].default == op.c
    assert GROW.keys[f"threshold_{op.setting}"].default == op.slope_threshold == SLOPE_THRESHOLDS[name]
    # the planner combines the calibrated operators unless --operators names others
    assert (name in GROW.keys["operators"].default.split(",")) == op.plan_default == (name in PlanOptions().operators)
    assert name in GROW.keys["operators"].help and GROW.keys["operators"].check(name) is None
    assert op.output_suffix in GROW.keys["out_dir"].help
    assert GrowthOptions(name).c[name] == op.c and PlanOptions().c[name] == op.c
    assert GrowthOptions(name, **{f"c_{op.setting}": 3.0}).c[name] == 3.0
    for variant in op.layer_variants:
        assert variant in GROW.keys["doubling_layers"].choices


def test_operator_names_are_written_only_in_their_modules():
    """Readers take names from the registry: no growth module outside ops/, nor grow.py, the
    experiment or the benchmark, spells an operator's name as a string literal."""
    def literals(path):
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in NAMES}

    ops_dir = os.path.join(REPO, "tinylab", "growth", "ops")
    readers = [p for p in glob.glob(os.path.join(REPO, "tinylab", "growth", "**", "*.py"), recursive=True)
               if not p.startswith(ops_dir + os.sep)]
    readers += [os.path.join(REPO, p) for p in ("grow.py", "experiments/staged_training.py", "bench/grow.py")]
    assert len(readers) > 10
    found = {os.path.relpath(p, REPO): literals(p) for p in readers}
    assert not any(found.values()), {p: v for p, v in found.items() if v}
    # the check sees literals where they are
    assert literals(os.path.join(ops_dir, "width.py")) == {NAMES[0]}


def test_unknown_operator_is_one_line(tmp_path):
    with pytest.raises(UserError) as e:
        OPERATORS.get("sideways")
    assert "\n" not in str(e.value) and all(n in str(e.value) for n in NAMES)
    with pytest.raises(UserError, match="doubling must be one of " + ", ".join(NAMES)):
        GrowthOptions("sideways").check()
    out = tmp_path / "out"
    assert_one_line_error(run_main("grow.py", ["--doubling=sideways", f"--resume={tmp_path}", f"--out_dir={out}"]),
                          "--doubling='sideways': must be one of")
    assert_one_line_error(run_main("grow.py", ["--plan", f"--runs={tmp_path}", "--budget=1e12",
                                               "--operators=weights,sideways"]), "--operators")
    assert not out.exists() and os.listdir(tmp_path) == []


def test_a_name_registers_once():
    reg = Registry("growth operator")
    reg.register("x", 1)
    with pytest.raises(ValueError, match="twice"):
        reg.register("x", 2)


def small_state():
    """A tiny fp64 model after two AdamW steps, as the checkpoint dict train.py writes."""
    m = tiny_model(seed=3, dtype=torch.float64, vocab_size=61, max_seq_len=16, n_kv_heads=2).train()
    opt = build_optimizer(m, OptimizerOptions.from_config(CFG))
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        x = torch.randint(0, 61, (2, 16), generator=g)
        m(x, x)
        m.last_loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    ckpt = {"model": m.state_dict(), "model_args": model_args_dict(m), "iter_num": 2, "config": dict(CFG),
            "optimizer": opt.state_dict(), "optimizer_name": "adamw", "param_names": optimizer_param_names(opt),
            "param_overrides": None, "lr_rewarmup": None}
    return m.eval(), ckpt


@pytest.mark.parametrize("name", NAMES)
def test_every_operator_preserves_the_function_and_its_state_loads(name):
    """The reference is the unchanged small model: the grown one computes the same logits (fp64),
    has the entry's shape, and its optimizer state loads into the AdamW train.py builds for it."""
    op = OPERATORS.get(name)
    small, ckpt = small_state()
    grown = grow_checkpoint(ckpt, GrowthOptions(name), ckpt["config"])
    args = ModelArgs.from_dict(grown["model_args"])
    assert args == op.grown_args(ModelArgs.from_dict(ckpt["model_args"]))
    big = Transformer(args).double()
    load_weights(big, grown["model"])
    assert big.num_params() > small.num_params()
    x = torch.randint(0, 61, (3, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert (big.eval()(x, x) - small(x, x)).abs().max().item() < 1e-10
    opt = build_optimizer(big, OptimizerOptions.from_config(CFG), grown.get("param_overrides"))
    assert optimizer_param_names(opt) == grown["param_names"]
    opt.load_state_dict(grown["optimizer"])
    # target mode: the schedule position moves back from S_pre = 2 to round(2 / c)
    assert grown["iter_num"] - grown["lr_rewarmup"]["shift"] == int(round(2 / op.c))
