"""tinylab/core/config.py + schema.py: files then overrides, types, ranges, choices, cross-key rules,
aliases, one-line errors naming where a value came from, --help printing the schema."""
import glob
import os

import pytest
from conftest import REPO, assert_one_line_error, run_main

from tinylab.core.config import Key, Schema
from tinylab.core.errors import UserError
from tinylab.schema import DRIVERS, FINETUNE_T0, SAMPLE, TRAIN

SMALL = Schema("prog.py", [("section", [
    Key("learning_rate", 5e-4, "lr", range="[0, inf)", aliases=("lr",)),
    Key("batch_size", 8, "bs", range="[1, inf)"),
    Key("dataset_name", "x", "name", nonempty=True),
    Key("compile", False, "compile"),
    Key("eval_dataset_names", [], "names"),
    Key("model_dir", "", "dir"),
    Key("n_kv_heads", 6, "kv", range="[0, inf)"),
    Key("wandb_tags", [], "tags"),
    Key("dropout", 0.0, "p", range="[0, 1)"),
    Key("mode", "a", "mode", choices=("a", "b")),
])], rules=[lambda c: (_ for _ in ()).throw(UserError("rule broken")) if c["batch_size"] == 7 else None])


def test_files_then_overrides(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("batch_size = 16\nlearning_rate = 1e-3\n_private = 3\nimport math\n")
    b = tmp_path / "b.py"
    b.write_text("batch_size = batch_size * 2\ndataset_name = 'filter-Twist'\n")
    cfg = SMALL.parse([str(a), str(b), "--learning_rate=2e-4", "--compile=True"])
    assert cfg["batch_size"] == 32 and cfg["learning_rate"] == 2e-4 and cfg["compile"] is True
    assert cfg["dataset_name"] == "filter-Twist"
    assert SMALL.defaults()["batch_size"] == 8  # defaults untouched


def test_types_alias_and_strings():
    cfg = SMALL.parse(["--lr=1", "--dataset_name=123", "--eval_dataset_names=['a','b']", "--compile=false"])
    assert cfg["learning_rate"] == 1.0 and isinstance(cfg["learning_rate"], float)
    assert cfg["dataset_name"] == "123" and cfg["eval_dataset_names"] == ["a", "b"] and cfg["compile"] is False
    assert SMALL.parse(["--model_dir=out/base"])["model_dir"] == "out/base"


@pytest.mark.parametrize("argv, fragment", [
    (["--lerning_rate=1e-3"], "did you mean 'learning_rate'"),
    (["--batch_size", "4"], "use --key=value"),
    (["--batch_size=abc"], "expects int"),
    (["--batch_size=1.5"], "expects int"),
    (["--compile=3"], "expects bool"),
    (["--batch_size=None"], "expects int"),
    (["--learning_rate=None"], "expects float"),
    (["--eval_dataset_names=[1, 2]"], "expects list of str"),
    (["missing_config.py"], "config file not found"),
    (["-x"], "use --key=value"),
    (["--batch_size=0"], "--batch_size=0: must be in [1, inf)"),
    (["--dropout=1.0"], "--dropout=1.0: must be in [0, 1)"),
    (["--dropout=-0.1"], "must be in [0, 1)"),
    (["--learning_rate=nan"], "expects float"),
    (["--learning_rate=1e999"], "must be a finite number"),
    (["--mode=c"], "--mode='c': must be one of a, b"),
    (["--dataset_name="], "must not be empty"),
    (["--batch_size=7"], "rule broken"),
])
def test_errors(argv, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        SMALL.parse(argv)


def test_errors_name_the_config_file(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("dataset_name = 5\n")
    with pytest.raises(UserError, match="'dataset_name' expects str"):
        SMALL.parse([str(f)])
    f.write_text("dropout = 1.5\n")
    with pytest.raises(UserError, match=f"{f}: dropout=1.5: must be in"):
        SMALL.parse([str(f)])


def test_unknown_key_in_file(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("batch_sise = 3\n")
    with pytest.raises(UserError, match="did you mean 'batch_size'"):
        SMALL.parse([str(f)])


def test_original_study_config_spellings(tmp_path):
    """The original study's configs write lists as comma-separated strings and use
    generation_eval_batch_size; they load unchanged into train.py's config."""
    f = tmp_path / "orig_aws.py"
    f.write_text('init_from = "resume_model"\nmodel_dir = "out/base"\n'
                 'eval_dataset_names = "specialise-Twist,filter-Twist, filter-adv-Twist"\n'
                 'wandb_tags = "exp2,deletion"\n'
                 'eval_batch_size = 256\n'
                 'generation_eval_batch_size = 64\n'
                 'always_save_checkpoint = False\n')
    cfg = TRAIN.parse([str(f), "--wandb_tags=a,b", "--eval_dataset_names=filter-Twist"])
    assert cfg["eval_dataset_names"] == ["filter-Twist"] and cfg["wandb_tags"] == ["a", "b"]
    cfg = TRAIN.parse([str(f)])
    assert cfg["eval_dataset_names"] == ["specialise-Twist", "filter-Twist", "filter-adv-Twist"]
    assert cfg["wandb_tags"] == ["exp2", "deletion"] and cfg["eval_batch_size"] == 256
    assert cfg["generation_batch_size"] == 64 and cfg["always_save_checkpoint"] is False
    assert TRAIN.parse(["--eval_dataset_names="])["eval_dataset_names"] == []


@pytest.mark.parametrize("argv, fragment", [
    (["--dim=100", "--n_heads=6"], "dim=100 is not divisible by n_heads=6"),
    (["--dim=36", "--n_heads=4"], "must be even"),
    (["--n_heads=6", "--n_kv_heads=4"], "n_kv_heads=4 must divide n_heads=6"),
    (["--n_kv_heads=12"], "must divide"),
    (["--dropout=1.5"], "--dropout=1.5: must be in [0, 1)"),
    (["--hidden_dim=-4"], "--hidden_dim=-4: must be in [0, inf)"),
    (["--gradient_accumulation_steps=0"], "must be in [1, inf)"),
    (["--eval_interval=0"], "--eval_interval=0"),
    (["--log_interval=0"], "--log_interval=0"),
    (["--eval_iters=0"], "--eval_iters=0"),
    (["--max_iters=-3"], "--max_iters=-3"),
    (["--beta2=1.0"], "--beta2=1.0: must be in [0, 1)"),
    (["--grad_clip=-1"], "--grad_clip=-1.0"),
    (["--learning_rate=-1e-3"], "--learning_rate=-0.001"),
    (["--min_lr=1e-2"], "min_lr=0.01 is above learning_rate"),
    (["--lr_decay_iters=10", "--warmup_iters=100"], "ends before warmup_iters"),
    (["--device=tpu"], "unknown device"),
    (["--dtype=float8"], "must be one of"),
    (["--init_from=resume_modle"], "did you mean 'resume_model'"),
    (["--init_from=resume_model"], "needs --model_dir"),
    (["--generation_datasets=['nope']"], "generation_datasets names ['nope']"),
    (["--grow_schedule=5:sideways"], "doubling must be one of"),
    (["--feature_eval=Twists"], "did you mean 'Twist'"),
    (["--out_dir="], "--out_dir='': must not be empty"),
    (["--adafactor_warmup_init=True"], "needs adafactor_relative_step=True"),
])
def test_train_schema_rejects(argv, fragment):
    with pytest.raises(UserError) as e:
        TRAIN.parse(argv)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_device_cuda_without_cuda():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UserError, match="CUDA is not available"):
        TRAIN.parse(["--device=cuda"])
    assert TRAIN.parse(["--device=cpu"])["device"] == "cpu"


def test_t0_schema_shares_keys_and_has_its_defaults():
    t0 = FINETUNE_T0.defaults()
    assert t0["out_dir"] == "out/t0" and t0["init_from"] == "resume_model" and t0["eval_iters"] == 4
    assert FINETUNE_T0.keys["dropout"] is TRAIN.keys["dropout"]  # shared, not copied
    # beta2 is TRAIN's key, only spelled Megatron's way too (--adam-beta2 0.95, tinylab/t0/megatron_args.py)
    assert FINETUNE_T0.keys["beta2"].replace(aliases=(), nargs=None) == TRAIN.keys["beta2"]
    assert FINETUNE_T0.keys["beta2"].aliases == ("adam-beta2",)
    assert "dim" not in FINETUNE_T0.keys and "mixture" not in TRAIN.keys
    assert FINETUNE_T0.parse(["--model_dir=x", "--eval_iters=0"])["eval_iters"] == 0  # 0 disables T0's loss eval
    with pytest.raises(UserError, match="init_from"):
        FINETUNE_T0.parse(["--init_from=scratch"])


def test_tool_flags_share_the_validation():
    p = SAMPLE.argparser("x")
    assert SAMPLE.parse_args(["--num_samples=2", "--top_k", "5"], p).num_samples == 2
    for argv, fragment in ((["--num_samples=0"], "--num_samples=0: must be in [1, inf)"),
                           (["--temperature=-1"], "--temperature=-1.0: must be in [0, inf)"),
                           (["--max_new_tokens=-1"], "--max_new_tokens=-1"),
                           (["--top_k=-5"], "--top_k=-5"),
                           (["--device=tpu"], "unknown device"),
                           (["--num_sample=3"], "unrecognized arguments")):
        with pytest.raises(UserError) as e:
            SAMPLE.parse_args(argv, SAMPLE.argparser("x"))
        assert fragment in str(e.value), str(e.value)


def test_cli_errors_are_one_line():
    # from the repository root, as a user runs it (configs/... is relative)
    assert_one_line_error(run_main("train.py", ["--learnin_rate=1"], cwd=REPO), "learning_rate")
    assert_one_line_error(run_main("train.py", ["--max_iters", "5"], cwd=REPO), "use --key=value")
    assert_one_line_error(run_main("train.py", ["configs/nope.py"], cwd=REPO), "config file not found")


def test_help_prints_the_schema():
    proc = run_main("train.py", ["--help"])
    assert proc.returncode == 0
    for name, key in TRAIN.keys.items():
        assert f"--{name}" in proc.stdout and key.help in proc.stdout
    assert "int = 2000  [1, inf)" in proc.stdout  # eval_interval: type, default, range
    assert "aliases: --lr = --learning_rate" in proc.stdout


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "configs", "*.py"))))
def test_every_config_file_loads(path):
    # configs/t0_*.py configure finetune_t0.py, every other one train.py
    schema = DRIVERS["finetune_t0.py" if os.path.basename(path).startswith("t0_") else "train.py"]
    overrides = ["--model_dir=out/base"]  # the resume_model configs name their base at run time
    cfg = schema.parse([path] + overrides)
    assert cfg["max_iters"] > 0 and cfg["batch_size"] > 0
