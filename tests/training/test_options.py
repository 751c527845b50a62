"""The Trainer's typed options (tinylab/training/options.py): each field comes from the key of its
name, every training key reaches an option (or is read elsewhere, named here), the loop never reads
the config record, and the save hooks run after each checkpoint is written."""
import ast
import os

import pytest
import torch
from conftest import tiny_model

from tinylab import REPO
from tinylab.core.config import Key
from tinylab.core.run_keys import ACTIVATION_CHECKPOINTING, COMPILE, START_KEYS, WANDB_KEYS, SystemOptions
from tinylab.schema import FINETUNE_T0, TRAIN
from tinylab.training.options import (
    ADAFACTOR_KEYS,
    LOOP_KEYS,
    MODEL_KEYS,
    OPTIMIZER_KEYS,
    ModelOptions,
    TrainerOptions,
)
from tinylab.training.setup import Run
from tinylab.training.trainer import Trainer

# where each key lands in TrainerOptions (attribute path), written out by hand
WHERE = {
    **{k: ("start", k) for k in ("out_dir", "model_dir", "init_from", "resume_ckpt", "overwrite")},
    **{k: (k,) for k in ("eval_interval", "checkpoint_interval", "log_interval", "eval_only", "always_save_checkpoint",
                         "save_best_model", "keep_best_checkpoint", "finegrained_log_iters", "finegrained_eval_interval",
                         "max_iters", "grad_clip", "gradient_accumulation_steps", "same_batch_accumulation",
                         "max_seq_len", "compile", "activation_checkpointing")},
    "optimizer": ("optimizer", "name"), "learning_rate": ("optimizer", "learning_rate"),
    "weight_decay": ("optimizer", "weight_decay"), "beta1": ("optimizer", "beta1"), "beta2": ("optimizer", "beta2"),
    "adam_eps": ("optimizer", "adam_eps"),
    "adam_bias_correction": ("optimizer", "adam_bias_correction"),
    **{f"adafactor_{k}": ("optimizer", "adafactor", k) for k in ("scale_parameter", "relative_step", "warmup_init",
                                                                 "clip_threshold", "decay_rate", "beta1", "eps1", "eps2")},
    **{k: ("optimizer", "schedule", k) for k in ("lr_scheduling", "decay_lr", "lr_schedule", "warmup_iters", "warmup_formula",
                                                 "min_lr", "lr_decay_iters")},
    **{f"wandb_{k}": ("wandb", k) for k in ("log", "project", "run_name", "entity", "tags", "mode")},
}
# the schedule's copies of keys that also sit elsewhere
ALSO = {"learning_rate": ("optimizer", "schedule", "learning_rate"), "max_iters": ("optimizer", "schedule", "max_iters")}
# training keys no option of the Trainer holds, and who reads them
ELSEWHERE = {"eval_iters": "the evaluators", "export_bin": "the drivers (the save hook)",
             "adafactor_preset": "presets.apply_optimizer_preset, before validation"}


