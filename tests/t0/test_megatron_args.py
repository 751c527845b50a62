"""Megatron-DeepSpeed's finetune_t0.py arguments (tinylab/t0/megatron_args.py, docs/t0.md): a tr13
script's argument block (BLOOMZ-560M, bigscience train/tr13-mtf/smaller_models/
tr13e-350m-mtf-xp3capmixnewcodelonglossseq.slurm; sizes shrunk, paths local) runs unchanged, and
each flag lands on our key with Megatron's meaning (re-derived here from Megatron's code)."""
import json
import os
import shlex

import numpy as np
import pytest
from conftest import TOK8192, read_metrics, run_main
from test_megatron_data import meg_write
from test_t0_megatron import TASKS, rows_of

from tinylab.core.errors import UserError
from tinylab.data.tokenizer import Tokenizer
from tinylab.schema import FINETUNE_T0
from tinylab.t0.encode import ExampleEncoder

# the script's variables, shrunk to the tiny base model (dim 32, 2 layers, 4 heads, context 128)
SIZES = dict(TP_SIZE=1, PP_SIZE=1, MICRO_BATCH_SIZE=2, GLOBAL_BATCH_SIZE=8, NLAYERS=2, NHIDDEN=32, NHEADS=4,
             SEQ_LEN=128, SAVE_INTERVAL=2, TRAIN_SAMPLES=16, ZERO_STAGE=1)

# lines 84-180 of the script, verbatim but for the shrunk eval interval / iterations, the vocabulary size
# and --save (a folder of its own: here a run folder holds one run)
TR13 = """
    --tensor-model-parallel-size $TP_SIZE
    --pipeline-model-parallel-size $PP_SIZE
    --pp-partition-method 'type:transformer|embedding'
    --num-layers $NLAYERS
    --hidden-size $NHIDDEN
    --num-attention-heads $NHEADS
    --seq-length $SEQ_LEN
    --max-position-embeddings $SEQ_LEN
    --micro-batch-size $MICRO_BATCH_SIZE
    --global-batch-size $GLOBAL_BATCH_SIZE
    --train-samples $TRAIN_SAMPLES
    --tokenizer-type PretrainedFromHF
    --tokenizer-name-or-path $TOKENIZER_NAME_OR_PATH
    --init-method-std 0.0048
    --embed-layernorm
    --fp16
    --seed 42
    --position-embedding-type alibi
    --checkpoint-activations
    --abort-on-unmet-fused-kernel-constraints
    --kill-switch-path $KILL_SWITCH_PATH
    --pad-vocab-size-to 8192
    --optimizer adam
    --adam-beta1 0.9
    --adam-beta2 0.95
    --adam-eps 1e-8
    --lr 2e-5
    --lr-decay-style constant
    --lr-warmup-samples 0
    --clip-grad 1.0
    --weight-decay 1e-4
    --no-load-optim
    --reset-progress
    --norm-target-loss
    --exit-duration-in-mins 5990
    --log-interval 1
    --save-interval $SAVE_INTERVAL
    --eval-interval 2
    --eval-iters 1
    --tensorboard-dir $TENSORBOARD_PATH
    --tensorboard-queue-size 5
    --log-timers-to-tensorboard
    --log-batch-size-to-tensorboard
    --log-validation-ppl-to-tensorboard
    --save $SAVE_PATH
    --load $CHECKPOINT_PATH
    --train-weighted-split-paths-path $TRAIN_DATA_PATH
    --valid-weighted-split-paths-path $VALID_DATA_PATH
    --dataloader-type single
    --data-impl mmap
    --distributed-backend nccl
    --deepspeed
    --deepspeed_config $CONFIG_JSON
    --zero-stage $ZERO_STAGE
    --deepspeed-activation-checkpointing
"""


