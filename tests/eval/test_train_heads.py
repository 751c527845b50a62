"""train.py probes=True / lenses=True (tinylab/eval/probes.py): the heads against the original's model.py
re-implemented here (probes_forward, lens_forward, convert_batch_to_probe_classification_batch),
then whole runs: the original's metric names, a frozen model, the heads' own checkpoint entry
(loading as a plain model everywhere), bit-identical resume, and the one-line refusals."""
import json
import os
import re
import shutil

import pytest
import torch
import torch.nn.functional as F
from conftest import TOK8192, assert_one_line_error, read_metrics, records, run_main, save_tiny_checkpoint, tiny_model

from tinylab.data.dataset_spec import parse_spec
from tinylab.data.pretokenized import BatchLoader
from tinylab.data.records import STORY_FEATURES
from tinylab.data.tokenizer import Tokenizer
from tinylab.eval.probes import LensHeads, ProbeBatches, ProbeHeads, heads_for_config
from tinylab.schema import TRAIN


@pytest.fixture(scope="module")
def corpus(tiny_corpus, tmp_path_factory):
    """tiny_corpus's raw shards with pretrain-all and words-only (headers without Features), and
    base/ckpt.pt: a tiny random 3-layer model (2 probes / lenses) naming this cache's tokenizer."""
    from tinylab.data.pretokenize import pretokenize
    cache = str(tmp_path_factory.mktemp("heads"))
    os.symlink(tiny_corpus.raw_dir, os.path.join(cache, "TinyStories_all_data"))
    shutil.copy(TOK8192, os.path.join(cache, "tok8192.model"))
    for name, spec in (("pretrain-all", parse_spec()), ("words-only", parse_spec(instruction_subset="Words,Summary"))):
        pretokenize(cache, 8192, spec, dataset_name=name, seed=0, workers=1)
    base = os.path.join(cache, "base")
    save_tiny_checkpoint(os.path.join(base, "ckpt.pt"), tiny_model(max_seq_len=128, n_layers=3), cache_dir=cache)
    return cache, base


def args(corpus, out_dir, **over):
    cache, base = corpus
    cfg = dict(data_cache_dir=cache, dataset_name="pretrain-all", init_from="resume_model", model_dir=base,
               out_dir=out_dir, max_seq_len=128, batch_size=4, gradient_accumulation_steps=2, learning_rate=1e-2,
               lr_scheduling=False, max_iters=4, eval_interval=2, eval_iters=2, log_interval=1, max_new_tokens=4,
               generation_batch_size=2, device="cpu", dtype="float32", probes=True)
    cfg.update(over)
    return [f"--{k}={v}" for k, v in cfg.items()]


def model_weights(path):
    return torch.load(os.path.join(path, "ckpt.pt"), weights_only=True)["model"]


# ---------------------------------------------------------------------- the heads vs the original's code

def original_probes_forward(model, probes, tokens, targets):
    """The original model.py's probes_forward (the blocks are this model's; RoPE tables in its layout)."""
    h = model.dropout(model.tok_embeddings(tokens))
    cos, sin = model._rope_tables(tokens.shape[1], None, 0)
    probe_logitss = []
    for layer, probe in zip(model.layers, probes):
        h = layer(h, cos, sin)
        pooled_h = h[:, -10:].mean(dim=1)
        probe_logitss.append(probe(pooled_h))
    probe_losses = [F.binary_cross_entropy_with_logits(probe_logits, targets) for probe_logits in probe_logitss]
    return probe_logitss, probe_losses, sum(probe_losses)


def test_probes_are_the_originals():
    model = tiny_model(n_layers=4, dtype=torch.float64)
    torch.manual_seed(1)
    heads = ProbeHeads(3, 32).double().attach(model)
    assert [tuple(p.weight.shape) for p in heads] == [(6, 32)] * 3 and all(p.bias is None for p in heads)
    g = torch.Generator().manual_seed(0)
    targets = torch.randint(0, 2, (5, 6), generator=g).double()
    x = torch.randint(3, 8192, (5, 20), generator=g)
    logits = heads(x, torch.full((5,), 20), targets)
    ref_logits, ref_losses, ref_total = original_probes_forward(model, heads, x, targets)
    assert torch.allclose(logits, torch.stack(ref_logits, 1), atol=1e-12)
    assert torch.allclose(heads.last_losses.double(), torch.stack(ref_losses), atol=1e-6)  # (BCE in fp32)
    assert torch.allclose(heads.last_loss.double(), ref_total, atol=1e-6)
    # right-padded rows of different lengths: each row as the original sees it alone
    lengths = torch.tensor([20, 7, 13, 3, 11])
    padded = x.clone()
    for i, n in enumerate(lengths):
        padded[i, n:] = 0
    logits = heads(padded, lengths, targets)
    for i, n in enumerate(lengths):
        ref, _, _ = original_probes_forward(model, heads, x[i:i + 1, :n], targets[i:i + 1])
        assert torch.allclose(logits[i], torch.stack(ref, 1)[0], atol=1e-12)
    # the model is frozen; the heads get gradients
    heads.last_loss.backward()
    assert all(p.grad is None for p in model.parameters()) and all(p.grad is not None for p in heads.parameters())


