"""train.py's grow_schedule: which operator grows when, checked before the run starts.

    grow_schedule="2000:weights,6000:layers"   grow after those iterations
    grow_schedule="auto:weights,layers"        grow when the slope rule fires (rule.py), these
                                               operators in turn ("auto" = one width growth)

check_growth is the cross-key rule schema.py lists for train.py: a mistake in any grow_* key, or a
growth step the run never reaches, stops the run before training.
"""
from tinylab.core.errors import UserError
from tinylab.growth.ops import OPERATORS
from tinylab.growth.ops.width import WIDTH
from tinylab.growth.options import GrowthOptions
from tinylab.growth.state import target_schedule


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
            forms = " or ".join(f"ITER:{name}" for name in OPERATORS.names())
            raise UserError(f"grow_schedule entry '{entry}' is not {forms}")
        it = int(it)
        if it < 1 or it in schedule:  # (one past the run's end is simply never reached)
            raise UserError(f"grow_schedule iteration {it} must be >= 1 and appear once")
        schedule[it] = doubling.strip()
        GrowthOptions.from_config(cfg, schedule[it], seed=0)
    check_optimizer(cfg)
    if cfg["grow_mode"] == "exact" and cfg["dropout"] > 0:
        raise UserError("grow_mode=exact needs dropout=0 (dropout masks differ between the halves)")
    return schedule


def parse_auto_growth(cfg):
    """The operators of grow_schedule="auto" / "auto:weights,layers" (grow by the paper's slope
    rule when it fires, these operators in turn; bare "auto" is one width growth), or None."""
    text = cfg["grow_schedule"].strip()
    if not text.startswith("auto"):
        return None
    head, sep, ops = text.partition(":")
    names = OPERATORS.names()
    if head != "auto":
        raise UserError(f"grow_schedule={text!r}: write auto or auto:OP[,OP...] (OP {' or '.join(names)})")
    ops = [o.strip() for o in ops.split(",")] if sep else [WIDTH.name]
    if "" in ops:  # "auto:" or "auto:weights,": an operator left out is a mistake, not bare auto's default
        raise UserError(f"grow_schedule={text!r} names {'no operator' if not any(ops) else 'an empty operator'} "
                        f"after auto: (write auto:{','.join(names)}, or bare auto for one {WIDTH.setting} growth)")
    for op in ops:
        GrowthOptions.from_config(cfg, op, seed=0)
    check_optimizer(cfg)
    if cfg["grow_mode"] != "target":
        raise UserError("grow_schedule=auto grows where the paper's rule says, in its target mode: use grow_mode=target")
    return ops


def check_optimizer(cfg):
    if cfg["optimizer"] != "adamw":
        raise UserError(f"grow_schedule needs optimizer=adamw (growth maps AdamW state only), not {cfg['optimizer']}")


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


def check_growth(cfg):
    """train.py's rule for the grow_* keys (schema.TRAIN lists it)."""
    schedule = parse_grow_schedule(cfg)
    parse_auto_growth(cfg)
    # a resumed run may carry schedule shifts of its own (a grow.py checkpoint): checked from 0 only
    late = None if cfg["init_from"] in ("resume_train", "resume") else unreachable_growth(cfg, schedule)
    if late:
        it, end = late
        beyond = (f"max_iters={cfg['max_iters']}" if end == cfg["max_iters"] else
                  f"the run's end at iteration {end} (max_iters={cfg['max_iters']} + {end - cfg['max_iters']} from "
                  f"the earlier growths' schedule shifts)")
        raise UserError(f"grow_schedule step {it} is beyond {beyond}: the run stops before it and would never grow "
                        f"there; raise max_iters or move the step")
