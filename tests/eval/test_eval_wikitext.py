"""evaluation/eval_wikitext.py: the sliding-window loss equals a brute-force per-token computation
(every token scored once, with exactly the context its window gives it), stride = window is the
plain block evaluation, and the CLI's numbers and errors."""
import json
import math
import socket
import time

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    TOK8192,
    WIKITEXT,
    assert_one_line_error,
    run_main,
    save_tiny_checkpoint,
    save_tiny_gpt2,
    tiny_model,
    write_tokens,
)

from tinylab.data.tokenizer import Tokenizer
from tinylab.eval.perplexity import sliding_window_nll, token_stream, window_spans

W = 32  # window (the model's max_seq_len)


def wikitext(argv, **kw):
    return run_main("evaluation/eval_wikitext.py", argv, **kw)


def tiny_ckpt(tmp_path):
    """A tiny random checkpoint whose config names an empty data cache: the tokenizer must be given."""
    return save_tiny_checkpoint(tmp_path / "ckpt.pt", tiny_model(max_seq_len=W), cache_dir=str(tmp_path))


@pytest.fixture(scope="module")
def stream():
    tok = Tokenizer(TOK8192)
    rows = open(WIKITEXT, encoding="utf-8").read().splitlines(keepends=True)[:40]
    ids, _ = token_stream(rows, tok, "rows")
    return ids[:301]  # an odd length: the last window is a partial one


@pytest.fixture(scope="module")
def model():
    return tiny_model(max_seq_len=W, dtype=torch.float64)


