"""The original study's artefacts used as they are: the shipped tokenizers found by every program
without a copy in data_cache_dir (tinylab/data/tokenizer.py), run.c's tokenizer.bin, and a checkpoint
in the original's exact format (RobertKirk/tinystories-wrappers: llama2.c's six keys, its
model.py's parameter names, probe / lens heads in the state dict, an AdamW state made by its
configure_optimizers) loading for sampling, evaluation, export and training."""
import hashlib
import json
import os
import shutil

import pytest
import torch
from conftest import (
    LLAMA2_TOKENIZER,
    REPO,
    TOK8192,
    WIKITEXT,
    assert_one_line_error,
    run_main,
)

from tinylab.core.errors import UserError
from tinylab.data import tokenizer as tok_lib
from tinylab.interop.llama2c import export_tokenizer, read_bin
from tinylab.schema import TRAIN
from tinylab.training.options import TrainerOptions
from tinylab.training.setup import Run
from tinylab.training.trainer import Trainer

SHIPPED_BIN = os.path.join(REPO, "tokenizers", "tokenizer.bin")


# ---------------------------------------------------------------------- tokenizers

def test_shipped_tokenizer_bin_is_run_c_export_of_the_llama2_tokenizer(tmp_path):
    data = open(SHIPPED_BIN, "rb").read()
    assert (len(data), hashlib.md5(data).hexdigest()) == (433869, "c5a4f2f24b728689a3c4f9e4f79d5112")  # README
    export_tokenizer(LLAMA2_TOKENIZER, str(tmp_path / "t.bin"), log=lambda *a: None)
    assert (tmp_path / "t.bin").read_bytes() == data


def test_resolver_order_cache_copy_then_shipped(tmp_path, capsys):
    empty = str(tmp_path / "empty")
    assert tok_lib.tokenizer_model_path(empty, 8192) == os.path.join(tok_lib.SHIPPED_DIR, "tok8192.model")
    assert os.path.samefile(tok_lib.tokenizer_model_path(empty, 8192), TOK8192)
    assert os.path.samefile(tok_lib.tokenizer_model_path(empty, 0), LLAMA2_TOKENIZER)
    with pytest.raises(UserError, match="tok512.model not found: run: python tinystories.py train_vocab"):
        tok_lib.tokenizer_model_path(empty, 512)
    # an identical copy in the cache is used silently
    same = tmp_path / "same"
    same.mkdir()
    shutil.copy(TOK8192, same / "tok8192.model")
    assert tok_lib.tokenizer_model_path(str(same), 8192) == str(same / "tok8192.model")
    assert capsys.readouterr().err == ""
    # a different one (train_vocab's own tok8192) wins, with one notice saying why, once
    other = tmp_path / "other"
    other.mkdir()
    (other / "tok8192.model").write_bytes(open(TOK8192, "rb").read() + b"\0")
    for _ in range(2):
        assert tok_lib.tokenizer_model_path(str(other), 8192) == str(other / "tok8192.model")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("notice: using") and "differs" in err[0]
    # an explicit file always wins
    assert tok_lib.tokenizer_model_path(str(other), 8192, TOK8192) == TOK8192


@pytest.fixture(scope="module")
def bare_cache(tiny_corpus, tmp_path_factory):
    """A data cache with the raw shards and no tokenizer file; pretokenized by the CLI, which must
    find the shipped tok8192 itself."""
    cache = str(tmp_path_factory.mktemp("bare_cache"))
    os.symlink(tiny_corpus.raw_dir, os.path.join(cache, "TinyStories_all_data"))
    run_main("tinystories.py", ["pretokenize", f"--data_cache_dir={cache}", "--vocab_size=8192",
                                "--dataset_name=d", "--workers=1"], check=True)
    assert not os.path.exists(os.path.join(cache, "tok8192.model"))
    return cache


def lm_args(cache, out, **over):
    cfg = dict(data_cache_dir=cache, vocab_size=8192, dataset_name="d", out_dir=out, dim=32, n_layers=2, n_heads=4,
               n_kv_heads=4, multiple_of=16, max_seq_len=128, batch_size=2, gradient_accumulation_steps=1,
               learning_rate=1e-3, warmup_iters=0, max_iters=2, eval_interval=2, eval_iters=1, max_new_tokens=4,
               generation_batch_size=1, device="cpu", dtype="float32", export_bin=False)
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()]


