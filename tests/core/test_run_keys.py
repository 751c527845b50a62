"""core/run_keys.py: where a run starts (StartOptions: resume in place or into a new folder, the
checkpoint it reads, one-line errors) and the process options a Run is built from."""
import os

import pytest
import torch

from tinylab.core.errors import UserError
from tinylab.core.run_keys import StartOptions, SystemOptions, WandbOptions
from tinylab.schema import FINETUNE_T0, TRAIN


def start(**over):
    return StartOptions.from_config({**TRAIN.defaults(), **over})


def test_resume_in_place_or_into_a_new_folder(tmp_path):
    out = str(tmp_path / "run")
    own = os.path.join(out, "ckpt.pt")
    assert not start(out_dir=out).resumes and not start(out_dir=out).in_place
    assert not start(out_dir=out, init_from="resume_model", model_dir=out).in_place
    for init_from in ("resume_train", "resume"):  # llama2.c's name too
        assert start(out_dir=out, init_from=init_from).in_place
    assert start(out_dir=out, init_from="resume_train", resume_ckpt=own).in_place  # its own ckpt.pt, spelled out
    other = str(tmp_path / "small" / "ckpt.pt.doubled_weights")
    assert not start(out_dir=out, init_from="resume_train", resume_ckpt=other).in_place  # grow.py's: a new run


def test_the_checkpoint_a_start_reads(tmp_path):
    out, base = tmp_path / "run", tmp_path / "base"
    for d in (out, base):
        d.mkdir()
        torch.save({}, d / "ckpt.pt")
    grown = tmp_path / "grown.pt"
    torch.save({}, grown)
    assert start(out_dir=str(out), init_from="resume_train").checkpoint_path() == str(out / "ckpt.pt")
    assert start(init_from="resume_model", model_dir=str(base)).checkpoint_path() == str(base / "ckpt.pt")
    assert start(init_from="resume_model", model_dir=str(grown)).checkpoint_path() == str(grown)  # a .pt path
    assert start(init_from="resume_train", resume_ckpt=str(grown)).checkpoint_path() == str(grown)
    # resume_ckpt is for resume_train only: resume_model reads model_dir
    assert start(init_from="resume_model", model_dir=str(base), resume_ckpt=str(grown)).checkpoint_path() == str(
        base / "ckpt.pt")


@pytest.mark.parametrize("over, message", [
    (dict(init_from="resume_train", resume_ckpt="missing.pt"), "--resume_ckpt=missing.pt: no such checkpoint file"),
    (dict(init_from="resume_model"), "init_from=resume_model needs --model_dir=DIR (a folder holding ckpt.pt)"),
    (dict(init_from="resume_train", out_dir="nowhere"),
     "init_from=resume_train: no checkpoint at nowhere/ckpt.pt (train one first or check --out_dir)"),
    (dict(init_from="resume_model", model_dir="nowhere"),
     "init_from=resume_model: no checkpoint at nowhere/ckpt.pt (check --model_dir)"),
])
def test_a_missing_checkpoint_is_one_line(tmp_path, monkeypatch, over, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        start(**over).checkpoint_path()
    assert str(e.value) == message


def test_the_init_rule_is_the_schemas():
    with pytest.raises(UserError, match="init_from=resume_model needs --model_dir=DIR"):
        TRAIN.parse(["--init_from=resume_model"])
    with pytest.raises(UserError, match="needs --model_dir"):
        start(init_from="resume_model").check()


def test_wandb_and_system_options_take_their_keys():
    cfg = {**FINETUNE_T0.defaults(), "wandb_log": True, "wandb_project": "p", "wandb_run_name": "r",
           "wandb_entity": "e", "wandb_tags": ["a", "b"], "wandb_mode": "offline", "device": "cpu", "dtype": "float64",
           "parallelism": "fsdp", "peak_flops": 1e12}
    assert WandbOptions.from_config(cfg) == WandbOptions(log=True, project="p", run_name="r", entity="e",
                                                         tags=["a", "b"], mode="offline")
    assert SystemOptions.from_config(cfg) == SystemOptions(device="cpu", dtype="float64", parallelism="fsdp",
                                                           peak_flops=1e12)