def hf_tokenizer_folder(folder, extra_pieces=()):
    """A Hugging Face tokenizer folder from the shipped sentencepiece model (BPE over its pieces,
    merges by piece score, sentencepiece's whitespace handling; no BOS), made here: nothing downloaded.
    `extra_pieces` are appended to the vocabulary with no merge that makes them: len(tokenizer)
    grows, every text's ids stay the same."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import Tokenizer as HFTok
    from tokenizers import normalizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    m = pb.ModelProto()
    m.ParseFromString(open(TOK8192, "rb").read())
    vocab = {p.piece: i for i, p in enumerate(m.pieces)}
    merges = []
    for _, i, piece in sorted(((p.score, i, p.piece) for i, p in enumerate(m.pieces) if p.type == 1),
                              key=lambda x: (-x[0], x[1])):
        merges += [(a, b) for _, _, a, b in sorted((vocab[piece[:k]], vocab[piece[k:]], piece[:k], piece[k:])
                                                    for k in range(1, len(piece))
                                                    if piece[:k] in vocab and piece[k:] in vocab)]
    vocab.update((piece, len(m.pieces) + i) for i, piece in enumerate(extra_pieces))
    tok = HFTok(BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tr13(t0_setup, tmp_path_factory):
    """The script's variables for a tiny local run: prefixes hero / ending of the demo tasks
    (Megatron's builder, uint16), the data-path files in Megatron's one-line format, the DeepSpeed
    config the script writes, a local HF tokenizer; the base model is the --load folder."""
    mixture, base = t0_setup
    demo, root = os.path.dirname(mixture), str(tmp_path_factory.mktemp("tr13"))
    enc = ExampleEncoder(Tokenizer(TOK8192), add_bos=False)
    for task in ("hero", "ending"):
        rows = rows_of(demo, TASKS[task])
        for field, items in (("inputs", enc.encode_inputs([r["inputs"] for r in rows])),
                             ("targets", enc.encode_targets([r["targets"] for r in rows]))):
            meg_write(os.path.join(root, f"{task}_{field}_document"), [[it] for it in items], np.uint16)
    with open(os.path.join(root, "train.txt"), "w") as f:
        f.write(f'"train: 1 0:0.8 {root}/hero, 2 0:0.8 {root}/ending"\n')
    with open(os.path.join(root, "valid.txt"), "w") as f:
        f.write(f'"validation: 1 0.8:1 {root}/hero, 1 0.8:1 {root}/ending"\n')
    ds = {"train_micro_batch_size_per_gpu": SIZES["MICRO_BATCH_SIZE"], "train_batch_size": SIZES["GLOBAL_BATCH_SIZE"],
          "gradient_clipping": 1.0, "zero_optimization": {"stage": 1},
          "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1,
                   "initial_scale_power": 12}, "steps_per_print": 2000, "wall_clock_breakdown": False}
    with open(os.path.join(root, "ds_config.json"), "w") as f:
        json.dump(ds, f)
    return dict(SIZES, TOKENIZER_NAME_OR_PATH=hf_tokenizer_folder(os.path.join(root, "tokenizer")),
                KILL_SWITCH_PATH=os.path.join(root, "kill-switch"), TENSORBOARD_PATH=os.path.join(root, "tb"),
                CHECKPOINT_PATH=base, TRAIN_DATA_PATH=os.path.join(root, "train.txt"),
                VALID_DATA_PATH=os.path.join(root, "valid.txt"), CONFIG_JSON=os.path.join(root, "ds_config.json"))


def tr13_argv(variables, **over):
    text = TR13
    for name, value in sorted({**variables, **over}.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(f"${name}", shlex.quote(str(value)))
    return shlex.split(text)


def test_tr13_block_maps_to_our_keys(tr13, tmp_path, capsys):
    cfg = FINETUNE_T0.parse(tr13_argv(tr13, SAVE_PATH=tmp_path / "out") + ["--device=cpu"])
    world = 1
    gas = SIZES["GLOBAL_BATCH_SIZE"] // (SIZES["MICRO_BATCH_SIZE"] * world)  # megatron/microbatches.py:72-84
    expect = dict(batch_size=2, gradient_accumulation_steps=gas, max_seq_len=128,
                  max_iters=SIZES["TRAIN_SAMPLES"] // SIZES["GLOBAL_BATCH_SIZE"],  # training.py:226
                  optimizer="adamw", beta1=0.9, beta2=0.95, adam_eps=1e-8, learning_rate=2e-5, lr_scheduling=True,
                  lr_schedule="constant", warmup_iters=0, grad_clip=1.0, weight_decay=1e-4, seed=42,
                  init_from="resume_model", model_dir=tr13["CHECKPOINT_PATH"], reset_progress=False,
                  loss_normalization="example", dtype="float16", activation_checkpointing=True, log_interval=1,
                  checkpoint_interval=2, eval_interval=2, eval_iters=1 * gas, out_dir=str(tmp_path / "out"))
    assert {k: cfg[k] for k in expect} == expect
    notice = [line for line in capsys.readouterr().err.splitlines() if "change nothing" in line]
    assert len(notice) == 1 and "--deepspeed," in notice[0] and "--tensorboard-dir" in notice[0]


@pytest.mark.slow
def test_tr13_block_runs(tr13, tmp_path):
    """The block as it stands (plus --device=cpu): two iterations, a validation, a checkpoint."""
    out = tmp_path / "out"
    proc = run_main("finetune_t0.py", tr13_argv(tr13, SAVE_PATH=out) + ["--device=cpu"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = read_metrics(str(out))
    assert any("loss/valid/validation" in m for m in metrics), metrics
    assert os.path.isfile(out / "ckpt.pt")


def test_megatron_schedule_equals_ours():
    """learning_rates.py:62-109 (warmup lr * n / W while n <= W; linear / constant after; n in
    samples, stepped by the global batch) against our schedule, with --lr-warmup-samples."""
    from tinylab.training.optim import schedule_lr
    from tinylab.training.options import ScheduleOptions
    argv = ["--micro-batch-size", "2", "--global-batch-size", "8", "--train-samples", "800", "--lr", "1e-3",
            "--min-lr", "1e-4", "--lr-warmup-samples", "80", "--mixture=x.json"]
    for style in ("linear", "constant"):
        cfg = FINETUNE_T0.prepare(dict(FINETUNE_T0.defaults(), **_parsed(argv + ["--lr-decay-style", style])))
        sched = ScheduleOptions.from_config(cfg)
        W, D, G = 80, 800, 8
        for it in range(cfg["max_iters"] + 1):
            n = it * G
            if n <= W:
                ref = 1e-3 * n / W
            elif style == "constant":
                ref = 1e-3
            else:
                ref = 1e-4 + (1 - (n - W) / (D - W)) * (1e-3 - 1e-4)
            assert schedule_lr(it, sched) == pytest.approx(ref, rel=1e-12, abs=1e-15), (style, it)


def _parsed(argv):
    """The values the command line gives (before prepare), as Schema.parse reads them."""
    cfg, rest = {}, list(argv)
    while rest:
        arg = rest.pop(0)
        if "=" in arg:
            name, value = arg[2:].split("=", 1)
            k = FINETUNE_T0.key(name, arg)
            cfg[k.name] = k.from_text(value, arg)
            continue
        k = FINETUNE_T0.key(arg[2:], arg)
        cfg[k.name] = k.from_text(rest.pop(0), arg) if k.nargs == 1 else True
    return cfg


def test_global_batch_must_divide(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(UserError, match="not divisible by micro-batch-size x processes = 2 x 3"):
        FINETUNE_T0.prepare(dict(FINETUNE_T0.defaults(), **_parsed(["--micro-batch-size", "2", "--global-batch-size",
                                                                     "8"])))
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = FINETUNE_T0.prepare(dict(FINETUNE_T0.defaults(), **_parsed(["--micro-batch-size", "2", "--global-batch-size",
                                                                       "8"])))
    assert cfg["gradient_accumulation_steps"] == 4  # ours counts micro-steps over all processes: 2 per process
