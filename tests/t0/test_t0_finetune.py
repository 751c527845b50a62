"""finetune_t0.py end to end (in process, a tiny random base model on a small built-in multitask
set): metrics per validation group and rank accuracy, the data report, fixed validation rows,
the variants (prefix-LM, example normalisation, Adafactor t0, row mixing), presets, demo data
and the bad-input list (one-line errors)."""
import json
import os

import pytest
import torch
from conftest import TOK8192, assert_one_line_error, read_metrics, run_main, t0_args, train_losses

import finetune_t0
from tinylab.core import checkpoint as ckpt_lib
from tinylab.core.errors import UserError
from tinylab.data.tokenizer import Tokenizer
from tinylab.schema import FINETUNE_T0, prepare_t0
from tinylab.t0.encode import ExampleEncoder
from tinylab.t0.finetune import T0Data, T0Evaluator
from tinylab.t0.mixture import load_mixture
from tinylab.training.setup import Run


@pytest.fixture(scope="module")
def setup(t0_setup):
    return t0_setup


@pytest.mark.slow
def test_finetune_logs_groups_rank_accuracy_and_report(setup, tmp_path):
    mixture, base = setup
    out = str(tmp_path / "ft")
    finetune_t0.main(t0_args(mixture, base, out, max_iters=8, eval_interval=4))
    rows = read_metrics(out)
    assert sorted(train_losses(out)) == list(range(8))
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["iter"] for r in evals] == [0, 4, 8]
    groups = ["hero", "object", "ending", "dialogue", "addition", "friend", "mood", "speech"]
    for r in evals:
        for g in groups:
            assert r[f"loss/valid/{g}"] > 0 and 0.0 <= r[f"rank_acc/{g}"] <= 1.0
        assert r["loss/valid"] == pytest.approx(sum(r[f"loss/valid/{g}"] for g in groups) / len(groups))
        assert {"rank_acc_median", "rank_acc_median/held_out", "rank_acc_median/seen"} <= set(r)
    assert evals[-1]["loss/valid"] < evals[0]["loss/valid"]  # it learns
    assert 0.2 < evals[-1]["fill_rate/train"] <= 1.0
    data = next(r for r in rows if r["kind"] == "data")["data"]
    assert data["held_out"] == ["friend", "mood", "speech"]
    assert data["sources"]["train"]["hero"]["examples"] == 40 and data["sources"]["valid"]["hero"]["rows"] == 10
    report = json.load(open(os.path.join(out, "data_report.json")))
    assert report["sources"] == data["sources"] and 0 < report["fill_rate_first_256_rows"] <= 1
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["iter_num"] == 8 and ckpt["config"]["max_seq_len"] == 128  # the base model's
    assert os.path.isabs(ckpt["config"]["tokenizer_model"]) and ckpt["loader"]["stream"]["rows"] > 0


@pytest.mark.slow
def test_validation_rows_are_fixed_and_groups_separate(setup):
    mixture, base = setup
    cfg = FINETUNE_T0.parse(t0_args(mixture, base, "unused", max_seq_len=128))
    enc = ExampleEncoder(Tokenizer(TOK8192))
    data = T0Data(*load_mixture(mixture), enc, 129, log=lambda *a: None)
    model = ckpt_lib.model_from_checkpoint(ckpt_lib.load_checkpoint(base)).eval()
    ev = T0Evaluator(cfg, Run.from_config(cfg), data, enc, data.stream(cfg))
    assert ev.groups[0]["members"][0]["arrays"][0].shape == (4, 129)  # eval_iters * batch_size rows
    with torch.no_grad():
        a, b = ev(model, 0, False), ev(model, 1, False)
        model.layers[0].attention.wq.weight.mul_(1.5)
        c = ev(model, 2, False)
    assert a == b  # the same rows and examples at every evaluation
    assert c["loss/valid/hero"] != a["loss/valid/hero"] and c["loss/valid/mood"] != a["loss/valid/mood"]
    assert len({a[f"loss/valid/{g}"] for g in ("hero", "mood", "addition")}) == 3  # each group on its own rows


