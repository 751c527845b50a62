"""Resuming with other optimizer settings: the checkpoint's optimizer state is mapped onto the new
optimizer by parameter name, so a run resumed (train.py init_from=resume_train) or restarted with
its optimizer state (finetune_t0.py --reset-progress) with another weight decay, betas or eps
continues with the config's settings (and a notice); a checkpoint whose optimizer state is not
this model's is still one error line that names the parameter, with nothing lost.

The AdamW step after a change of weight decay is checked against the update written out here;
checkpoints written before parameter groups were defined by role (groups by the decay's value)
are rebuilt by hand and still resume."""
import os
import shutil

import pytest
import torch
from conftest import make_t0_setup, run_main
from test_bad_input import assert_error, assert_nothing_lost, snapshot, train_argv

from tinylab import checkpoint as ckpt_lib
from tinylab.schema import FINETUNE_T0, TRAIN
from tinylab.trainer import Run, Trainer, init_model, training_state


# two layers: with weight_decay=0 the old grouping by value listed the parameters in model order,
# layer 0's norms before layer 1's matrices (one layer would hide that); 128 positions for T0 rows
SHAPE = dict(n_layers=2, max_seq_len=128)


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    """Finished 2-iteration train.py runs (read-only; copy one before resuming it): `decay` with
    weight_decay=0.1, `no_decay` with weight_decay=0, `adafactor` (weight_decay=0.1); `t0` is the
    T0 demo mixture (conftest.make_t0_setup)."""
    root = str(tmp_path_factory.mktemp("optim_runs"))
    out = {}
    for name, over in [("decay", {"weight_decay": 0.1}), ("no_decay", {"weight_decay": 0.0}),
                       ("adafactor", {"weight_decay": 0.1, "optimizer": "adafactor"})]:
        out[name] = os.path.join(root, name)
        proc = run_main("train.py", train_argv(tiny_corpus, out[name], **SHAPE, **over))
        assert proc.returncode == 0, proc.stderr
    out["mixture"], _ = make_t0_setup(os.path.join(root, "t0"))
    return out


def copy_run(runs, name, tmp_path):
    dst = str(tmp_path / name)
    shutil.copytree(runs[name], dst)
    return dst


def resume(tiny_corpus, out, **over):
    return run_main("train.py", train_argv(tiny_corpus, out, **SHAPE, init_from="resume_train", max_iters=4, **over))


def load(path):
    return torch.load(os.path.join(path, "ckpt.pt"), weights_only=True)


def state_by_name(ckpt):
    """{name: saved per-parameter state} of a checkpoint, through its param_names."""
    return {n: ckpt["optimizer"]["state"].get(i, {}) for i, n in enumerate(ckpt["param_names"])}


def groups_by_name(ckpt):
    """{name: its saved parameter group (without params)} of a checkpoint."""
    out = {}
    for g in ckpt["optimizer"]["param_groups"]:
        for i in g["params"]:
            out[ckpt["param_names"][i]] = {k: v for k, v in g.items() if k != "params"}
    return out


# ---------------------------------------------------------------------- works now

@pytest.mark.parametrize("start, new", [("decay", 0.0), ("no_decay", 0.1)])
def test_resume_train_with_another_weight_decay(runs, tiny_corpus, tmp_path, start, new):
    out = copy_run(runs, start, tmp_path)
    old = 0.1 if start == "decay" else 0.0
    proc = resume(tiny_corpus, out, weight_decay=new)
    assert proc.returncode == 0, proc.stderr
    assert f"notice: optimizer settings from the config replace the checkpoint's: weight_decay {old} -> {new}" \
        in proc.stdout
    ckpt = load(out)
    assert ckpt["iter_num"] == 4
    groups = groups_by_name(ckpt)
    for name, g in groups.items():
        matrix = ckpt["model"][name].dim() >= 2
        assert g["role"] == ("decay" if matrix else "no_decay"), name
        assert g["weight_decay"] == (new if matrix else 0.0), name
    # the moments went on from the checkpoint's: 2 steps before, 2 after
    assert all(float(st["step"]) == 4 for st in state_by_name(ckpt).values())