def brute_force(model, ids, window, stride, bos_id):
    """Each token alone: token t belongs to the first window k (starting at k*stride) whose end
    k*stride + window passes t, and is predicted from that window's tokens before it (after BOS).
    Without BOS a window's own first token has no context and is not scored."""
    total, count = 0.0, 0
    for t in range(len(ids)):
        k = max(0, (t - window) // stride + 1)
        begin = k * stride
        if bos_id is None and t == begin:
            continue
        inp = ([bos_id] if bos_id is not None else []) + ids[begin:t]
        logits = model(torch.tensor([inp]), all_logits=True)[0, -1]
        total -= F.log_softmax(logits.double(), -1)[ids[t]].item()
        count += 1
    return total, count


@pytest.mark.slow
@pytest.mark.parametrize("stride,bos", [(W, True), (W, False), (8, True), (8, False), (13, True), (1, True)])
def test_sliding_window_equals_brute_force(model, stream, stride, bos):
    bos_id = 1 if bos else None
    nll, n = sliding_window_nll(model, stream, W, stride, bos_id, batch_size=5)
    ref_nll, ref_n = brute_force(model, stream, W, stride, bos_id)
    assert n == ref_n
    assert nll == pytest.approx(ref_nll, rel=1e-10)
    # with BOS every token is scored exactly once; without it only the very first token is not
    # (stride < window), or the first token of each block (stride = window)
    if bos:
        assert n == len(stream)
    elif stride < W:
        assert n == len(stream) - 1
    else:
        assert n == len(stream) - math.ceil(len(stream) / W)


def test_stride_equal_window_is_block_evaluation(model, stream):
    """No BOS, stride = window: non-overlapping blocks of W tokens, W - 1 predictions each."""
    total, count = 0.0, 0
    for b in range(0, len(stream), W):
        block = torch.tensor([stream[b:b + W]])
        if block.shape[1] < 2:
            continue
        model(block[:, :-1], block[:, 1:])
        total += model.last_loss.item() * (block.shape[1] - 1)
        count += block.shape[1] - 1
    nll, n = sliding_window_nll(model, stream, W, W, None, batch_size=3)
    assert n == count and nll == pytest.approx(total, rel=1e-10)


def test_smaller_stride_gives_more_context():
    spans = window_spans(100, 32, 8, bos=True)
    scored = [i for _, end, first in spans for i in range(first, end)]
    assert scored == list(range(100))  # each token exactly once
    assert all(end - begin <= 32 for begin, end, _ in spans)
    assert window_spans(64, 32, 32, bos=False) == [(0, 32, 1), (32, 64, 33)]


def test_cli_ppl_bpb_tokens(tmp_path):
    ckpt = tiny_ckpt(tmp_path)
    data = tmp_path / "wiki.txt"
    rows = open(WIKITEXT, encoding="utf-8").read().splitlines(keepends=True)[:30]
    data.write_text("".join(rows), encoding="utf-8")
    out = tmp_path / "m.json"
    proc = wikitext([f"--checkpoint={ckpt}", f"--tokenizer_model={TOK8192}", f"--data={data}", "--stride=16",
                     f"--out={out}", "--device=cpu"], check=True)
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(metrics) == {"ppl", "bpb", "tokens"}
    assert json.loads(out.read_text()) == metrics
    # the same numbers from the library with the same model, and bpb from the raw byte count
    model = tiny_model(max_seq_len=W)
    ids, n_bytes = token_stream(rows, Tokenizer(TOK8192), "rows")
    nll, n = sliding_window_nll(model, ids, W, 16, 1)
    assert n_bytes == len("".join(rows).encode("utf-8")) and metrics["tokens"] == n == len(ids)
    assert metrics["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    assert metrics["bpb"] == pytest.approx(nll / (math.log(2) * n_bytes), rel=1e-5)
    # jsonl input with the same rows gives the same result
    jl = tmp_path / "wiki.jsonl"
    jl.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    proc = wikitext([f"--checkpoint={ckpt}", f"--tokenizer_model={TOK8192}", f"--data={jl}", "--stride=16",
                     "--device=cpu"], check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == metrics


def test_cli_bad_input(tmp_path):
    ckpt = tiny_ckpt(tmp_path)
    base = [f"--checkpoint={ckpt}", f"--tokenizer_model={TOK8192}", "--device=cpu"]
    assert_one_line_error(wikitext([f"--checkpoint={tmp_path}/nope.pt", f"--data={WIKITEXT}"]), "checkpoint not found")
    assert_one_line_error(wikitext(base + [f"--data={tmp_path}/missing.txt"]), "data file not found")
    assert_one_line_error(wikitext(base + [f"--data={WIKITEXT}", "--stride=64"]), "--stride")
    assert_one_line_error(wikitext(base + [f"--data={WIKITEXT}", "--window=4096"]), "max_seq_len")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{not json\n')
    assert_one_line_error(wikitext(base + [f"--data={bad}"]), "bad.jsonl:2")
    # offline (the tests run with HF_DATASETS_OFFLINE=1): the HF test split is one clear line
    assert_one_line_error(wikitext(base + ["--data=hf"], env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}),
                          "--data=PATH")


def test_cli_unreachable_hub_fails_at_once(tmp_path, monkeypatch):
    """Online, but the hub (HF_ENDPOINT, here a closed local port) does not answer: one quick probe
    and one line, not datasets' half-minute of retries with a warning line each. In this process,
    `datasets` read its switches when first imported, so it is not allowed to be asked at all."""
    import datasets

    def no_retries(*args, **kwargs):
        raise AssertionError("datasets asked an unreachable hub")
    monkeypatch.setattr(datasets, "load_dataset", no_retries)
    ckpt = tiny_ckpt(tmp_path)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    env = {"HF_DATASETS_OFFLINE": "0", "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"),
           **{k: "" for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")}}
    t0 = time.time()
    proc = wikitext([f"--checkpoint={ckpt}", f"--tokenizer_model={TOK8192}", "--device=cpu", "--data=hf"], env=env)
    assert_one_line_error(proc, f"the hub {endpoint} cannot be reached", "--data=PATH")
    assert time.time() - t0 < 20  # datasets' retries took 27 s


def test_hf_llama_folder_gives_the_same_numbers(tmp_path):
    """An HF Llama folder (with its tokenizer.model) is imported in memory: same perplexity."""
    from tinylab.core.checkpoint import load_checkpoint, model_from_checkpoint
    from tinylab.interop.hf import export_hf
    ckpt = tiny_ckpt(tmp_path)
    export_hf(model_from_checkpoint(load_checkpoint(ckpt)), str(tmp_path / "hf"), tokenizer=TOK8192, log=lambda *a: None)
    data = tmp_path / "wiki.txt"
    data.write_text("".join(open(WIKITEXT, encoding="utf-8").read().splitlines(keepends=True)[:20]), encoding="utf-8")
    ours = wikitext([f"--checkpoint={ckpt}", f"--tokenizer_model={TOK8192}", f"--data={data}", "--device=cpu"],
                    check=True)
    hf = wikitext([f"--checkpoint={tmp_path / 'hf'}", f"--data={data}", "--device=cpu"], check=True)
    a, b = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (ours, hf))
    assert a["tokens"] == b["tokens"] and a["ppl"] == pytest.approx(b["ppl"], rel=1e-5)


# ---------------------------------------------------------------------- staged-training's `eval` and `train`
# (docs/evaluation.md, "The staged-training repository's commands")

def last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


def files_of(root):
    """{path: bytes} of every file under root: bad input must leave it exactly as it was."""
    import os
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            out[os.path.join(d, n)] = open(os.path.join(d, n), "rb").read()
    return out


def original_group_texts(block_size):
    """staged-training's tools/common.py get_group_texts_function, verbatim."""
    def group_texts(examples):
        concatenated_examples = {k: sum(examples[k], []) for k in examples.keys()}
        total_length = len(concatenated_examples[list(examples.keys())[0]])
        if total_length >= block_size:
            total_length = (total_length // block_size) * block_size
        result = {k: [t[i: i + block_size] for i in range(0, total_length, block_size)]
                  for k, t in concatenated_examples.items()}
        result["labels"] = result["input_ids"].copy()
        return result
    return group_texts


def our_block_losses(model, blocks):
    """Each block alone through our model's own loss: model(x, y) with x = block[:-1]."""
    out = []
    for b in blocks:
        b = torch.tensor([list(b)])
        model(b[:, :-1], b[:, 1:])
        out.append(model.last_loss.item())
    return out


def test_group_texts_blocks_is_the_originals_datasets_map():
    """The blocks are exactly what datasets.map(group_texts, batched=True) made (1000-row batches,
    each concatenated and cut, its remainder dropped), and contiguous_shards is Dataset.shard's."""
    import datasets

    from tinylab.eval.perplexity import contiguous_shards, group_texts_blocks
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 50, (int(n),), generator=g).tolist() for n in torch.randint(0, 40, (2500,), generator=g)]
    ds = datasets.Dataset.from_dict({"input_ids": rows})
    for block in (16, 64):
        ref = ds.map(original_group_texts(block), batched=True)["input_ids"]
        assert group_texts_blocks(rows, block) == [b for b in ref if len(b) >= 2]
        assert len(ref) < sum(map(len, rows)) // block  # remainders dropped per 1000 rows, not once
    for n, k in [(2500, 8), (10, 3), (3, 8)]:
        small = datasets.Dataset.from_dict({"i": list(range(n))})
        assert [list(r) for r in contiguous_shards(n, k)] == \
            [small.shard(num_shards=min(k, n), index=i, contiguous=True)["i"] for i in range(min(k, n))]


@pytest.fixture()
def eval_setup(tmp_path):
    """A tiny checkpoint (context 32, vocabulary 8192, tok8192) and a token file of 10 blocks of 32
    ([BOS] + 30 tokens + [EOS]) plus 7 tokens left over."""
    ckpt = save_tiny_checkpoint(tmp_path / "ckpt.pt", tiny_model(max_seq_len=W),
                                config={"tokenizer_model": TOK8192, "vocab_size": 8192})
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 8192, (10 * 30 + 7,), generator=g).tolist()
    return ckpt, write_tokens(tmp_path / "val.bin", ids), ids


def test_original_eval_mmap_is_the_mean_block_loss(eval_setup, tmp_path):
    ckpt, data, ids = eval_setup
    blocks = [[1] + ids[i * 30:(i + 1) * 30] + [2] for i in range(10)]  # tok8192: BOS 1, EOS 2
    ref = our_block_losses(tiny_model(max_seq_len=W), blocks)
    out = tmp_path / "m.json"
    proc = wikitext(["eval", "--checkpoint-file", ckpt, "--dataset", "mmap", "--dataset-path", data,
                     "--block-size", "32", "--batch-size", "3", "--device=cpu", f"--out={out}"], check=True)
    m = last_json(proc)
    assert set(m) == {"loss", "ppl", "blocks", "tokens"} and json.loads(out.read_text()) == m
    assert m["blocks"] == 10 and m["tokens"] == 10 * 31
    assert m["loss"] == pytest.approx(sum(ref) / 10, rel=1e-5) and m["ppl"] == pytest.approx(math.exp(m["loss"]))
    assert f"Final loss: {m['loss']:.4f} (ppl = {m['ppl']:.4f})" in proc.stdout
    # 10 blocks in batches of 3: the original's mean over batches weights the last block 3x; named, not reported
    assert "mean over batches" in proc.stdout
    # --max-steps: the first N batches only; the click spellings and the project's both work
    m2 = last_json(wikitext(["eval", f"--checkpoint_file={ckpt}", "--dataset=mmap", f"--dataset_path={data}",
                             "--block_size=32", "--batch_size=3", "--max-steps", "2", "--device=cpu"], check=True))
    assert m2["blocks"] == 6 and m2["loss"] == pytest.approx(sum(ref[:6]) / 6, rel=1e-5)


def test_original_eval_skip_loading_weights_is_the_initial_architecture(eval_setup):
    ckpt, data, ids = eval_setup
    argv = ["eval", "--checkpoint-file", ckpt, "--dataset", "mmap", "--dataset-path", data, "--block-size", "32",
            "--device=cpu"]
    blocks = [[1] + ids[i * 30:(i + 1) * 30] + [2] for i in range(10)]
    init = our_block_losses(tiny_model(seed=5, max_seq_len=W), blocks)  # the same shape, built after manual_seed(5)
    # a bare flag followed by another flag, as click allows
    m = last_json(wikitext(argv + ["--skip-loading-weights", "--seed=5"], check=True))
    assert m["loss"] == pytest.approx(sum(init) / 10, rel=1e-5)
    assert m["loss"] != pytest.approx(last_json(wikitext(argv, check=True))["loss"], rel=1e-3)


def test_original_eval_wikitext2_tokenizes_rows_and_groups_them(eval_setup, monkeypatch):
    """--dataset wikitext2 with the hub replaced by the WikiText excerpt: rows tokenized one by
    one (no BOS), concatenated, cut into blocks of 32 with the remainder dropped."""
    import datasets

    from tinylab.interop import hub
    ckpt, _, _ = eval_setup
    rows = open(WIKITEXT, encoding="utf-8").read().splitlines(keepends=True)[:60]
    asked = []

    def fake_hub(name, config=None, split=None, **kw):
        asked.append((name, config, split))
        return datasets.Dataset.from_dict({"text": rows})
    monkeypatch.setattr(hub, "load_dataset", fake_hub)
    m = last_json(wikitext(["eval", "--checkpoint-file", ckpt, "--block-size", "32", "--batch-size", "4",
                            "--device=cpu"], check=True))
    assert asked == [("wikitext", "wikitext-103-raw-v1", "test")]
    stream = [t for r in Tokenizer(TOK8192).encode_batch(rows, bos=False) for t in r]
    blocks = [stream[i:i + 32] for i in range(0, len(stream) // 32 * 32, 32)]
    ref = our_block_losses(tiny_model(max_seq_len=W), blocks)
    assert m["blocks"] == len(blocks) and m["loss"] == pytest.approx(sum(ref) / len(ref), rel=1e-5)


def test_original_eval_hf_model_is_the_originals_loop(tmp_path, monkeypatch):
    """--model-name: a local tiny GPT-2 through transformers gives the original's own numbers
    (its loop, verbatim in spirit: outputs.loss of GPT2LMHeadModel(**batch), mean over batches),
    on token files (BOS = EOS = <|endoftext|>) and on wikitext2 (its tokenizer called on the rows)."""
    import datasets

    from tinylab.interop import hub
    folder, hf = save_tiny_gpt2(tmp_path / "gpt2")
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 256, (8 * 30,), generator=g).tolist()
    data = write_tokens(tmp_path / "gpt2.bin", ids)
    m = last_json(wikitext(["eval", "--model-name", folder, "--dataset", "mmap", "--dataset-path", data,
                            "--block-size", "32", "--batch-size", "4", "--device=cpu"], check=True))
    batches = torch.tensor([[256] + ids[i * 30:(i + 1) * 30] + [256] for i in range(8)]).split(4)
    with torch.no_grad():
        ref = [hf(input_ids=b, labels=b).loss.item() for b in batches]
    assert m["blocks"] == 8 and m["loss"] == pytest.approx(sum(ref) / len(ref), rel=1e-5)

    from transformers import AutoTokenizer
    rows = open(WIKITEXT, encoding="utf-8").read().splitlines(keepends=True)[:30]
    monkeypatch.setattr(hub, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict({"text": rows}))
    m = last_json(wikitext(["eval", "--model-name", folder, "--block-size", "64", "--batch-size", "2",
                            "--max-steps", "6", "--device=cpu"], check=True))
    tok = AutoTokenizer.from_pretrained(folder)
    grouped = datasets.Dataset.from_dict({"input_ids": tok(rows)["input_ids"]}).map(original_group_texts(64), batched=True)
    batches = torch.tensor(grouped["input_ids"][:12]).split(2)
    with torch.no_grad():
        ref = [hf(input_ids=b, labels=b).loss.item() for b in batches]
    assert m["blocks"] == 12 and m["loss"] == pytest.approx(sum(ref) / len(ref), rel=1e-5)


def test_original_eval_lightning_gpt2_checkpoint(tmp_path):
    """A staged-training (Lightning) GPT-2 checkpoint: built as the original did from --model-name's
    config (width and depth from the weights, n_head 8, n_positions 1024): the same numbers as the
    model itself. An 'alibi' / 'rotary' file name (the original's fork) is refused in one line."""
    folder, hf = save_tiny_gpt2(tmp_path / "gpt2", n_positions=1024, n_head=8)
    ckpt = {"state_dict": {f"model.{k}": v for k, v in hf.state_dict().items()}, "epoch": 3, "global_step": 10}
    torch.save(ckpt, tmp_path / "epoch=3.ckpt")
    data = write_tokens(tmp_path / "gpt2.bin", list(range(0, 240)))
    argv = ["--dataset", "mmap", "--dataset-path", data, "--block-size", "32", "--device=cpu"]
    direct = last_json(wikitext(["eval", "--model-name", folder] + argv, check=True))
    proc = wikitext(["eval", "--checkpoint-file", str(tmp_path / "epoch=3.ckpt"), "--model-name", folder] + argv,
                    check=True)
    assert "Adjusting hidden_size to 32, num_layers to 2" in proc.stdout
    assert last_json(proc)["loss"] == pytest.approx(direct["loss"], rel=1e-6)
    torch.save(ckpt, tmp_path / "rotary.ckpt")
    assert_one_line_error(wikitext(["eval", "--checkpoint-file", str(tmp_path / "rotary.ckpt"), "--model-name", folder]
                                   + argv), "rotary", "fork of transformers")


def test_original_eval_bad_input(eval_setup, tmp_path):
    ckpt, data, _ = eval_setup
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    big = write_tokens(tmp_path / "big.bin", [9000] * 90)
    before = files_of(tmp_path)
    base = ["eval", "--checkpoint-file", ckpt, "--device=cpu", "--block-size", "32", f"--out={tmp_path / 'm.json'}"]
    for argv, fragments in [
        (base + ["--dataset-path", data], ("--dataset-path is only valid with --dataset=mmap",)),
        (base + ["--dataset", "wikitext2", "--dataset-path", data], ("only valid with --dataset=mmap",)),
        (base + ["--dataset", "mmap"], ("--dataset=mmap needs --dataset-path",)),
        (base + ["--dataset", "mmap", "--dataset-path", str(odd)], ("3 bytes", "not a whole number of uint16")),
        (base + ["--dataset", "mmap", "--dataset-path", big], ("token id 9000", "vocabulary of 8192")),
        (base + ["--dataset", "mmap", "--dataset-path", str(tmp_path / "none.bin")], ("not found",)),
        (["eval", "--checkpoint-file", ckpt, "--dataset", "mmap", "--dataset-path", data, "--block-size", "64"],
         ("--block-size=64 exceeds the model's max_seq_len=32",)),
        (base + ["--dataset", "mmap", "--dataset-path", data, "--block-size", "2000"], ("fewer than one block",)),
        (base + ["--dataset", "imdb"], ("--dataset='imdb': must be one of wikitext2, openwebtext, mmap",)),
        (base + ["--blocksize", "8"], ("unrecognized arguments: --blocksize",)),
        (base + ["--batch-size", "0"], ("--batch_size=0: must be in [1, inf)",)),
        (["eval", "--checkpoint-file", str(tmp_path / "no.pt")], ("checkpoint not found",)),
        (base + ["--model-name", "gpt2"], ("--model-name=gpt2 and --checkpoint-file",)),
        (base, ("wikitext-103-raw-v1", "offline", "--dataset=mmap")),  # the tests run offline
        (["eval", "--dataset", "mmap", "--dataset-path", data, "--block-size", "32"], ("--model-name=gpt2",)),
    ]:
        assert_one_line_error(wikitext(argv), *fragments)
    assert files_of(tmp_path) == before  # nothing written, nothing changed


# ---- `train`

def train_files(tmp_path, n_train=40 * 14, n_valid=8 * 14, top=300):
    g = torch.Generator().manual_seed(3)
    return (write_tokens(tmp_path / "train.bin", torch.randint(3, top, (n_train,), generator=g).tolist()),
            write_tokens(tmp_path / "valid.bin", torch.randint(3, top, (n_valid,), generator=g).tolist()))


def train(tmp_path, log_dir, *extra, steps=8, check=True):
    tr, va = train_files(tmp_path)
    argv = ["train", tr, va, str(log_dir), "--block-size", "16", "--batch-size", "4", "--grad-accum", "2",
            "--hidden-size", "32", "--num-layers", "2", "--num-heads", "4", "--warmup-steps", "100",
            "--train-steps", str(steps), "--validate-every", "3", "--checkpoint-every", "4", "--validation-steps",
            "2", "--device", "cpu", *extra]
    return wikitext(argv, check=check)


def every_train_loss(run_dir):
    from conftest import records
    return {r["iter"]: r["loss/train"] for r in records(run_dir, "train")}


def test_original_train_runs_our_loop_and_logs_validation(tmp_path):
    from conftest import records

    from tinylab.training.optim import lr_at
    from tinylab.training.options import ScheduleOptions
    run = tmp_path / "run"
    train(tmp_path, run, "--train-steps", "12", "--warmup-steps", "3", steps=12)
    info = json.loads((run / "staged_training.json").read_text())
    cfg = json.loads((run / "config.json").read_text())
    assert info["vocab_size"] == cfg["vocab_size"] == 300  # the files' largest id (< 300, seeded) + 1
    n = info["non_embedding_params"]
    assert cfg["learning_rate"] == pytest.approx(0.003239 - 0.0001395 * math.log(n))
    from model import Transformer
    from tinylab.training.options import model_args_from_config
    assert Transformer(model_args_from_config(cfg)).num_params(non_embedding=True) == n
    assert (cfg["dim"], cfg["n_layers"], cfg["n_heads"], cfg["max_seq_len"], cfg["gradient_accumulation_steps"],
            cfg["weight_decay"], cfg["grad_clip"], cfg["adam_eps"]) == (32, 2, 4, 16, 2, 0.0, 0.0, 1e-6)
    # the LR is transformers' get_linear_schedule_with_warmup at every step
    from transformers import get_linear_schedule_with_warmup
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg["learning_rate"])
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=12)
    for it in range(12):
        assert lr_at(it, ScheduleOptions.from_config(cfg)) == pytest.approx(opt.param_groups[0]["lr"], abs=1e-15)
        opt.step()
        sched.step()
    evals = records(str(run), "eval")
    assert [r["iter"] for r in evals] == [0, 3, 6, 9, 12]
    assert all(r["val_ppl"] == pytest.approx(math.exp(r["val_loss"])) for r in evals)
    # its checkpoint evaluates with `eval` (no tokenizer: BOS / EOS from staged_training.json), and the
    # first 2 batches of 4 blocks are the last validation loss
    va = str(tmp_path / "valid.bin")
    m = last_json(wikitext(["eval", "--checkpoint-file", str(run / "ckpt.pt"), "--dataset", "mmap", "--dataset-path",
                            va, "--block-size", "16", "--batch-size", "4", "--max-steps", "2", "--device=cpu"],
                           check=True))
    assert m["loss"] == pytest.approx(evals[-1]["val_loss"], rel=1e-5)


