"""The growth operators, one module each, registered in OPERATORS (ops/base.py) when imported:

    width.py   "weights": dim, heads, FFN hidden size x2 (docs/growth.md §3)
    depth.py   "layers": n_layers x2 (§4)

Adding one is a new module here that calls base.register(GrowthOperator(...)) and one import
line at the end below; grow.py --doubling, train.py's grow_schedule and grow.py --plan then offer
it. The lines' order is the operators' order in --help, error lines and the planner's candidates.
"""
from tinylab.growth.ops.base import OPERATORS, GrowthOperator  # noqa: F401

# isort: off
from tinylab.growth.ops import width  # noqa: F401
from tinylab.growth.ops import depth  # noqa: F401
# isort: on