def test_resume_train_with_other_betas_and_eps(runs, tiny_corpus, tmp_path):
    out = copy_run(runs, "decay", tmp_path)
    proc = resume(tiny_corpus, out, beta1=0.8, beta2=0.99, adam_eps=1e-6)
    assert proc.returncode == 0, proc.stderr
    notice = [l for l in proc.stdout.splitlines() if l.startswith("notice: optimizer settings")]
    assert notice == ["notice: optimizer settings from the config replace the checkpoint's: "
                      "betas (0.9, 0.95) -> (0.8, 0.99); eps 1e-08 -> 1e-06"]
    groups = load(out)["optimizer"]["param_groups"]
    assert {g["role"] for g in groups} == {"decay", "no_decay"}
    assert all(tuple(g["betas"]) == (0.8, 0.99) and g["eps"] == 1e-6 for g in groups)


def test_resume_train_adafactor_with_another_weight_decay(runs, tiny_corpus, tmp_path):
    out = copy_run(runs, "adafactor", tmp_path)
    before = state_by_name(load(out))
    proc = resume(tiny_corpus, out, optimizer="adafactor", weight_decay=0.0)
    assert proc.returncode == 0, proc.stderr
    assert "replace the checkpoint's: weight_decay 0.1 -> 0.0" in proc.stdout
    ckpt = load(out)
    assert [(g["role"], g["weight_decay"]) for g in ckpt["optimizer"]["param_groups"]] == \
        [("decay", 0.0), ("no_decay", 0.0)]
    after = state_by_name(ckpt)
    assert before.keys() == after.keys() and all(after[n]["step"] == before[n]["step"] + 2 for n in before)


def test_finetune_t0_reset_progress_on_a_train_py_checkpoint(runs, tmp_path):
    """finetune_t0.py's weight_decay is 0, the train.py checkpoint's 0.1: the optimizer state is
    kept (by name) under the finetuning config's settings, and the run restarts at iteration 0."""
    base = runs["decay"]
    saved = load(base)
    out = str(tmp_path / "ft")
    argv = [f"--mixture={runs['mixture']}", f"--model_dir={base}", f"--out_dir={out}", "--batch_size=2",
            "--max_iters=2", "--eval_interval=2", "--eval_iters=1", "--rank_eval_examples=2", "--device=cpu",
            "--dtype=float32", "--lr_scheduling=False"]
    cfg = FINETUNE_T0.parse([*argv, "--reset-progress"])
    run = Run(cfg)
    model, ckpt = init_model(cfg, run)
    trainer = Trainer(cfg, run, model, iter([]), lambda *a: {}, training_state(cfg, ckpt, reset_progress=True))
    now = trainer.optimizer.state_dict()
    restored = {n: now["state"][i] for g in now["param_groups"] for i, n in zip(g["params"], g["param_names"])}
    for name, st in state_by_name(saved).items():
        assert all(torch.equal(v, restored[name][k]) for k, v in st.items()), name
    assert all(g["weight_decay"] == 0.0 for g in trainer.optimizer.param_groups) and trainer.iter_num == 0

    proc = run_main("finetune_t0.py", [*argv, "--reset-progress"])
    assert proc.returncode == 0, proc.stderr
    assert "replace the checkpoint's: weight_decay 0.1 -> 0.0" in proc.stdout
    after = load(out)
    assert after["iter_num"] == 2
    assert all(float(st["step"]) == 2 + 2 for st in state_by_name(after).values())  # kept, continued


def test_a_grown_checkpoint_resumes_with_another_weight_decay(runs, tiny_corpus, tmp_path):
    """Exact width growth writes per-parameter overrides (lr_scale, eps, weight_decay_scale): the
    grown checkpoint's groups are by role and overrides, and resuming with weight_decay=0 keeps
    every moment under its name."""
    grown = str(tmp_path / "grown")
    proc = run_main("grow.py", [f"--resume={runs['decay']}/ckpt.pt", f"--out_dir={grown}", "--doubling=weights",
                                "--mode=exact"])
    assert proc.returncode == 0, proc.stderr
    written = load(grown)
    assert {g["role"] for g in written["optimizer"]["param_groups"]} == {"decay", "no_decay"}
    before = state_by_name(written)
    proc = run_main("train.py", train_argv(tiny_corpus, grown, init_from="resume_train", weight_decay=0.0,
                                           max_iters=3, **SHAPE))
    assert proc.returncode == 0, proc.stderr
    assert "weight_decay" in proc.stdout.split("replace the checkpoint's:")[1].splitlines()[0]
    after = load(grown)
    assert all(g["weight_decay"] == 0.0 for g in after["optimizer"]["param_groups"])
    assert all(float(st["step"]) == float(before[n]["step"]) + 1 for n, st in state_by_name(after).items())