def original_lens_forward(model, lenses, tokens, targets):
    """The original model.py's lens_forward with two bugs fixed: lens_logits = lens(h), not
    lens(h[:, -1]) (its (B, vocab) last-position logits cannot be scored against the (B * T)
    targets it passes), and every block runs (its zip(self.layers, self.lenses) stopped before the
    last block, so its output loss was that of the model without it)."""
    h = model.dropout(model.tok_embeddings(tokens))
    cos, sin = model._rope_tables(tokens.shape[1], None, 0)
    lens_logitss = []
    for i, layer in enumerate(model.layers):
        h = layer(h, cos, sin)
        if i < len(lenses):
            lens_logitss.append(lenses[i](h))
    h = model.norm(h)
    logits = model.output(h)
    output_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
    lens_losses = [F.cross_entropy(lens_logits.view(-1, lens_logits.size(-1)), targets.view(-1), ignore_index=-1)
                   for lens_logits in lens_logitss]
    lens_losses.append(output_loss)
    return lens_losses, sum(lens_losses)


def test_lenses_are_the_originals():
    model = tiny_model(n_layers=3, dtype=torch.float64)
    cfg = dict(TRAIN.defaults(), lenses=True, init_lens_with_unembed=True)
    heads = heads_for_config(cfg, model).attach(model)
    assert isinstance(heads, LensHeads) and len(heads) == 2
    for lens in heads:  # copies of the unembedding, not the same tensor
        assert torch.equal(lens.weight, model.output.weight) and lens.weight.data_ptr() != model.output.weight.data_ptr()
    with torch.no_grad():
        for lens in heads:
            lens.weight.add_(torch.randn_like(lens.weight) * 0.01)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(3, 8192, (3, 16), generator=g), torch.randint(3, 8192, (3, 16), generator=g)
    y[0, :4] = -1  # ignored targets
    heads(x, y)
    ref_losses, ref_total = original_lens_forward(model, heads, x, y)
    assert torch.allclose(heads.last_losses.double(), torch.stack(ref_losses), atol=1e-10)
    assert torch.allclose(heads.last_loss.double(), ref_total, atol=1e-10)
    model(x, y)
    assert torch.allclose(heads.last_losses[-1].double(), model.last_loss, atol=1e-10)  # the model's own loss
    heads.last_loss.backward()
    assert all(p.grad is None for p in model.parameters()) and all(p.grad is not None for p in heads.parameters())
    # under autocast the unfused head + loss gives the same numbers to bf16 precision
    model.float(), heads.float()
    heads(x, y)
    fused = heads.last_losses.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        heads(x, y)
    assert torch.allclose(heads.last_losses, fused, rtol=2e-2)


def test_story_only_batches_are_the_originals(corpus):
    """ProbeBatches against the original's convert_batch_to_probe_classification_batch (story
    text and labels, re-implemented from the decoded windows as it did)."""
    cache, _ = corpus
    tok = Tokenizer(os.path.join(cache, "tok8192.model"))
    windows = BatchLoader(os.path.join(cache, "tok8192", "pretrain-all"), "train", 16, 128, seed=3, split_on_bos=True,
                          bos_id=tok.bos_id)
    x, _ = next(BatchLoader(os.path.join(cache, "tok8192", "pretrain-all"), "train", 16, 128, seed=3, split_on_bos=True,
                            bos_id=tok.bos_id))
    batch = next(ProbeBatches(windows, tok))
    expected = []
    for row in x.tolist():
        s = tok.decode(row)
        if "\nStory: " not in s:  # the original failed on such a batch; we leave the row out
            continue
        story = re.split(r"(?:Sentence: |Features: |Words: |Summary: )", s.split("\nStory: ")[1])[0]
        classes = re.search(r"(Features: )(.*)\n", s).group(2)
        feats = [STORY_FEATURES.index(f.strip().lower()) for f in classes.split(",")] if len(classes) > 0 else []
        expected.append((story.strip(), [float(j in feats) for j in range(6)]))
    assert len(expected) >= 12 and batch["tokens"].shape[0] == len(expected)
    for i, (story, labels) in enumerate(expected):
        n = int(batch["lengths"][i])
        ids = batch["tokens"][i].tolist()
        assert ids[0] == tok.bos_id and tok.bos_id not in ids[1:n] and all(t == 0 for t in ids[n:])
        assert tok.decode(ids[1:n]).strip() == story
        assert batch["labels"][i].tolist() == labels
    # probes_classes=2: the first two features
    two = next(ProbeBatches(BatchLoader(os.path.join(cache, "tok8192", "pretrain-all"), "train", 16, 128, seed=3,
                                        split_on_bos=True, bos_id=tok.bos_id), tok, n_classes=2))
    assert torch.equal(two["labels"], batch["labels"][:, :2])