@pytest.mark.slow
def test_original_train_recover_continues_exactly(tmp_path):
    """8 steps in one go = 4 steps, then --recover to 8 (dropout 0.1 and a shuffled data order:
    the RNG, the data position and the optimizer come back exactly); --recover-from copies a run
    into an empty LOG_DIR and continues it the same way."""
    full, part, copy = tmp_path / "full", tmp_path / "part", tmp_path / "copy"
    train(tmp_path, full, "--checkpoint-every", "100", steps=8)
    train(tmp_path, part, steps=4)
    snapshot = files_of(part)
    train(tmp_path, copy, "--recover", "--recover-from", str(part), steps=8)
    assert files_of(part) == snapshot  # the source run is only read
    train(tmp_path, part, "--recover", steps=8)
    # log_interval 10: the logged losses are iterations 0 (before) and ... the last logged ones
    a, b, c = (json.loads((d / "config.json").read_text()) for d in (full, part, copy))
    assert a["max_iters"] == b["max_iters"] == c["max_iters"] == 8
    from tinylab.core.checkpoint import load_checkpoint
    fa, fb, fc = (load_checkpoint(str(d / "ckpt.pt")) for d in (full, part, copy))
    assert fa["iter_num"] == fb["iter_num"] == fc["iter_num"] == 8
    for k, v in fa["model"].items():
        assert torch.equal(v, fb["model"][k]) and torch.equal(v, fc["model"][k]), k
    from conftest import records
    assert [r["val_loss"] for r in records(str(full), "eval")] == [r["val_loss"] for r in records(str(part), "eval")]