@pytest.mark.slow
def test_variants_prefixlm_example_norm_adafactor_row_mixing(setup, tmp_path):
    mixture, base = setup
    out = str(tmp_path / "var")
    finetune_t0.main(t0_args(mixture, base, out, prefixlm=True, loss_normalization="example", adafactor_preset="t0",
                             mixing="row", max_iters=6, eval_interval=3, max_seq_len=100))
    evals = [r for r in read_metrics(out) if r["kind"] == "eval"]
    assert evals[-1]["loss/valid"] < evals[0]["loss/valid"]
    # Adafactor's effective step sizes are logged on every log step (spec: a few tensors + mean)
    train_rows = [r for r in read_metrics(out) if r["kind"] == "train"]
    assert all(r["adafactor_alpha/mean"] > 0 and "adafactor_alpha/layers.0.attention.wq.weight" in r for r in train_rows)
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    # the preset's settings, except what the user set (learning_rate)
    assert ckpt["optimizer_name"] == "adafactor" and ckpt["config"]["grad_clip"] == 0.0
    assert ckpt["config"]["learning_rate"] == 3e-3 and ckpt["config"]["lr_scheduling"] is False
    assert ckpt["config"]["max_seq_len"] == 100 and ckpt["model_args"]["max_seq_len"] == 100


@pytest.mark.slow
def test_reset_progress_keeps_the_optimizer_and_restarts_the_schedule(setup, tmp_path):
    """reset_progress=True (Megatron's --reset-progress without --no-load-optim) on a finetuned
    checkpoint: the Trainer starts with exactly the checkpoint's optimizer state (a plain
    resume_model starts with none) at iteration 0; the run's LRs are the fresh schedule's from 0
    and AdamW's step counts continue from the checkpoint's."""
    from tinylab.training.optim import lr_at
    from tinylab.training.options import ScheduleOptions, TrainerOptions
    from tinylab.training.setup import init_model, training_state
    from tinylab.training.trainer import Trainer
    mixture, base = setup
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    common = dict(rank_eval_examples=0, eval_interval=100, lr_scheduling=True, warmup_iters=2, lr_decay_iters=6,
                  min_lr=1e-4)
    finetune_t0.main(t0_args(mixture, base, first, max_iters=3, **common))
    saved = torch.load(os.path.join(first, "ckpt.pt"), weights_only=True)
    assert saved["iter_num"] == 3 and saved["optimizer"]["state"]

    cfg = FINETUNE_T0.parse(t0_args(mixture, first, str(tmp_path / "unused"), reset_progress=True, max_iters=4,
                                    **common))
    run = Run.from_config(cfg)
    model, ckpt = init_model(cfg, run)
    options = TrainerOptions.from_config(cfg)
    trainer = Trainer(options, run, model, iter([]), lambda *a: {}, training_state(cfg, ckpt, reset_progress=True),
                      config=cfg)
    state = trainer.optimizer.state_dict()["state"]
    assert state.keys() == saved["optimizer"]["state"].keys()
    for k, st in saved["optimizer"]["state"].items():
        assert st.keys() == state[k].keys() and all(torch.equal(v, state[k][n]) for n, v in st.items()), k
    assert (trainer.iter_num, trainer.tokens_seen, trainer.best_val_loss, trainer.lr_rewarmup) == (0, 0, 1e9, None)
    fresh = Trainer(options, run, model, iter([]), lambda *a: {}, training_state(cfg, ckpt), config=cfg)
    assert not fresh.optimizer.state_dict()["state"]

    finetune_t0.main(t0_args(mixture, first, second, reset_progress=True, max_iters=4, **common))
    train = [r for r in read_metrics(second) if r["kind"] == "train"]
    assert [r["iter"] for r in train] == [0, 1, 2, 3]
    assert [r["lr"] for r in train] == [lr_at(it, ScheduleOptions.from_config(cfg)) for it in range(4)]  # from its start
    assert train[0]["lr"] == pytest.approx(3e-3 / 3)  # warmup step 1 of 2 again (the first run's was at 3)
    after = torch.load(os.path.join(second, "ckpt.pt"), weights_only=True)
    assert after["iter_num"] == 4 and after["loader"]["stream"]["rows"] == 4 * 8  # the data from its start too
    assert all(float(st["step"]) == 3 + 4 for st in after["optimizer"]["state"].values())  # kept, continued

    # the rules: resume_model only; a checkpoint without optimizer state or of another optimizer
    with pytest.raises(UserError, match="reset_progress=True .* needs init_from=resume_model"):
        FINETUNE_T0.parse(t0_args(mixture, first, second, reset_progress=True, init_from="resume_train"))
    from tinylab.training.setup import progress_reset
    no_optimizer = FINETUNE_T0.parse(t0_args(mixture, base, second, reset_progress=True))
    with pytest.raises(UserError, match="which has none"):
        progress_reset(no_optimizer, ckpt_lib.load_checkpoint(os.path.join(base, "ckpt.pt")))
    out = str(tmp_path / "bad")
    with pytest.raises(UserError, match="config says optimizer=adafactor"):
        finetune_t0.main(t0_args(mixture, first, out, reset_progress=True, optimizer="adafactor", **common))
    assert not os.path.exists(os.path.join(out, "config.json"))


