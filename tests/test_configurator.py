"""configurator.py: files then overrides, type checks, the --lr alias, one-line errors."""
import glob
import os

import pytest
from conftest import REPO, assert_one_line_error, run_cli

from tinylab.config import parse_config
from tinylab.errors import UserError
from tinylab.schema import TRAIN_DEFAULTS

DEFAULTS = dict(learning_rate=5e-4, batch_size=8, dataset_name="x", compile=False, eval_dataset_names=[], model_dir="",
                n_kv_heads=6, wandb_tags=[])


def test_files_then_overrides(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("batch_size = 16\nlearning_rate = 1e-3\n_private = 3\nimport math\n")
    b = tmp_path / "b.py"
    b.write_text("batch_size = batch_size * 2\ndataset_name = 'filter-Twist'\n")
    cfg = parse_config(DEFAULTS, [str(a), str(b), "--learning_rate=2e-4", "--compile=True"])
    assert cfg["batch_size"] == 32 and cfg["learning_rate"] == 2e-4 and cfg["compile"] is True
    assert cfg["dataset_name"] == "filter-Twist"
    assert DEFAULTS["batch_size"] == 8  # defaults untouched


def test_types_alias_and_strings():
    cfg = parse_config(DEFAULTS, ["--lr=1", "--dataset_name=123", "--eval_dataset_names=['a','b']", "--compile=false"])
    assert cfg["learning_rate"] == 1.0 and isinstance(cfg["learning_rate"], float)
    assert cfg["dataset_name"] == "123" and cfg["eval_dataset_names"] == ["a", "b"] and cfg["compile"] is False
    assert parse_config(DEFAULTS, ["--model_dir=out/base"])["model_dir"] == "out/base"


@pytest.mark.parametrize("argv, fragment", [
    (["--lerning_rate=1e-3"], "did you mean 'learning_rate'"),
    (["--batch_size", "4"], "use --key=value"),
    (["--batch_size=abc"], "expects int"),
    (["--batch_size=1.5"], "expects int"),
    (["--compile=3"], "expects bool"),
    (["--batch_size=None"], "expects int"),
    (["--learning_rate=None"], "expects float"),
    (["missing_config.py"], "config file not found"),
    (["-x"], "use --key=value"),
])
def test_errors(argv, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_config(DEFAULTS, argv)


def test_wrong_type_in_file(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("dataset_name = 5\n")
    with pytest.raises(UserError, match="'dataset_name' expects str"):
        parse_config(DEFAULTS, [str(f)])


def test_original_study_config_spellings(tmp_path):
    """The original study's configs write lists as comma-separated strings and use
    generation_eval_batch_size; they load unchanged into train.py's config."""
    f = tmp_path / "orig_aws.py"
    f.write_text('init_from = "resume_model"\n'
                 'eval_dataset_names = "specialise-Twist,filter-Twist, filter-adv-Twist"\n'
                 'wandb_tags = "exp2,deletion"\n'
                 'eval_batch_size = 256\n'
                 'generation_eval_batch_size = 64\n'
                 'always_save_checkpoint = False\n')
    cfg = parse_config(TRAIN_DEFAULTS, [str(f), "--wandb_tags=a,b", "--eval_dataset_names=filter-Twist"])
    assert cfg["eval_dataset_names"] == ["filter-Twist"] and cfg["wandb_tags"] == ["a", "b"]
    cfg = parse_config(TRAIN_DEFAULTS, [str(f)])
    assert cfg["eval_dataset_names"] == ["specialise-Twist", "filter-Twist", "filter-adv-Twist"]
    assert cfg["wandb_tags"] == ["exp2", "deletion"] and cfg["eval_batch_size"] == 256
    assert cfg["generation_batch_size"] == 64 and cfg["always_save_checkpoint"] is False
    assert parse_config(TRAIN_DEFAULTS, ["--eval_dataset_names="])["eval_dataset_names"] == []


def test_unknown_key_in_file(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("batch_sise = 3\n")
    with pytest.raises(UserError, match="did you mean 'batch_size'"):
        parse_config(DEFAULTS, [str(f)])


def test_cli_errors_are_one_line():
    assert_one_line_error(run_cli(["train.py", "--learnin_rate=1"]), "learning_rate")
    assert_one_line_error(run_cli(["train.py", "--max_iters", "5"]), "use --key=value")
    assert_one_line_error(run_cli(["train.py", "configs/nope.py"]), "config file not found")


def test_help_lists_every_key():
    proc = run_cli(["train.py", "--help"])
    assert proc.returncode == 0
    for key in TRAIN_DEFAULTS:
        assert f"--{key}" in proc.stdout


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "configs", "*.py"))))
def test_every_config_file_loads(path):
    # configs/t0_*.py configure finetune_t0.py, every other one train.py
    if os.path.basename(path).startswith("t0_"):
        import finetune_t0 as driver
    else:
        import train as driver
    cfg = parse_config(driver.DEFAULTS, [path])
    assert cfg["max_iters"] > 0 and cfg["batch_size"] > 0