def test_original_train_refuses_what_the_original_asserted(tmp_path):
    tr, va = train_files(tmp_path)
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    empty = tmp_path / "empty"
    empty.mkdir()
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    before = files_of(tmp_path)
    # --train-steps 2: a case that wrongly passes the checks ends at once (and then fails the test)
    base = ["--block-size", "16", "--hidden-size", "32", "--num-heads", "4", "--device", "cpu", "--train-steps", "2"]
    for argv, fragments in [
        ([tr, va, str(used)], ("LOG_DIR", "is not empty", "--recover")),
        ([tr, va, str(empty), "--recover"], ("--recover", "no ckpt.pt")),
        ([tr, va, str(tmp_path / "new"), "--recover-from", str(empty)], ("--recover-from needs --recover",)),
        ([tr, va, str(tmp_path / "new"), "--recover", "--recover-from", str(empty)], ("holds no run to recover",)),
        ([str(odd), va, str(tmp_path / "new")], ("TRAIN_DATASET_PATH", "not a whole number of uint16 tokens")),
        ([tr, str(tmp_path / "no.bin"), str(tmp_path / "new")], ("VALIDATION_DATASET_PATH not found",)),
        ([tr, va, str(tmp_path / "new"), "--vocab-size", "100"], ("token id", "outside --vocab-size of 100")),
        ([tr, va, str(tmp_path / "new"), "--hidden-size", "30"], ("--hidden-size=30", "--num-heads=4")),
        ([tr, va, str(tmp_path / "new"), "--block-size", "4096"], ("fewer than one block",)),
        ([tr, va, str(tmp_path / "new"), "--adam-beta2", "1.0"], ("--adam_beta2=1.0: must be in [0, 1)",)),
        ([tr, va, str(tmp_path / "new"), "--amp"], ("--amp", "needs a CUDA device")),
        ([tr, va], ("required: LOG_DIR",)),
        ([tr, va, str(tmp_path / "new"), "--num-head", "4"], ("unrecognized arguments: --num-head",)),
    ]:
        if "--amp" in argv and torch.cuda.is_available():
            continue
        assert_one_line_error(wikitext(["train"] + base + argv), *fragments)  # argv last: its flags win
    assert files_of(tmp_path) == before and not (tmp_path / "new").exists()


