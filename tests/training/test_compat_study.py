"""compat=original for the study's train.py (RobertKirk/tinystories-wrappers): the accumulation
that forwards one micro-batch k times and the warmup that starts at lr 0, each against the
original's code path re-implemented here (train.py:617-649 do_update and its loop, :401-414
get_lr), and configs/base91M.py with --compat=original end to end."""
import copy
import math
import os

import pytest
import torch
from conftest import REPO, run_main, tiny_model
from test_options import Batches, Sealed

from model import ModelArgs, Transformer
from tinylab.core.compat import differences_of
from tinylab.data.pretokenized import BatchLoader
from tinylab.schema import TRAIN
from tinylab.training.optim import lr_at
from tinylab.training.options import ScheduleOptions, TrainerOptions
from tinylab.training.setup import Run
from tinylab.training.trainer import Trainer

# the study keys of train.py and their original values, written out by hand
STUDY = {"same_batch_accumulation": True, "warmup_formula": "original", "eval_batch_sizes": "batch_size",
         "generation_prompt_split": "train"}


def original_get_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    """train.py:401-414 (with lr_scheduling and decay_lr on)."""
    if it < warmup_iters:
        return learning_rate * it / warmup_iters
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def original_loop(model, batches, iters, accum, lr_of, weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0):
    """The original's training loop (train.py:617-649, 664-683) on one process, fp32: fetch one
    batch, then per step k micro-steps over the same (x, y) with loss / k, each fetching a batch
    into X, Y that only the next step uses. The optimizer is llama2.c's configure_optimizers
    (decay on >= 2-D tensors); fused AdamW, the kernel the original used on CUDA, so that the
    comparison isolates the loop."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr_of(0), betas=betas, fused=True)
    X, Y = next(batches)  # fetch the very first batch

    def do_update(x, y):
        for micro_step in range(accum):
            model(x, y, return_logits=False)  # (the same model class: its fused loss path, as the Trainer's)
            loss = model.last_loss
            loss = loss / accum
            X, Y = next(batches)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return X, Y, loss

    for iter_num in range(iters):
        lr = lr_of(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        X, Y, loss = do_update(X, Y)
    return model


class Every:
    """Every `k`-th batch of `batches` (the ones a same-batch run with k micro-steps trains on)."""

    def __init__(self, batches, k):
        self.batches, self.k, self.first = batches, k, True

    def __next__(self):
        if not self.first:
            for _ in range(self.k - 1):
                next(self.batches)
        self.first = False
        return next(self.batches)


def trained(cfg, batches, model):
    """`model` after cfg["max_iters"] steps of the Trainer on `batches` (no evaluation)."""
    trainer = Trainer(TrainerOptions.from_config(cfg), Run.from_config(cfg), model, batches, lambda *a: {},
                      config=Sealed(cfg))
    assert trainer.fit() == "done"
    return trainer


def loop_cfg(tmp_path, **over):
    return {**TRAIN.defaults(), "out_dir": str(tmp_path / "run"), "device": "cpu", "dtype": "float32", "max_iters": 3,
            "eval_interval": 100, "export_bin": False, "max_seq_len": 16, "learning_rate": 3e-3, "warmup_iters": 2,
            "warmup_formula": "original", **over}


def test_same_batch_accumulation_is_the_original_loop_and_one_micro_step(tmp_path):
    model = tiny_model(max_seq_len=16).train()
    reference = copy.deepcopy(model)
    cfg = loop_cfg(tmp_path, gradient_accumulation_steps=4, same_batch_accumulation=True)
    ours = trained(cfg, Batches(model.params.vocab_size), model)

    def lr_of(it):
        return original_get_lr(it, 3e-3, 2, 3, 0.0)

    original_loop(reference, Batches(model.params.vocab_size), 3, 4, lr_of)
    for (name, p), q in zip(ours.raw_model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name  # bit for bit: the same arithmetic (x * 0.25 == x / 4 exactly)
    # the data position: step s trained on batch s*k; the checkpoint resumes at batch 3*4 = 12
    assert torch.load(os.path.join(cfg["out_dir"], "ckpt.pt"), weights_only=True)["loader"] == {"n": 12}

    # one micro-step on the batches the k=4 run trained on: the same steps up to one rounding (the
    # four quarter-gradients are summed in float32: 0.5 g + 0.25 g may round, and adding the last
    # quarter undoes that except at a tie; bit for bit in this run)
    one = tiny_model(max_seq_len=16).train()
    cfg1 = loop_cfg(tmp_path, out_dir=str(tmp_path / "k1"), gradient_accumulation_steps=1)
    one = trained(cfg1, Every(Batches(model.params.vocab_size), 4), one).raw_model
    for (name, p), q in zip(one.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    # the default, a fresh batch per micro-step, differs from both
    fresh = trained(loop_cfg(tmp_path, out_dir=str(tmp_path / "fresh"), gradient_accumulation_steps=4),
                    Batches(model.params.vocab_size), tiny_model(max_seq_len=16).train()).raw_model
    assert not torch.allclose(fresh.output.weight, reference.output.weight, atol=1e-4)


@pytest.mark.parametrize("over", [
    dict(warmup_iters=4, max_iters=20),
    dict(warmup_iters=10, max_iters=25, min_lr=1e-4),
    dict(warmup_iters=3, max_iters=30, lr_decay_iters=12, min_lr=5e-5),
    dict(warmup_iters=0, max_iters=8),
])
def test_original_warmup_is_the_originals_get_lr_at_every_iteration(over):
    cfg = {**TRAIN.defaults(), "learning_rate": 5e-4, "warmup_formula": "original", **over}
    schedule = ScheduleOptions.from_config(cfg)
    decay = cfg["lr_decay_iters"] or cfg["max_iters"]
    for it in range(cfg["max_iters"] + 2):
        assert lr_at(it, schedule) == original_get_lr(it, 5e-4, cfg["warmup_iters"], decay, cfg["min_lr"]), it
    assert lr_at(0, schedule) == 0.0 or cfg["warmup_iters"] == 0
    # ours (nanoGPT's) warms up from lr / (warmup + 1) at step 0, and is the same after the warmup
    fixed = ScheduleOptions.from_config({**cfg, "warmup_formula": "nanogpt"})
    for it in range(cfg["max_iters"] + 2):
        w = cfg["warmup_iters"]
        want = 5e-4 * (it + 1) / (w + 1) if it < w else original_get_lr(it, 5e-4, w, decay, cfg["min_lr"])
        assert lr_at(it, fixed) == want, it


def base91m(*more):
    return [os.path.join(REPO, "configs", "base91M.py"), "--wandb_run_name=run", *more]


def test_base91m_with_compat_original_takes_every_study_value():
    cfg = TRAIN.parse(base91m("--compat=original"))
    study = {d.key: d.original for d in differences_of("study", TRAIN.keys)}
    assert study == STUDY
    assert {k: cfg[k] for k in STUDY} == STUDY
    fixed = TRAIN.parse(base91m())
    assert {k: fixed[k] for k in STUDY} == {k: TRAIN.keys[k].default for k in STUDY}
    # the config's own values are untouched: the same config but for the study keys
    assert (cfg["gradient_accumulation_steps"], cfg["batch_size"], cfg["learning_rate"]) == (4, 128, 5e-4)
    assert {**cfg, "compat": "fixed"} == {**fixed, **STUDY}


def test_base91m_compat_original_trains_as_the_original_loop(lab_corpus, tmp_path):
    """configs/base91M.py, shrunk through overrides, with --compat=original (accumulation 4 from
    the config): three steps give the weights of the original loop on the same batches."""
    out = str(tmp_path / "run")
    shape = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=4, max_seq_len=32)
    argv = base91m("--compat=original", *[f"--{k}={v}" for k, v in shape.items()],
                   f"--data_cache_dir={lab_corpus.cache_dir}", "--vocab_size=1024", f"--out_dir={out}",
                   "--wandb_log=False", "--batch_size=4", "--max_iters=3", "--warmup_iters=2", "--eval_iters=1",
                   "--max_new_tokens=0", "--export_bin=False", "--device=cpu", "--dtype=float32")
    proc = run_main("train.py", argv, check=True)
    assert "compat=original (RobertKirk/tinystories-wrappers): " in proc.stderr
    assert all(f"{k}={v!r}" in proc.stderr for k, v in STUDY.items())
    saved = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert saved["config"]["gradient_accumulation_steps"] == 4 and saved["iter_num"] == 3

    torch.manual_seed(1337)  # train.py's seed: the model is built right after seeding
    reference = Transformer(ModelArgs(**shape, vocab_size=1024, multiple_of=64, dropout=0.0)).train()
    dataset = os.path.join(lab_corpus.cache_dir, "tok1024", saved["config"]["dataset_name"])
    batches = BatchLoader(dataset, "train", 4, 32, seed=1337)

    def lr_of(it):  # the config's learning rate and max_iters; min_lr 0 (train.py:113-115)
        return original_get_lr(it, 5e-4, 2, 3, 0.0)

    original_loop(reference, batches, 3, 4, lr_of)
    for name, q in reference.state_dict().items():
        assert torch.equal(saved["model"][name], q), name