@pytest.mark.slow
def test_every_program_finds_the_shipped_tok8192(bare_cache, tmp_path):
    manifest = json.load(open(os.path.join(bare_cache, "tok8192", "d", "manifest.json")))
    assert manifest["tokenizer"]["sha256"] == tok_lib.file_sha256(TOK8192)
    out = str(tmp_path / "run")
    run_main("train.py", lm_args(bare_cache, out), check=True)
    ckpt = os.path.join(out, "ckpt.pt")
    proc = run_main("sample.py", [f"--checkpoint={ckpt}", "--max_new_tokens=4", "--device=cpu"], check=True)
    assert proc.stdout.startswith("Features: Twist")
    proc = run_main("evaluation/eval_wikitext.py", [f"--checkpoint={ckpt}", f"--data={WIKITEXT}", "--device=cpu"],
                    check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["tokens"] > 0
    assert sorted(os.listdir(bare_cache)) == ["TinyStories_all_data", "tok8192"]  # nothing copied in


# ---------------------------------------------------------------------- the original's checkpoint format

ARGS = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=8192, multiple_of=16, max_seq_len=128,
            dropout=0.0)


def original_names(n_layers, heads=False):
    """The original model.py's named_parameters() order: tok_embeddings, per layer attention.wq/wk/
    wv/wo, feed_forward.w1/w2/w3, attention_norm, ffn_norm, then norm; output.weight is the
    embedding's tensor (tied) and so not a parameter of its own; then lenses and probes."""
    names = ["tok_embeddings.weight"]
    for i in range(n_layers):
        names += [f"layers.{i}.attention.{w}.weight" for w in ("wq", "wk", "wv", "wo")]
        names += [f"layers.{i}.feed_forward.{w}.weight" for w in ("w1", "w2", "w3")]
        names += [f"layers.{i}.attention_norm.weight", f"layers.{i}.ffn_norm.weight"]
    names.append("norm.weight")
    if heads:
        names += [f"lenses.{i}.weight" for i in range(n_layers - 1)] + [f"probes.{i}.weight" for i in range(n_layers - 1)]
    return names