def test_presets_fill_finetuning_keys_unless_set():
    cfg = prepare_t0({**FINETUNE_T0.defaults(), "adafactor_preset": "bloomz_adam"})
    assert (cfg["loss_normalization"], cfg["learning_rate"], cfg["weight_decay"]) == ("example", 2e-5, 1e-4)
    cfg = prepare_t0({**FINETUNE_T0.defaults(), "adafactor_preset": "bloomz_adam",
                                     "loss_normalization": "token_microbatch"})
    assert cfg["loss_normalization"] == "token_microbatch"


@pytest.mark.slow
def test_make_demo_data(tmp_path):
    finetune_t0.main([f"--make_demo_data={tmp_path / 'demo'}"])
    mixture = json.load(open(tmp_path / "demo" / "mixture.json"))
    assert [s["name"] for s in mixture["train"]] == ["hero", "object", "ending", "dialogue", "addition"]
    assert [s["name"] for s in mixture["valid"]] == [s["name"] for s in mixture["train"]] + ["friend", "mood", "speech"]
    for s in mixture["train"] + mixture["valid"]:
        rows = [json.loads(l) for l in open(tmp_path / "demo" / s["path"])]
        assert len(rows) > 100 and all(r["targets"] in r["answer_choices"] for r in rows)
        if s["name"] in ("ending", "dialogue", "mood", "speech"):  # balanced answers
            first = sum(r["targets"] == r["answer_choices"][0] for r in rows)
            assert abs(first / len(rows) - 0.5) < 0.05, (s["name"], first, len(rows))


def bad_mixture(tmp_path, train_entry, valid_entry=None):
    path = tmp_path / f"bad{len(list(tmp_path.glob('bad*.json')))}.json"
    path.write_text(json.dumps({"train": [train_entry], "valid": [valid_entry] if valid_entry else []}))
    return str(path)