def test_chunk_batches_shuffle_resume_and_ranks(tmp_path):
    import numpy as np

    from tinylab.eval.token_files import ChunkBatches, TokenFile
    tf = TokenFile(write_tokens(tmp_path / "t.bin", np.arange(10 * 6 + 3) % 60000))
    one = ChunkBatches(tf, 8, 4, bos_id=1, eos_id=2, seed=7)
    stream = [next(one) for _ in range(6)]  # 24 chunks: 2.4 epochs of 10, every batch full
    seen = torch.cat([x[:, 1] for x, _ in stream[:5]])  # first token of each chunk: chunk id * 6
    assert sorted((seen[:10] // 6).tolist()) == list(range(10)) and sorted((seen[10:20] // 6).tolist()) == list(range(10))
    x, y = stream[0]
    assert x.shape == (4, 7) and (x[:, 0] == 1).all() and (y[:, -1] == 2).all() and torch.equal(x[:, 1:], y[:, :-1])
    # resume: a fresh loader given the state after 3 batches continues with batch 4
    resumed = ChunkBatches(tf, 8, 4, bos_id=1, eos_id=2, seed=7)
    probe = ChunkBatches(tf, 8, 4, bos_id=1, eos_id=2, seed=7)
    for _ in range(3):
        next(probe)
    resumed.load_state_dict(json.loads(json.dumps(probe.state_dict())))
    for want in stream[3:]:
        assert torch.equal(next(resumed)[0], want[0])
    # two ranks with batch 2 read exactly the one-process batches of 4
    r0, r1 = (ChunkBatches(tf, 8, 2, 1, 2, seed=7, rank=r, world_size=2) for r in (0, 1))
    for want in stream[:3]:
        assert torch.equal(torch.cat([next(r0)[0], next(r1)[0]]), want[0])
    with pytest.raises(Exception, match="another data stream"):
        ChunkBatches(tf, 8, 4, bos_id=1, eos_id=2, seed=8).load_state_dict(probe.state_dict())


def test_staged_training_warmup_longer_than_the_run_is_a_notice(tmp_path):
    """eval_wikitext.py train reproduces staged-training's trainer, which runs a warmup longer than
    --train-steps (get_linear_schedule_with_warmup: the rate rises all along): a notice, not an error."""
    from conftest import records
    proc = train(tmp_path, tmp_path / "run", steps=2, check=True)  # --warmup-steps 100
    assert "notice: --warmup-steps=100 is longer than --train-steps=2" in proc.stdout
    assert [r["iter"] for r in records(str(tmp_path / "run"), "train")] == [0]  # it ran (a record every 10 steps)
