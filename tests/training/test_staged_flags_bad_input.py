"""Bad input to train.py's staged-training flags (tinylab/training/staged_flags.py, restart.py): each
flag's bad value, the flags that cannot apply here, the process count, the restart and doubling
rules. Each is one `error:` line, exit 2, and leaves the existing run and the checkpoint it would
resume byte for byte as they were, with no new file or folder."""
import pytest
from conftest import run_main
from test_bad_input import assert_error, assert_nothing_lost, snapshot
from test_staged_flags import ours, staged


@pytest.fixture(scope="module")
def trained(tiny_corpus, tmp_path_factory):
    """A finished tiny run (train_steps 4) to resume: (the folder holding it, its ckpt.pt)."""
    root = tmp_path_factory.mktemp("staged_bad")
    run_main("train.py", staged(root, "small", steps=4) + ours(tiny_corpus), check=True)
    return root, str(root / "small" / "ckpt.pt")


CASES = [
    # each flag's bad value (the flag named as written)
    (["--train_steps", "-1"], "--train_steps=-1: must be in [0, inf)"),
    (["--train_steps", "ten"], "'train_steps' expects int"),
    (["--train_steps"], "--train_steps needs a value"),
    (["--grad_accum", "0"], "--grad_accum=0: must be in [1, inf)"),
    (["--seqlen", "0"], "--seqlen=0: must be in [1, inf)"),
    (["--lr", "-0.1"], "--learning_rate=-0.1: must be in [0, inf)"),
    (["--warmup_steps", "-5"], "--warmup_steps=-5: must be in [0, inf)"),
    (["--val_every", "0"], "--val_every=0: must be in [1, inf)"),
    (["--val_batches", "1.5"], "'val_batches' expects int"),
    (["--log_rate", "0"], "--log_rate=0: must be in [1, inf)"),
    (["--batch_size", "0"], "--batch_size=0: must be in [1, inf)"),
    (["--seed", "-3"], "--seed=-3: must be in [0, inf)"),
    (["--save_prefix", " "], "--save_prefix=' ': must not be empty"),
    (["--num_workers", "-2"], "--num_workers=-2: must be in [0, inf)"),
    (["--adam_beta2", "1.5"], "--adam_beta2=1.5: must be in [0, 1)"),
    (["--adam_epsilon", "0"], "--adam_epsilon=0.0: must be in (0, inf)"),
    (["--gpu_count", "-2"], "--gpu_count=-2: must be in [-1, inf)"),
    (["--doubling", "sideways"], "must be one of weights, layers"),
    (["--resume", "{root}/nowhere.pt"], "--resume {root}/nowhere.pt: no such checkpoint"),
    (["--resume_model_only", "{root}/nowhere"], "--resume_model_only {root}/nowhere: no such checkpoint"),
    # the process count gpt_pretrain.py was told to expect
    (["--gpu_count", "2"], "--gpu_count 2 expects 2 process(es), but this run has 1: start it with torchrun"),
    (["--gpu_count", "1", "--node_count", "2"], "expects 2 process(es), but this run has 1"),
    (["--gpu_count", "-1"], "--gpu_count -1 asks for every visible GPU, and this machine has none"),
    # flags that cannot apply here: why, and what to use
    (["--model", "gpt2"], "--model: gpt_pretrain.py's model is a Hugging Face GPT-2"),
    (["--model=gpt2"], "--model: gpt_pretrain.py's model is a Hugging Face GPT-2"),
    (["--size", "GPT2_large"], "--size: the GPT2_* sizes are GPT-2 shapes; give this model's shape instead"),
    (["--tokenizer", "gpt2"], "--tokenizer: the GPT-2 BPE tokenizer is not used here"),
    (["--input_dir", "/data/c4"], "--input_dir: gpt_pretrain.py's C4 preprocessing"),
    (["--add_sep_after_doc"], "--add_sep_after_doc: gpt_pretrain.py's C4 preprocessing"),
    (["--tpu_core_count", "8"], "--tpu_core_count: TPUs are not supported"),
    (["--weight_decay", "0.01"], "--weight_decay: gpt_pretrain.py never passes --weight_decay to AdamW"),
    (["--warmup_bsz", "1000"], "--warmup_bsz: gpt_pretrain.py counts --warmup_bsz in the tokens of each process"),
    # a flag and our key saying different things; two starting points
    (["--max_iters=5"], "--train_steps 6 means max_iters=6, but --max_iters=5 is given too: give one"),
    (["--resume", "{ckpt}", "--resume_model_only", "{ckpt}"], "--resume and --resume_model_only both say"),
    # save_dir/save_prefix is the run folder: a new run into one that holds a run is refused
    (["--save_prefix", "small"], "already holds a run"),
    # the restart flags
    (["--restart_steps", "2"], "restart a resumed run: give --resume CHECKPOINT"),
    (["--resume", "{ckpt}", "--restart_warmup_steps", "2"], "--restart_warmup_steps needs --restart_steps"),
    (["--resume", "{ckpt}", "--reset_lr_scheduler"], "--reset_lr_scheduler needs --restart_steps"),
    (["--resume", "{ckpt}", "--restart_steps", "6"], "--restart_steps=6 is beyond the run's schedule"),
    (["--resume", "{ckpt}", "--restart_steps", "3", "--restart_warmup_steps", "4"],
     "--restart_warmup_steps=4 is longer than what is left"),
    (["--restart_steps", "-1"], "--restart_steps=-1: must be in [0, inf)"),
    # --doubling's rules
    (["--doubling", "weights"], "--doubling weights grows the checkpoint --resume names"),
    (["--resume", "{ckpt}", "--doubling", "layers"], "--doubling layers needs --doubling_layers"),
    (["--doubling_layers", "alternate_id"], "--doubling_layers alternate_id chooses how --doubling layers places"),
    (["--resume", "{ckpt}", "--doubling", "weights", "--doubling_layers", "append_id"], "give --doubling layers"),
]


@pytest.mark.parametrize("flags, fragment", CASES, ids=[" ".join(c[0])[:40] for c in CASES])
def test_bad_staged_flag(trained, tiny_corpus, flags, fragment):
    root, ckpt = trained
    fill = {"root": str(root), "ckpt": ckpt}
    flags = [f.format(**fill) for f in flags]
    before = snapshot(root)
    argv = staged(root, "new", steps=6) + flags + ours(tiny_corpus)
    assert_error(run_main("train.py", argv), 2, fragment.format(**fill))
    assert_nothing_lost(before, snapshot(root), nothing_new=True)