def adamw_reference(p, g, m, v, step, lr, wd, beta1, beta2, eps):
    """AdamW (Loshchilov & Hutter, torch's form) in float64: decoupled decay p -= lr*wd*p, then the
    Adam update from the moments m, v after `step` earlier steps, with bias correction."""
    p, g, m, v = (t.double() for t in (p, g, m, v))
    t = step + 1
    p = p - lr * wd * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    return p - lr * m_hat / (v_hat.sqrt() + eps)


@pytest.mark.parametrize("start, new", [("decay", 0.0), ("no_decay", 0.5)])
def test_first_step_after_resume_uses_the_new_weight_decay(runs, tiny_corpus, tmp_path, start, new):
    out = copy_run(runs, start, tmp_path)
    saved = load(out)
    old = saved["config"]["weight_decay"]
    lr = 1e-2  # large enough that decay 0.5 vs 0 changes the step far beyond fp32 rounding
    cfg = TRAIN.parse(train_argv(tiny_corpus, out, **SHAPE, init_from="resume_train", weight_decay=new,
                                 learning_rate=lr))
    run = Run(cfg)
    model, ckpt = init_model(cfg, run)
    trainer = Trainer(cfg, run, model, iter([]), lambda *a: {}, training_state(cfg, ckpt))
    torch.manual_seed(1)
    x = torch.randint(0, 8192, (2, 16))
    trainer.model(x, x.roll(-1, dims=1), return_logits=False)
    trainer.raw_model.last_loss.backward()
    params = dict(trainer.raw_model.named_parameters())
    names = ["layers.0.attention.wq.weight", "layers.0.attention_norm.weight"]
    grads = {n: params[n].grad.clone() for n in names}
    before = {n: params[n].detach().clone() for n in names}
    for g in trainer.optimizer.param_groups:
        g["lr"] = lr
    trainer.optimizer.step()
    moments = state_by_name(saved)
    for name in names:
        st = moments[name]
        assert torch.equal(before[name], saved["model"][name])
        wd = new if before[name].dim() >= 2 else 0.0  # norms are never decayed
        args = dict(step=int(st["step"]), lr=lr, beta1=cfg["beta1"], beta2=cfg["beta2"], eps=cfg["adam_eps"])
        want = adamw_reference(before[name], grads[name], st["exp_avg"], st["exp_avg_sq"], wd=wd, **args)
        got = params[name].detach().double()
        assert torch.allclose(got, want, rtol=0, atol=1e-7), (name, (got - want).abs().max())
        if before[name].dim() >= 2:  # the old decay would have given another step
            stale = adamw_reference(before[name], grads[name], st["exp_avg"], st["exp_avg_sq"], wd=old, **args)
            assert (got - stale).abs().max() > 1e-5, name


def old_layout(ckpt):
    """The checkpoint as it was written before groups were defined by role: parameters grouped by
    the value of their weight decay (so with weight_decay=0 one group in model order), no "role",
    param_names in the state-dict index order of those groups."""
    by_name, groups = state_by_name(ckpt), groups_by_name(ckpt)
    values = {}
    for name in ckpt["model"]:
        if name in by_name:
            values.setdefault(groups[name]["weight_decay"], []).append(name)
    names = [n for members in values.values() for n in members]
    index = {n: i for i, n in enumerate(names)}
    param_groups = []
    for members in values.values():
        g = {k: v for k, v in groups[members[0]].items() if k not in ("role", "param_names")}
        param_groups.append({**g, "param_names": members, "params": [index[n] for n in members]})
    optimizer = {"state": {index[n]: st for n, st in by_name.items() if st}, "param_groups": param_groups}
    return {**ckpt, "optimizer": optimizer, "param_names": names}