# ---------------------------------------------------------------------- whole runs

def probe_names(keys, n_probes, n_classes=6):
    names = set()
    for key in keys:
        names.add(f"loss/{key}")
        for i in range(n_probes):
            names |= {f"loss/{key}/probe_{i}", f"acc/{key}/probe_{i}"}
            names |= {f"acc/{key}/feat_{j}/probe_{i}" for j in range(n_classes)}
    return names


@pytest.mark.slow
def test_probe_run(corpus, tmp_path):
    cache, base = corpus
    out = str(tmp_path / "probe")
    run_main("train.py", args(corpus, out, eval_dataset_names="pretrain-all"), check=True)
    evals = records(out, "eval")
    assert [r["iter"] for r in evals] == [0, 2, 4]
    for r in evals:
        assert set(r) - {"iter", "kind", "time", "best_val_loss"} == probe_names(["train", "test", "pretrain-all"], 2)
        assert r["loss/test"] == pytest.approx(r["loss/test/probe_0"] + r["loss/test/probe_1"])
        assert all(0 <= r[k] <= 1 for k in r if k.startswith("acc/"))
    assert evals[-1]["loss/test"] < evals[0]["loss/test"]  # the probes learn
    assert not records(out, "table")  # a probe run makes no generations (as the original)
    train = records(out, "train")
    assert train[0]["loss/train"] == pytest.approx(2 * 0.6931, abs=0.01)  # two heads' BCE at N(0, 0.02)
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    base_w = model_weights(base)
    assert set(ckpt["model"]) == set(base_w) and all(torch.equal(ckpt["model"][k], base_w[k]) for k in base_w)
    assert {k: tuple(v.shape) for k, v in ckpt["probes"].items()} == {"0.weight": (6, 32), "1.weight": (6, 32)}
    assert ckpt["param_names"] == ["0.weight", "1.weight"] and "lenses" not in ckpt
    # the checkpoint is a plain model for every tool
    from tinylab.eval.common import load_model
    model, _ = load_model(out)
    assert model.params.n_layers == 3
    run_main("export.py", [str(tmp_path / "m.bin"), f"--checkpoint={out}"], check=True)
    run_main("sample.py", [f"--checkpoint={out}", "--max_new_tokens=4", "--device=cpu"], check=True)
    run_main("evaluation/probe.py", [f"--checkpoint={out}", "--dataset=pretrain-all", "--num_train=20",
                                     "--num_test=10", "--iters=5", "--device=cpu"], check=True)
    # and fine-tuning from it starts fresh heads (probes) or none (a plain run)
    again = str(tmp_path / "again")
    run_main("train.py", args(corpus, again, model_dir=out, probes=False, max_iters=1, eval_interval=1,
                              max_new_tokens=0), check=True)
    assert "probes" not in torch.load(os.path.join(again, "ckpt.pt"), weights_only=True)


@pytest.mark.slow
def test_probe_run_resumes_bit_identically(corpus, tmp_path):
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    common = dict(max_iters=6, checkpoint_interval=3, eval_interval=3, eval_iters=1)
    run_main("train.py", args(corpus, full, **common), check=True)
    run_main("train.py", args(corpus, part, **dict(common, max_iters=3)), check=True)
    run_main("train.py", args(corpus, part, **dict(common, init_from="resume_train")), check=True)
    losses = {r["iter"]: r["loss/train"] for r in records(full, "train")}
    assert {r["iter"]: r["loss/train"] for r in records(part, "train")} == losses and len(losses) == 6
    a = torch.load(os.path.join(full, "ckpt.pt"), weights_only=True)
    b = torch.load(os.path.join(part, "ckpt.pt"), weights_only=True)
    assert all(torch.equal(a["probes"][k], b["probes"][k]) for k in a["probes"])


