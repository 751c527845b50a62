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
from conftest import TOK8192, WIKITEXT, assert_one_line_error, run_main, save_tiny_checkpoint, tiny_model

from tinylab.perplexity import sliding_window_nll, token_stream, window_spans
from tinylab.tokenizer import Tokenizer

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
    from tinylab.checkpoint import load_checkpoint, model_from_checkpoint
    from tinylab.interop import export_hf
    ckpt = tiny_ckpt(tmp_path)
    export_hf(model_from_checkpoint(load_checkpoint(ckpt)), str(tmp_path / "hf"), tokenizer=TOK8192, log=lambda *a: None)
    data = tmp_path / "wiki.txt"
    data.write_text("".join(open(WIKITEXT, encoding="utf-8").read().splitlines(keepends=True)[:20]), encoding="utf-8")
    ours = wikitext([f"--checkpoint={ckpt}", f"--tokenizer_model={TOK8192}", f"--data={data}", "--device=cpu"],
                    check=True)
    hf = wikitext([f"--checkpoint={tmp_path / 'hf'}", f"--data={data}", "--device=cpu"], check=True)
    a, b = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (ours, hf))
    assert a["tokens"] == b["tokens"] and a["ppl"] == pytest.approx(b["ppl"], rel=1e-5)