@pytest.mark.parametrize("new", [0.0, 0.1])
def test_a_checkpoint_in_the_old_layout_still_resumes(runs, tiny_corpus, tmp_path, new):
    """Built from a weight_decay=0 run: the old layout is one group in model order, the new one
    matrices then norms; the resumed run is the same as from the new-layout checkpoint."""
    new_layout, old = copy_run(runs, "no_decay", tmp_path), str(tmp_path / "old")
    shutil.copytree(new_layout, old)
    legacy = old_layout(load(old))
    assert len(legacy["optimizer"]["param_groups"]) == 1 and legacy["param_names"] != load(old)["param_names"]
    ckpt_lib.save_checkpoint(legacy, os.path.join(old, "ckpt.pt"))
    for out in (new_layout, old):
        proc = resume(tiny_corpus, out, weight_decay=new)
        assert proc.returncode == 0, proc.stderr
        assert ("weight_decay 0.0 -> 0.1" in proc.stdout) == (new == 0.1)
    a, b = load(new_layout), load(old)
    assert a["param_names"] == b["param_names"]  # written back in the new layout
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# ---------------------------------------------------------------------- one line when it cannot

def drop_parameter(ckpt, name):
    """The checkpoint without `name` in its optimizer state (param_names and the indices after it
    shifted, as a hand edit would leave a consistent state dict)."""
    names = [n for n in ckpt["param_names"] if n != name]
    by_name = state_by_name(ckpt)
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "param_names": [n for n in g["param_names"] if n != name],
               "params": [index[n] for n in g["param_names"] if n != name]} for g in ckpt["optimizer"]["param_groups"]]
    return {**ckpt, "param_names": names,
            "optimizer": {"state": {index[n]: by_name[n] for n in names}, "param_groups": groups}}


def add_parameter(ckpt, name):
    st = state_by_name(ckpt)["layers.0.attention.wq.weight"]
    i = len(ckpt["param_names"])
    groups = [dict(g) for g in ckpt["optimizer"]["param_groups"]]
    groups[-1] = {**groups[-1], "params": groups[-1]["params"] + [i], "param_names": groups[-1]["param_names"] + [name]}
    return {**ckpt, "param_names": ckpt["param_names"] + [name],
            "optimizer": {"state": {**ckpt["optimizer"]["state"], i: st}, "param_groups": groups}}


def reshape_moment(ckpt, name):
    i = ckpt["param_names"].index(name)
    state = dict(ckpt["optimizer"]["state"])
    state[i] = {**state[i], "exp_avg": state[i]["exp_avg"][:, :-1].clone()}
    return {**ckpt, "optimizer": {**ckpt["optimizer"], "state": state}}


EDITS = {
    "missing": (lambda c: drop_parameter(c, "layers.0.ffn_norm.weight"),
                "no state for layers.0.ffn_norm.weight"),
    "extra": (lambda c: add_parameter(c, "layers.7.attention.wq.weight"),
              "state for layers.7.attention.wq.weight, which this model does not have"),
    "shape": (lambda c: reshape_moment(c, "layers.0.attention.wq.weight"),
              "exp_avg of layers.0.attention.wq.weight has shape (16, 15), the parameter needs (16, 16)"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("how", ["resume_train", "reset_progress"])
def test_optimizer_state_of_another_model_is_one_error_line(runs, tiny_corpus, tmp_path, edit, how):
    change, fragment = EDITS[edit]
    run = copy_run(runs, "decay", tmp_path)
    ckpt_lib.save_checkpoint(change(load(run)), os.path.join(run, "ckpt.pt"))
    before = snapshot(tmp_path)
    if how == "resume_train":
        proc = resume(tiny_corpus, run, weight_decay=0.0)
    else:
        proc = run_main("finetune_t0.py", [f"--mixture={runs['mixture']}", f"--model_dir={run}",
                                           f"--out_dir={tmp_path / 'ft'}", "--batch_size=2", "--max_iters=2",
                                           "--device=cpu", "--dtype=float32", "--reset-progress"])
    assert_error(proc, 2, "optimizer state does not fit this model's parameters", fragment, "init_from=resume_model")
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)