def test_bad_input_list(setup, tmp_path):
    mixture, base = setup
    demo = os.path.dirname(mixture)
    hero = os.path.join(demo, "hero_train.jsonl")
    cases = [
        (t0_args(str(tmp_path / "nope.json"), base, "o"), "mixture file"),
        (t0_args(bad_mixture(tmp_path, {"name": "h", "path": hero, "weight": 0}), base, "o"), "field 'weight'"),
        (t0_args(bad_mixture(tmp_path, {"name": "h", "path": hero, "weight": 1}, {"name": "v", "path": hero}), base, "o"),
         "overlaps training"),
        (t0_args(mixture, base, "o", max_seq_len=20), "shorter than the shortest example"),
        (t0_args(mixture, base, "o", max_seq_len=1000), "exceeds the base model's 128"),
        (t0_args(mixture, str(tmp_path / "nobase"), "o"), "no checkpoint"),
        (t0_args(mixture, base, "o", loss_normalization="tokens"), "loss_normalization"),
    ]
    for argv, fragment in cases:
        with pytest.raises(UserError, match=fragment):
            finetune_t0.main(argv)
    # a copy of training examples under another file name is found by hashing inputs + targets
    copy = tmp_path / "copy.jsonl"
    copy.write_text(open(hero).read().splitlines()[3] + "\n")
    with pytest.raises(UserError, match="shares 1 of 1 examples"):
        finetune_t0.main(t0_args(bad_mixture(tmp_path, {"name": "h", "path": hero}, {"name": "v", "path": str(copy)}), base, "o"))
    nofields = tmp_path / "nofields.jsonl"
    nofields.write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(UserError, match="no string fields 'inputs' and 'targets'"):
        finetune_t0.main(t0_args(bad_mixture(tmp_path, {"name": "n", "path": str(nofields)}), base, "o"))


def test_cli_errors_are_one_line(setup, tmp_path):
    mixture, base = setup
    hub = bad_mixture(tmp_path, {"name": "copa", "hf": "bigscience/P3", "config": "copa_best_option"})
    # conftest keeps the hub offline (HF_DATASETS_OFFLINE=1): a clear line, no network, no retries
    assert_one_line_error(run_main("finetune_t0.py", t0_args(hub, base, str(tmp_path / "o"))),
                          "hub source 'copa'", "offline")


@pytest.mark.slow
def test_pretrain_text_group_tracks_forgetting(setup, tiny_corpus, tmp_path):
    """pretrain_text: the ordinary LM loss on a pretokenized dataset's test shard, logged as
    loss/valid/pretrain_text beside the task groups and kept out of their mean; at iteration 0 it
    equals the base model's loss on the same loader windows, computed here directly."""
    from tinylab.data.pretokenized import BatchLoader
    mixture, base = setup
    cache, folder = tiny_corpus.cache_dir, tiny_corpus.dataset_dir  # tok8192/pretrain-all
    out = str(tmp_path / "ft")
    finetune_t0.main(t0_args(mixture, base, out, max_iters=4, eval_interval=4, eval_iters=2, pretrain_text=folder))
    evals = [r for r in read_metrics(out) if r["kind"] == "eval"]
    assert [r["iter"] for r in evals] == [0, 4]
    groups = [k for k in evals[0] if k.startswith("loss/valid/") and k != "loss/valid/pretrain_text"]
    assert evals[0]["loss/valid"] == pytest.approx(sum(evals[0][k] for k in groups) / len(groups))
    model = ckpt_lib.model_from_checkpoint(ckpt_lib.load_checkpoint(base)).eval()
    batches = BatchLoader(folder, "test", 4, 128, seed=1337)
    with torch.no_grad():
        expected = []
        for _ in range(2):
            x, y = next(batches)
            model(x, y)
            expected.append(model.last_loss.item())
    assert evals[0]["loss/valid/pretrain_text"] == pytest.approx(sum(expected) / 2, rel=1e-5)
    assert evals[1]["loss/valid/pretrain_text"] != evals[0]["loss/valid/pretrain_text"]
    # not a dataset folder, or one made with another tokenizer: one-line errors before training
    with pytest.raises(UserError, match="not a pretokenized dataset folder"):
        finetune_t0.main(t0_args(mixture, base, str(tmp_path / "x"), pretrain_text=str(tmp_path)))
    with pytest.raises(UserError, match="not found"):
        finetune_t0.main(t0_args(mixture, base, str(tmp_path / "x"), pretrain_text=os.path.join(cache, "tok8192", "nope")))