def original_checkpoint(path, heads, iter_num=1000, seed=0):
    """Written as the original's checkpoint_training did: torch.save of the six llama2.c keys. With
    `heads` the model had lenses=True, probes=True (its probe / lens training): those heads are in
    the state dict and the optimizer, made by its configure_optimizers over the parameters that
    require grad, holds only them."""
    g = torch.Generator().manual_seed(seed)
    d, L, V = ARGS["dim"], ARGS["n_layers"], ARGS["vocab_size"]
    hidden = 16 * ((int(2 * 4 * d / 3) + 15) // 16)  # its FeedForward's rule: 96
    shapes = {"tok_embeddings": (V, d), "wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (hidden, d),
              "w2": (d, hidden), "w3": (hidden, d), "lenses": (V, d), "probes": (6, d)}
    state = {}
    for name in original_names(L, heads):
        if name.endswith("norm.weight"):
            state[name] = torch.ones(d) + 0.1 * torch.randn(d, generator=g)
        else:
            key = name.split(".")[0] if name.split(".")[0] in shapes else name.split(".")[-2]
            state[name] = 0.02 * torch.randn(shapes[key], generator=g)
    state["output.weight"] = state["tok_embeddings.weight"]  # weight tying: one tensor under both names
    params = {n: torch.nn.Parameter(state[n].clone()) for n in original_names(L, heads)}
    trained = [n for n in params if not heads or n.startswith(("lenses.", "probes."))]
    groups = [{"params": [params[n] for n in trained if params[n].dim() >= 2], "weight_decay": 0.1},
              {"params": [params[n] for n in trained if params[n].dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=5e-4, betas=(0.9, 0.95))
    for n in trained:
        params[n].grad = torch.randn(params[n].shape, generator=g)
    opt.step()
    config = {"out_dir": "out", "vocab_source": "custom", "vocab_size": V, "data_cache_dir": "/cluster/no/such/data",
              "dataset_name": "pretrain-all", "wandb_run_name": "base91M-train-2023", "lenses": heads, "probes": heads,
              **{k: ARGS[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "multiple_of", "max_seq_len")}}
    ckpt = {"model": state, "optimizer": opt.state_dict(), "iter_num": iter_num, "best_val_loss": 2.5,
            "model_args": {**ARGS, "lenses": heads, "probes": heads}, "config": config}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(ckpt, path)
    return ckpt, {n: opt.state[params[n]] for n in trained}


@pytest.mark.slow
def test_original_checkpoint_samples_evaluates_and_exports(tmp_path):
    path = str(tmp_path / "orig" / "ckpt.pt")
    ckpt, _ = original_checkpoint(path, heads=True)
    # sampling: the tokenizer is found although the config's data cache does not exist here
    proc = run_main("sample.py", [f"--checkpoint={path}", "--max_new_tokens=4", "--device=cpu", "--seed=3"], check=True)
    assert proc.stdout.startswith("Features: Twist")
    proc = run_main("evaluation/eval_wikitext.py", [f"--checkpoint={path}", f"--data={WIKITEXT}", "--device=cpu"],
                    check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ppl"] > 1
    # export: the llama2.c v0 file holds exactly the original's weights (not its heads)
    out = str(tmp_path / "model.bin")
    run_main("export.py", [out, "--version=0", f"--checkpoint={path}"], check=True)
    args, weights = read_bin(out)
    assert (args.dim, args.n_layers, args.vocab_size, args.ffn_hidden_dim()) == (32, 2, 8192, 96)
    assert set(weights) == set(original_names(2)) | {"output.weight"}
    for name, w in weights.items():
        assert torch.equal(w, ckpt["model"][name]), name


@pytest.mark.slow
def test_original_probe_checkpoint_fine_tunes_and_keeps_its_heads(lab_corpus, tmp_path):
    run = str(tmp_path / "run")
    ckpt, _ = original_checkpoint(os.path.join(run, "ckpt.pt"), heads=True)
    heads = {k: v for k, v in ckpt["model"].items() if k.startswith(("probes.", "lenses."))}
    args = lm_args(lab_corpus.cache_dir, run, dataset_name="pretrain-all", init_from="resume", max_iters=1002,
                   eval_interval=1000, max_new_tokens=0)
    proc = run_main("train.py", args, check=True)
    assert "the optimizer starts fresh" in proc.stdout and "probe / lens tensors" in proc.stdout
    new = torch.load(os.path.join(run, "ckpt.pt"), weights_only=True)
    assert new["iter_num"] == 1002 and new["best_val_loss"] == 2.5  # its counters go on
    for k, v in heads.items():  # kept aside and written back, unchanged
        assert torch.equal(new["model"][k], v), k
    assert not torch.equal(new["model"]["layers.0.attention.wq.weight"], ckpt["model"]["layers.0.attention.wq.weight"])
    # fine-tuning its weights in a new run (resume_model): the heads stay behind in model_dir
    ft = str(tmp_path / "ft")
    run_main("train.py", lm_args(lab_corpus.cache_dir, ft, dataset_name="pretrain-all", init_from="resume_model",
                                 model_dir=run, max_iters=1, max_new_tokens=0), check=True)
    assert not any(k.startswith("probes.") for k in torch.load(os.path.join(ft, "ckpt.pt"), weights_only=True)["model"])


def test_original_optimizer_state_is_restored_parameter_by_parameter(tmp_path):
    path = str(tmp_path / "run" / "ckpt.pt")
    ckpt, moments = original_checkpoint(path, heads=False)
    cfg = TRAIN.parse([f"--out_dir={tmp_path}/run", "--init_from=resume_train", "--device=cpu", "--dtype=float32",
                       *[f"--{k}={v}" for k, v in ARGS.items()]])
    from tinylab.core.checkpoint import load_checkpoint, model_from_checkpoint
    loaded = load_checkpoint(path)
    trainer = Trainer(TrainerOptions.from_config(cfg), Run.from_config(cfg), model_from_checkpoint(loaded), None, None,
                      loaded, config=cfg)
    assert trainer.iter_num == 1000 and trainer.best_val_loss == 2.5
    params = dict(trainer.raw_model.named_parameters())
    assert set(params) == set(moments)
    for name, saved in moments.items():  # each moment on the parameter the original made it for
        state = trainer.optimizer.state[params[name]]
        assert torch.equal(state["exp_avg"], saved["exp_avg"]) and torch.equal(state["exp_avg_sq"], saved["exp_avg_sq"])


def test_optimizer_state_of_other_parameters_is_one_line(lab_corpus, tmp_path):
    run = str(tmp_path / "run")
    ckpt, _ = original_checkpoint(os.path.join(run, "ckpt.pt"), heads=False)
    ckpt["optimizer"]["param_groups"][1]["params"] = []  # the norms' group emptied: no longer this model's
    torch.save(ckpt, os.path.join(run, "ckpt.pt"))
    before = open(os.path.join(run, "ckpt.pt"), "rb").read()
    proc = run_main("train.py", lm_args(lab_corpus.cache_dir, run, dataset_name="pretrain-all", init_from="resume_train",
                                        max_iters=1001, max_new_tokens=0))
    assert_one_line_error(proc, "optimizer state does not fit", "resume_model")
    assert open(os.path.join(run, "ckpt.pt"), "rb").read() == before
    assert not any(os.path.exists(os.path.join(run, f)) for f in ("config.json", "metrics.jsonl", "model.bin"))