@pytest.mark.slow
def test_lens_run(corpus, tmp_path):
    out, ref = str(tmp_path / "lens"), str(tmp_path / "ref")
    run_main("train.py", args(corpus, out, probes=False, lenses=True, init_lens_with_unembed=True, batch_size=2,
                              learning_rate=1e-3), check=True)
    evals = records(out, "eval")
    names = {f"loss/{k}" for k in ("train", "test")} | {f"loss/{k}/probe_{i}" for k in ("train", "test") for i in range(3)}
    for r in evals:
        assert set(r) - {"iter", "kind", "time", "best_val_loss"} == names
        assert r["loss/test"] == pytest.approx(sum(r[f"loss/test/probe_{i}"] for i in range(3)))
    # probe_2 is the frozen model's own loss: the same at every evaluation, and a plain run's loss/test
    run_main("train.py", args(corpus, ref, probes=False, eval_only=True, batch_size=2), check=True)
    plain = records(ref, "eval")[0]["loss/test"]
    assert [r["loss/test/probe_2"] for r in evals] == [pytest.approx(plain, abs=1e-6)] * len(evals)
    assert evals[-1]["loss/test/probe_0"] < evals[0]["loss/test/probe_0"]  # the lenses learn
    assert records(out, "table")  # a lens run keeps the generation evaluation
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert {k: tuple(v.shape) for k, v in ckpt["lenses"].items()} == {"0.weight": (8192, 32), "1.weight": (8192, 32)}
    base_w = model_weights(corpus[1])
    assert all(torch.equal(ckpt["model"][k], base_w[k]) for k in base_w)


def test_original_format_heads_load(corpus, tmp_path):
    """A checkpoint of the original's model.py keeps its probes in the model's state dict
    (probes.<i>.weight): probes=True starts from them, and writes them under "probes"."""
    cache, base = corpus
    ckpt = torch.load(os.path.join(base, "ckpt.pt"), weights_only=True)
    trained = {f"probes.{i}.weight": torch.full((6, 32), 0.5 + i) for i in range(2)}
    ckpt["model"].update(trained)
    orig = tmp_path / "orig"
    orig.mkdir()
    torch.save(ckpt, orig / "ckpt.pt")
    heads = heads_for_config(dict(TRAIN.defaults(), probes=True, init_from="resume_model"), tiny_model(n_layers=3), ckpt)
    assert all(torch.equal(heads[i].weight, trained[f"probes.{i}.weight"]) for i in range(2))
    out = str(tmp_path / "run")
    run_main("train.py", args(corpus, out, model_dir=str(orig), max_iters=1, eval_interval=1, eval_iters=1,
                              learning_rate=1e-3), check=True)
    saved = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert not any(k.startswith("probes.") for k in saved["model"])
    assert all(torch.allclose(saved["probes"][f"{i}.weight"], trained[f"probes.{i}.weight"], atol=0.01) for i in range(2))


@pytest.mark.parametrize("over, fragment", [
    (dict(lenses=True), "probes=True and lenses=True"),
    (dict(probes=False, init_lens_with_unembed=True), "init_lens_with_unembed=True needs lenses=True"),
    (dict(dataset_name="words-only"), "has no feature labels"),
    (dict(eval_dataset_names="words-only"), "eval_dataset_names words-only"),
    (dict(grow_schedule="2:weights"), "cannot grow"),
    (dict(warmup_seq=1000, warmup_seq_start=16), "warmups do not apply"),
    (dict(probes_classes=7), "--probes_classes=7: must be in [1, 6]"),
    (dict(feature_eval="Twist"), "feature_eval judges generations"),
])
def test_refused_before_anything_is_written(corpus, tmp_path, over, fragment):
    out = tmp_path / "run"
    assert_one_line_error(run_main("train.py", args(corpus, str(out), **over)), fragment)
    assert not out.exists()


@pytest.mark.slow
def test_resume_keeps_its_kind_of_heads(corpus, tmp_path):
    cache, _ = corpus
    one_layer = str(tmp_path / "one")
    save_tiny_checkpoint(os.path.join(one_layer, "ckpt.pt"), tiny_model(max_seq_len=128, n_layers=1), cache_dir=cache)
    out = tmp_path / "run"
    assert_one_line_error(run_main("train.py", args(corpus, str(out), model_dir=one_layer)), "needs n_layers >= 2")
    assert not out.exists()
    probe_run, plain_run = str(tmp_path / "p"), str(tmp_path / "l")
    run_main("train.py", args(corpus, probe_run, max_iters=1, eval_interval=1, eval_iters=1), check=True)
    run_main("train.py", args(corpus, plain_run, probes=False, max_iters=1, eval_interval=1, eval_iters=1,
                              max_new_tokens=0), check=True)
    before = {p: open(os.path.join(p, "metrics.jsonl")).read() for p in (probe_run, plain_run)}
    assert_one_line_error(run_main("train.py", args(corpus, probe_run, probes=False, init_from="resume_train")),
                          "resume it with probes=True")
    assert_one_line_error(run_main("train.py", args(corpus, plain_run, init_from="resume_train")),
                          "the checkpoint has no probes")
    assert {p: open(os.path.join(p, "metrics.jsonl")).read() for p in before} == before
    assert json.load(open(os.path.join(probe_run, "config.json")))["probes"] is True
    assert read_metrics(probe_run)
