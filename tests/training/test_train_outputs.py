"""What train.py writes beside the loop, as the study's train.py did: model.bin (llama2.c v0)
beside every checkpoint (export_bin), ckpt.pt only at a new best evaluation (save_best_model,
checked against the original's checkpoint_training re-implemented here), ckpt_best.pt
(keep_best_checkpoint), and resume_train continuing the same wandb run; the real wandb offline
never stops training (one pair of launches shared by both wandb tests)."""
import os
import sys
import types

import pytest
import torch
from conftest import assert_one_line_error, records, run_cli, run_main, train_losses

from tinylab.interop.llama2c import read_bin

VOCAB = 1024


@pytest.fixture(scope="module")
def corpus(lab_corpus):
    return lab_corpus.cache_dir


def args(corpus, out, **over):
    cfg = dict(data_cache_dir=corpus, vocab_size=VOCAB, out_dir=out, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
               multiple_of=16, max_seq_len=64, batch_size=4, gradient_accumulation_steps=1, learning_rate=3e-3,
               warmup_iters=0, max_iters=8, eval_interval=2, eval_iters=2, log_interval=1, max_new_tokens=0,
               device="cpu", dtype="float32")
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()]


def train(argv, **kw):
    return run_main("train.py", argv, **kw)


def saved_iters(stdout, name="ckpt.pt"):
    return [int(line.rsplit("(iter ", 1)[1].rstrip(")")) for line in stdout.splitlines()
            if line.startswith("saved checkpoint") and line.split(" (iter")[0].endswith(name)]


@pytest.mark.slow
def test_export_bin_beside_every_checkpoint(corpus, tmp_path):
    out = str(tmp_path / "run")
    proc = train(args(corpus, out, keep_best_checkpoint=True), check=True)
    assert proc.stdout.count("model.bin (llama2.c v0") == len(saved_iters(proc.stdout)) == 4
    assert proc.stdout.count("model_best.bin (llama2.c v0") == len(saved_iters(proc.stdout, "ckpt_best.pt")) > 0
    # each .bin is what export.py --version=0 writes for its checkpoint, byte for byte
    for ckpt, bin_ in (("ckpt.pt", "model.bin"), ("ckpt_best.pt", "model_best.bin")):
        ref = str(tmp_path / f"ref_{bin_}")
        run_main("export.py", [ref, "--version=0", f"--checkpoint={os.path.join(out, ckpt)}"], check=True)
        assert open(ref, "rb").read() == open(os.path.join(out, bin_), "rb").read(), bin_
    _, weights = read_bin(os.path.join(out, "model.bin"))
    state = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["model"]
    assert all(torch.equal(w, state[k]) for k, w in weights.items())
    assert not [f for f in os.listdir(out) if f.startswith(".tmp")]  # written atomically, nothing left over
    off = str(tmp_path / "off")
    train(args(corpus, off, max_iters=2, export_bin=False), check=True)
    assert not [f for f in os.listdir(off) if f.endswith(".bin")]


def original_saves(evals, checkpoint_interval, max_iters, save_best_model=True):
    """The iterations at which the study's train.py writes ckpt.pt, its loop and checkpoint_training
    re-implemented; `evals` = {iteration: loss/test}. One change: its checkpoint_training assigned
    best_val_loss to its own argument, so the best was never remembered and every checkpoint was
    written; here it is remembered (`nonlocal`), which is what save_best_model was for."""
    best_val_loss, saved = 1e9, []

    def checkpoint_training(iter_num, stats, force=False):
        nonlocal best_val_loss
        if force or (stats["loss/test"] < best_val_loss or not save_best_model):
            best_val_loss = stats["loss/test"]
            if iter_num > 0:
                saved.append(iter_num)

    iter_num = 0
    while True:
        if iter_num % checkpoint_interval == 0:
            checkpoint_training(iter_num, {"loss/test": evals[iter_num]})
        iter_num += 1
        if iter_num >= max_iters:
            break
    checkpoint_training(iter_num, {"loss/test": evals[iter_num]}, force=True)
    return saved


@pytest.mark.slow
def test_save_best_model_saves_only_new_bests_as_the_original(corpus, tmp_path):
    # a high learning rate: loss/test goes down and up again, so some checkpoints are not new bests
    out = str(tmp_path / "run")
    proc = train(args(corpus, out, max_iters=24, learning_rate=0.08, save_best_model=True, export_bin=False), check=True)
    evals = {r["iter"]: r["loss/test"] for r in records(out, "eval")}
    expected = original_saves(evals, 2, 24)
    assert saved_iters(proc.stdout) == expected
    assert 1 < len(expected) < 12  # neither every checkpoint nor only the last: the rule was exercised
    # the default writes every checkpoint
    proc = train(args(corpus, str(tmp_path / "default"), max_iters=6, export_bin=False), check=True)
    assert saved_iters(proc.stdout) == [2, 4, 6] == original_saves({0: 9, 2: 9, 4: 9, 6: 9}, 2, 6, False)
    bad = args(corpus, str(tmp_path / "bad"), save_best_model=True, checkpoint_interval=3)
    assert_one_line_error(train(bad), "checkpoint_interval=3 must be a multiple of eval_interval=2")
    assert not os.path.exists(tmp_path / "bad")