class Recording(dict):
    """A config that remembers which keys were read."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def distinct(schema):
    """The schema's defaults with every key the Trainer reads set to a value of its type that no
    other key has, so a field wired to the wrong key shows."""
    cfg = schema.defaults()
    for i, name in enumerate(sorted(WHERE)):
        k = schema.keys[name]
        if k.choices is not None:
            cfg[name] = next((c for c in k.choices if c != k.default), k.default)
        elif k.type is bool:
            cfg[name] = not k.default
        elif k.type is int:
            cfg[name] = 1000 + i
        elif k.type is float:
            cfg[name] = 1e-3 * (i + 1)
        elif k.type is list:
            cfg[name] = [f"tag{i}"]
        else:
            cfg[name] = f"value{i}"
    return cfg


def at(obj, path):
    for part in path:
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("schema", [TRAIN, FINETUNE_T0], ids=["train", "finetune_t0"])
def test_every_field_comes_from_the_key_of_its_name(schema):
    cfg = Recording(distinct(schema))
    options = TrainerOptions.from_config(cfg)
    for name, path in {**WHERE, **ALSO}.items():
        assert at(options, path) == cfg[name], name
    assert cfg.read == set(WHERE)  # nothing else is read
    assert options.every_checkpoint == cfg["checkpoint_interval"]
    assert TrainerOptions.from_config({**cfg, "checkpoint_interval": 0}).every_checkpoint == cfg["eval_interval"]


def test_every_training_key_reaches_an_option_or_is_named():
    declared = {k.name for k in START_KEYS + LOOP_KEYS + OPTIMIZER_KEYS + ADAFACTOR_KEYS + WANDB_KEYS
                + [COMPILE, ACTIVATION_CHECKPOINTING]}
    assert declared - set(WHERE) == set(ELSEWHERE)
    assert all(isinstance(k, Key) for k in MODEL_KEYS)
    shape = ModelOptions.from_config(TRAIN.defaults())
    assert {f: getattr(shape, f) for f in shape.__dataclass_fields__} == {k.name: k.default for k in MODEL_KEYS}
    assert SystemOptions.from_config({**TRAIN.defaults(), "device": "cpu", "peak_flops": 5.0}) == SystemOptions(
        device="cpu", dtype="", parallelism="ddp", peak_flops=5.0)


def test_the_model_shape_rule_names_the_keys():
    from tinylab.core.errors import UserError
    for over, fragment in ((dict(dim=30, n_heads=4), "dim=30 is not divisible by n_heads=4"),
                           (dict(dim=36, n_heads=4), "head size dim / n_heads = 9 must be even"),
                           (dict(n_heads=6, n_kv_heads=4), "n_kv_heads=4 must divide n_heads=6")):
        with pytest.raises(UserError, match=fragment):
            ModelOptions.from_config({**TRAIN.defaults(), **over}).check()


# ---------------------------------------------------------------------- the loop and its hooks

class Sealed(dict):
    """The config record, which the loop may save but never read a key of."""

    def __getitem__(self, key):
        raise AssertionError(f"the loop read config key {key!r}")

    def get(self, key, default=None):
        raise AssertionError(f"the loop read config key {key!r}")


class Batches:
    """Seeded random token windows with a position, as a data loader has."""

    def __init__(self, vocab, rows=2, seq=16):
        self.n, self.vocab, self.rows, self.seq = 0, vocab, rows, seq

    def __next__(self):
        g = torch.Generator().manual_seed(self.n)
        self.n += 1
        x = torch.randint(0, self.vocab, (self.rows, self.seq + 1), generator=g)
        return x[:, :-1], x[:, 1:]

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


def test_loop_reads_only_its_options_and_calls_save_hooks_after_each_checkpoint(tmp_path):
    out = str(tmp_path / "run")
    cfg = {**TRAIN.defaults(), "out_dir": out, "device": "cpu", "dtype": "float32", "max_iters": 3, "eval_interval": 2,
           "keep_best_checkpoint": True, "gradient_accumulation_steps": 2, "warmup_iters": 1, "max_seq_len": 16}
    model = tiny_model(max_seq_len=16).train()
    losses = iter([3.0, 2.0, 1.0])  # every evaluation a new best

    def evaluate(m, it, generations):
        return {"loss/test": next(losses)}

    trainer = Trainer(TrainerOptions.from_config(cfg), Run.from_config(cfg), model, Batches(model.params.vocab_size),
                      evaluate, config=Sealed(cfg))
    seen = []

    def hook(path, m):
        saved = torch.load(path, weights_only=True)  # complete when the hook runs
        seen.append((os.path.basename(path), saved["iter_num"], m is trainer.raw_model))

    trainer.save_hooks["probe"] = hook
    assert trainer.fit() == "done"
    # evaluations at 0, 2 and 3 (the end); ckpt_best.pt at each new best after 0, then ckpt.pt
    assert seen == [("ckpt_best.pt", 2, True), ("ckpt.pt", 2, True), ("ckpt_best.pt", 3, True), ("ckpt.pt", 3, True)]
    saved = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert saved["config"] == cfg and saved["iter_num"] == 3 and saved["loader"] == {"n": 6}


def test_the_loop_knows_no_file_format_and_no_schema():
    """trainer.py imports no llama2.c / HF format (export_bin is a save hook), and no library
    module of core/ or training/ imports tinylab.schema (the entry scripts assemble it)."""
    def imports(rel):
        tree = ast.parse(open(os.path.join(REPO, rel), encoding="utf-8").read())
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}

    assert not {m for m in imports("tinylab/training/trainer.py") if m.startswith("tinylab.interop")}
    assert "tinylab.interop.llama2c" in imports("tinylab/training/export_hook.py")  # the check can fail
    for folder in ("core", "training"):
        for name in os.listdir(os.path.join(REPO, "tinylab", folder)):
            if name.endswith(".py"):
                assert "tinylab.schema" not in imports(f"tinylab/{folder}/{name}"), name
