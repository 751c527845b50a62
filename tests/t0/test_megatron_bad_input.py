"""Bad Megatron arguments to finetune_t0.py (tinylab/t0/megatron_args.py): one `error:` line, exit 2,
nothing written (tests/test_bad_input.py's style)."""
import subprocess

import pytest
from conftest import run_main
from test_bad_input import assert_error, assert_nothing_lost, snapshot
from test_megatron_args import tr13, tr13_argv  # noqa: F401  (the module fixture)

CASES = [
    ({"TP_SIZE": 2}, ["--tensor-model-parallel-size 2", "no tensor parallelism"]),
    ({"PP_SIZE": 4}, ["--pipeline-model-parallel-size 4", "no pipeline parallelism"]),
    ({"GLOBAL_BATCH_SIZE": 7}, ["--global-batch-size 7 is not divisible by micro-batch-size x processes = 2 x 1"]),
    ({"NLAYERS": 24}, ["--num-layers 24", "n_layers=2"]),
    ({"NHIDDEN": 1024}, ["--hidden-size 1024", "dim=32"]),
    ({"SEQ_LEN": 2048}, ["max_seq_len=2048 exceeds the base model's 128"]),
    ({"SAVE_PATH": "$CHECKPOINT_PATH"}, ["--save and --load both name"]),
]


@pytest.mark.parametrize("over,fragments", CASES, ids=[next(iter(c[0])) for c in CASES])
def test_bad_tr13_values(tr13, tmp_path, over, fragments):  # noqa: F811
    out = tmp_path / "out"
    variables = dict(tr13, SAVE_PATH=out)
    if over.get("SAVE_PATH") == "$CHECKPOINT_PATH":
        over = {"SAVE_PATH": tr13["CHECKPOINT_PATH"]}
    before = snapshot(tmp_path, tr13["CHECKPOINT_PATH"])
    proc = run_main("finetune_t0.py", tr13_argv(variables, **over) + ["--device=cpu"])
    # a refusal after the flags were read follows the notice line of the accepted no-op flags
    lines = proc.stderr.splitlines()
    if lines[0].startswith("notice: Megatron arguments accepted that change nothing here"):
        lines = lines[1:]
    assert_error(subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, "\n".join(lines)), 2, *fragments)
    assert_nothing_lost(before, snapshot(tmp_path, tr13["CHECKPOINT_PATH"]), nothing_new=True)


@pytest.mark.parametrize("argv,fragments", [
    (["--lr-decay-style", "inverse-square-root"], ["must be one of"]),
    (["--dataloader-type", "cyclic"], ["--dataloader-type cyclic", "single"]),
    (["--data-impl", "lazy"], ["--data-impl lazy", "mmap"]),
    (["--train-iters", "5", "--train-samples", "50"], ["--train-iters and --train-samples exclude each other"]),
    (["--tokenizer-type", "GPT2BPETokenizer"], ["only PretrainedFromHF"]),
    (["--position-embedding-type", "absolute"], ["finetune_t0 refuses it"]),
    (["--lr-decay-style", "cosine", "--lr-warmup-iters", "10"], ["cosine with a warmup"]),
    (["--no-load-optim"], ["--no-load-optim without --reset-progress"]),
    (["--seq-length", "64", "--max_seq_len=32"], ["--seq-length gives max_seq_len=64 but max_seq_len=32"]),
    (["--data-path", "1", "a", "2"], ["--data-path takes one PREFIX or pairs"]),
    (["--data-path", "a", "--split", "9,x"], ["--split '9,x'"]),
    (["--split", "90,10"], ["--split goes with --data-path"]),
    (["--lr"], ["--lr needs a value"]),
])
def test_bad_megatron_flags(tmp_path, argv, fragments):
    before = snapshot(tmp_path)
    data = [] if "--data-path" in argv else ["--mixture=m.json"]
    proc = run_main("finetune_t0.py", argv + [f"--out_dir={tmp_path / 'out'}"] + data)
    assert_error(proc, 2, *fragments)
    assert_nothing_lost(before, snapshot(tmp_path), nothing_new=True)