def test_keep_best_checkpoint_holds_the_best_evaluation(corpus, tmp_path):
    out = str(tmp_path / "run")
    proc = train(args(corpus, out, max_iters=8, learning_rate=0.08, lr_scheduling=False, keep_best_checkpoint=True,
                      export_bin=False), check=True)
    evals = {r["iter"]: r["loss/test"] for r in records(out, "eval")}
    news = [it for it in evals if it > 0 and evals[it] < min(v for i, v in evals.items() if i < it)]
    assert saved_iters(proc.stdout, "ckpt_best.pt") == news  # rewritten at each new best
    best = torch.load(os.path.join(out, "ckpt_best.pt"), weights_only=True)
    assert best["iter_num"] == min(evals, key=evals.get) != 8  # the best one, not the last one
    assert best["best_val_loss"] == pytest.approx(min(evals.values()))


class FakeWandb(types.SimpleNamespace):
    """wandb.init / log / finish, recorded; every run it starts gets the id `next_id`."""

    def __init__(self, next_id):
        super().__init__(inits=[], next_id=next_id)
        self.log = lambda data, step=None: None
        self.finish = lambda: None

    def init(self, **kw):
        self.inits.append(kw)
        return types.SimpleNamespace(id=kw.get("id") or self.next_id)


@pytest.mark.slow
def test_resume_train_continues_the_wandb_run(corpus, tmp_path, monkeypatch):
    fake = FakeWandb("run-abc123")
    monkeypatch.setitem(sys.modules, "wandb", fake)
    out = str(tmp_path / "run")
    train(args(corpus, out, max_iters=2, wandb_log=True, export_bin=False), check=True)
    assert "id" not in fake.inits[0] and "resume" not in fake.inits[0]
    assert torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["wandb_run_id"] == "run-abc123"
    fake.next_id = "another"
    train(args(corpus, out, max_iters=4, wandb_log=True, export_bin=False, init_from="resume_train"), check=True)
    assert (fake.inits[1]["id"], fake.inits[1]["resume"]) == ("run-abc123", "allow")
    assert torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["wandb_run_id"] == "run-abc123"
    # a resume_ckpt into a new folder (grow.py's doubled checkpoint) is a new run: a new wandb run
    train(args(corpus, str(tmp_path / "new"), max_iters=6, wandb_log=True, export_bin=False, init_from="resume_train",
               resume_ckpt=os.path.join(out, "ckpt.pt")), check=True)
    assert "id" not in fake.inits[2]


@pytest.fixture(scope="module")
def offline_wandb_run(corpus, tmp_path_factory):
    """The real wandb, offline, in subprocesses of their own (wandb keeps process-wide state): a
    3-iteration run (keep_best_checkpoint on), then resume_train to 5. The launches are shared by
    the two tests below; what the first run left is noted before the second starts."""
    root = tmp_path_factory.mktemp("offline_wandb")
    out = str(root / "run")
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(root)}  # wandb's files must still land in the run folder
    seen = {"out": out}
    for max_iters, init in ((3, "scratch"), (5, "resume_train")):
        proc = run_cli(["train.py", *args(corpus, out, max_iters=max_iters, wandb_log=True, wandb_run_name="t",
                                          keep_best_checkpoint=True, export_bin=False, init_from=init)], env=env)
        seen[init] = proc
        if init == "scratch" and proc.returncode == 0:
            seen["first_wandb_dirs"] = os.listdir(os.path.join(out, "wandb"))
            seen["first_best"] = os.path.exists(os.path.join(out, "ckpt_best.pt"))
            seen["first_iters"] = sorted(train_losses(out))
    return seen


@pytest.mark.slow
def test_wandb_offline_never_stops_training(offline_wandb_run):
    proc = offline_wandb_run["scratch"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = offline_wandb_run["first_wandb_dirs"]  # wandb files live in the run folder
    assert any(d.startswith("offline-run") for d in runs), runs
    assert offline_wandb_run["first_best"]
    assert offline_wandb_run["first_iters"] == [0, 1, 2]


@pytest.mark.slow
def test_resume_train_continues_the_offline_wandb_run(offline_wandb_run):
    out = offline_wandb_run["out"]
    for init in ("scratch", "resume_train"):
        assert offline_wandb_run[init].returncode == 0, offline_wandb_run[init].stderr[-2000:]
    run_id = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["wandb_run_id"]
    runs = sorted(d for d in os.listdir(os.path.join(out, "wandb")) if d.startswith("offline-run"))
    assert len(runs) == 2 and all(d.endswith("-" + run_id) for d in runs), (run_id, runs)
