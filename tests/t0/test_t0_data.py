"""tinylab/t0/ without a model: tokenisation conventions and length handling, mixture files and their
errors, train/valid overlap, packing, mixture proportions, exact stream resume, attention masks,
position ids, label masks and loss normalisation against brute-force / hand computations."""
import http.server
import json
import math
import socket
import threading
import time

import numpy as np
import pytest
import torch
from conftest import TOK8192

from tinylab.core.errors import UserError
from tinylab.data.tokenizer import Tokenizer
from tinylab.interop import hub
from tinylab.nn.attention import document_mask
from tinylab.t0.batches import loss_weights, position_ids, shift
from tinylab.t0.encode import ExampleEncoder, Examples, tokenize_rows
from tinylab.t0.mixture import Source, check_range_overlap, load_mixture, resolve_weights
from tinylab.t0.overlap import check_hash_overlap, example_hash
from tinylab.t0.packing import PackedStream, rows_to_arrays
from tinylab.t0.sources import read_records

PAIRS = [("Is the sky blue?", "yes"), ("Question: who is the hero?", " Lily"), ("What is 2 plus 2?", "4"),
         ("Story: Tom had a red ball.\nWhat colour was the ball?", "  red")]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(TOK8192)


@pytest.fixture(scope="module")
def tok_no_dummy(tmp_path_factory):
    """The same vocabulary without sentencepiece's dummy prefix (a tokenizer that needs an
    explicit space before targets)."""
    from sentencepiece import sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(open(TOK8192, "rb").read())
    proto.normalizer_spec.add_dummy_prefix = False
    path = tmp_path_factory.mktemp("tok") / "nodummy.model"
    path.write_bytes(proto.SerializeToString())
    return Tokenizer(str(path))


# ---------------------------------------------------------------------- tokenisation

@pytest.mark.parametrize("which", ["tok", "tok_no_dummy"])
def test_one_space_between_input_and_target(which, request):
    tok = request.getfixturevalue(which)
    enc = ExampleEncoder(tok)
    for inputs, target in PAIRS:
        i, t = enc.encode_inputs([inputs])[0], enc.encode_targets([target])[0]
        assert i[0] == tok.bos_id and tok.bos_id not in i[1:] and tok.eos_id not in i  # BOS first, no EOS
        assert t[-1] == tok.eos_id and tok.eos_id not in t[:-1] and tok.bos_id not in t  # EOS only at the end
        assert tok.decode(i + t) == inputs + " " + target.lstrip()


def test_target_space_false_keeps_the_target_as_given(tok, tok_no_dummy):
    for t_ in (tok, tok_no_dummy):
        enc = ExampleEncoder(t_, target_space=False, add_bos=False, add_eos=False)
        for inputs, target in [("2 + 2 =", "4"), ("Who?", " Lily")]:
            i, t = enc.encode_inputs([inputs])[0], enc.encode_targets([target])[0]
            assert tok.bos_id not in i and tok.eos_id not in t
            assert t_.decode(i + t) == inputs + target


def test_truncation_and_drop_counters(tok):
    enc = ExampleEncoder(tok, max_input_len=6, max_target_len=4)
    rows = [{"inputs": "one two three four five six seven eight nine ten", "targets": "a b c d e f g"},
            {"inputs": "short", "targets": "ok"},
            {"inputs": "  ", "targets": "x"}, {"inputs": "y", "targets": ""}, {"inputs": None, "targets": "z"}]
    full_in = tok.encode(rows[0]["inputs"], bos=True)
    full_tgt = tok.encode("a b c d e f g", bos=False, eos=True)
    ex = tokenize_rows("s", rows, enc)
    st = ex.stats
    assert (st["rows"], st["skipped_empty"], st["examples"]) == (5, 3, 2)
    assert (st["truncated_inputs"], st["truncated_targets"], st["dropped_too_long"]) == (1, 1, 0)
    ids, n_in = list(ex.ids[0]), ex.n_input[0]
    # inputs keep BOS and their last tokens (the question), targets their first tokens and EOS
    assert ids[:n_in] == [tok.bos_id] + full_in[-5:]
    assert ids[n_in:] == full_tgt[:3] + [tok.eos_id]
    assert st["tokens"] == len(ex.ids[0]) + len(ex.ids[1])

    drop = tokenize_rows("s", rows, ExampleEncoder(tok, max_input_len=6, max_target_len=4, truncation="drop"))
    assert (drop.stats["dropped_too_long"], drop.stats["examples"], drop.stats["truncated_inputs"]) == (1, 1, 0)
    short = len(ex.ids[1])
    row = tokenize_rows("s", rows, enc, row_len=short + 1)
    assert (row.stats["dropped_longer_than_row"], row.stats["examples"]) == (1, 1)
    assert row.shortest == short


def test_truncate_side_right_keeps_the_beginning_as_mesh_tf(tok):
    """truncate_side=right keeps an input's first max_input_len tokens: seqio's trim_dataset and
    Mesh-TF's pack_or_pad cut every feature as v[:length] (re-implemented here); left, the
    default, keeps BOS + the last tokens. Targets are cut the same way either side."""
    text = "one two three four five six seven eight nine ten"
    full_in = tok.encode(text, bos=True)
    full_tgt = tok.encode("a b c d e f g", bos=False, eos=True)
    right = ExampleEncoder(tok, max_input_len=6, max_target_len=4, truncate_side="right")
    left = ExampleEncoder(tok, max_input_len=6, max_target_len=4)
    assert right.clip_input(full_in) == full_in[:6] and right.clip_input(full_in)[0] == tok.bos_id
    assert left.clip_input(full_in) == [tok.bos_id] + full_in[-5:]
    assert right.clip_input(full_in[:6]) == left.clip_input(full_in[:6]) == full_in[:6]  # fits: unchanged
    no_bos = ExampleEncoder(tok, add_bos=False, max_input_len=4, truncate_side="right")
    assert no_bos.clip_input(full_in[1:]) == full_in[1:5]
    ex = tokenize_rows("s", [{"inputs": text, "targets": "a b c d e f g"}], right)
    ids, n_in = list(ex.ids[0]), ex.n_input[0]
    assert ids[:n_in] == full_in[:6] and ids[n_in:] == full_tgt[:3] + [tok.eos_id]
    assert (ex.stats["truncated_inputs"], ex.stats["truncated_targets"]) == (1, 1)
    # rank evaluation cuts its prompts with the same function
    from tinylab.t0.rank_eval import rank_examples
    rank, _ = rank_examples([{"inputs": text, "targets": "yes", "answer_choices": ["yes", "no"]}], right)
    assert rank[0][0] == full_in[:6]
    with pytest.raises(UserError, match="truncate_side must be 'left' or 'right'"):
        ExampleEncoder(tok, truncate_side="middle")
    from tinylab.schema import FINETUNE_T0
    with pytest.raises(UserError, match="truncate_side"):
        FINETUNE_T0.parse(["--model_dir=m", "--truncate_side=end"])
    assert FINETUNE_T0.parse(["--model_dir=m"])["truncate_side"] == "left"


# ---------------------------------------------------------------------- mixture files

def write(path, obj):
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_mixture_file_sources_ranges_and_megatron_line(tmp_path):
    a = jsonl(tmp_path / "a.jsonl", [{"inputs": f"q{i}", "targets": "t"} for i in range(10)])
    mix = write(tmp_path / "m.json", {"train": [{"name": "a", "path": "a.jsonl", "weight": 2, "range": "0:0.6"}],
                                      "valid": [{"name": "a_val", "path": a, "range": "0.6:1", "dataset": "a"}]})
    train, valid = load_mixture(mix)
    assert train[0].path == a and (train[0].start, train[0].end, train[0].weight) == (0.0, 0.6, 2.0)
    assert valid[0].dataset == "a"
    assert [r["inputs"] for r in read_records(train[0])] == [f"q{i}" for i in range(6)]
    # the rows really in the range (Megatron read rows 0..len(range) instead)
    assert [r["inputs"] for r in read_records(valid[0])] == [f"q{i}" for i in range(6, 10)]
    check_range_overlap(train, valid)
    line = write(tmp_path / "l.json", {"train": f"mix: 1 0:0.5 {a}, 3 0.5:1 {a}"})
    train, valid = load_mixture(line)
    assert [(s.weight, s.start, s.end) for s in train] == [(1.0, 0.0, 0.5), (3.0, 0.5, 1.0)] and valid == []


def test_p3_fields_parquet_and_score_eval_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"inputs_pretokenized": ["Premise. Choice?", "Premise. Choice?"],
                      "targets_pretokenized": [" yes", " no"], "answer_choices": [["yes", "no"], ["yes", "no"]],
                      "is_correct": [False, True], "inputs": [[1, 2], [1, 2]], "targets": [[3], [4]]})
    pq.write_table(table, tmp_path / "p3.parquet")
    rows = read_records(Source(name="p3", path=str(tmp_path / "p3.parquet")))
    # token-id fields are ignored for the *_pretokenized strings; one row per example (is_correct)
    assert rows == [{"inputs": "Premise. Choice?", "targets": " no", "answer_choices": ["yes", "no"]}]


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "not valid JSON"),
    ({"valid": []}, "field 'train'"),
    ({"train": []}, "non-empty list"),
    ({"train": [{"path": "a.jsonl"}]}, "field 'name'"),
    ({"train": [{"name": "a", "path": "a.jsonl", "weight": 0}]}, "field 'weight' must be a number > 0"),
    ({"train": [{"name": "a", "path": "a.jsonl", "weight": -1}]}, "field 'weight'"),
    ({"train": [{"name": "a", "path": "a.jsonl", "wieght": 1}]}, "unknown field 'wieght'"),
    ({"train": [{"name": "a"}]}, "'path' (local file) or 'hf'"),
    ({"train": [{"name": "a", "path": "a.jsonl", "range": "0.5:0.2"}]}, "field 'range'"),
    ({"train": [{"name": "a", "path": "a.jsonl"}, {"name": "a", "path": "b.jsonl"}]}, "used twice"),
    ({"train": [{"name": "a", "path": "a.jsonl"}], "extra": 1}, "unknown top-level field 'extra'"),
])
def test_malformed_mixture_names_the_field(tmp_path, content, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        load_mixture(write(tmp_path / "m.json", content))


def test_missing_mixture_and_bad_sources(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_mixture(str(tmp_path / "nope.json"))
    bad = jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(UserError, match="no string fields 'inputs' and 'targets'"):
        read_records(Source(name="bad", path=bad))
    with pytest.raises(UserError, match="not found"):
        read_records(Source(name="gone", path=str(tmp_path / "gone.jsonl")))
    with pytest.raises(UserError, match="unsupported file type"):
        read_records(Source(name="csv", path=write(tmp_path / "x.csv", "a,b")))


def test_train_valid_overlap_is_refused(tmp_path):
    a = jsonl(tmp_path / "a.jsonl", [{"inputs": f"q{i}", "targets": "t"} for i in range(10)])
    train = [Source(name="a", path=a, end=0.8)]
    with pytest.raises(UserError, match="overlapping row ranges"):
        check_range_overlap(train, [Source(name="v", path=a, start=0.7)])
    check_range_overlap(train, [Source(name="v", path=a, start=0.8)])
    hashes = {example_hash(r["inputs"], r["targets"]) for r in read_records(train[0])}
    copy = [{"inputs": "q3 ", "targets": " t"}, {"inputs": "new", "targets": "t"}]  # same text up to whitespace
    with pytest.raises(UserError, match="shares 1 of 2 examples"):
        check_hash_overlap(hashes, "v", copy)
    check_hash_overlap(hashes, "v", copy[1:])


@pytest.fixture
def no_proxy_env(monkeypatch):
    """The hub probe's environment without any proxy settings of the machine running the tests."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
                 "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class StubProxy(http.server.BaseHTTPRequestHandler):
    """An HTTP proxy stand-in: records each request line and answers `status`."""
    lines, status = [], 200

    def _answer(self):
        StubProxy.lines.append(self.requestline)
        self.send_response(StubProxy.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET = do_CONNECT = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def local_server():
    StubProxy.lines, StubProxy.status = [], 200
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubProxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_hub_offline_switches(no_proxy_env):
    mp = no_proxy_env
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        mp.delenv(name, raising=False)
    assert not hub.offline()
    mp.setenv("HF_HUB_OFFLINE", "1")
    assert hub.offline()
    mp.setenv("HF_DATASETS_OFFLINE", "0")  # datasets' precedence: its own switch wins
    assert not hub.offline()
    mp.setenv("HF_DATASETS_OFFLINE", "yes")
    assert hub.offline()
    mp.delenv("HF_ENDPOINT", raising=False)
    assert hub.endpoint() == "https://huggingface.co"
    mp.setenv("HF_ENDPOINT", "http://127.0.0.1:8080/")
    assert hub.endpoint() == "http://127.0.0.1:8080"


def test_hub_probe_honours_hf_endpoint_and_proxies(no_proxy_env, local_server):
    mp = no_proxy_env
    # HF_ENDPOINT is the host probed: a local server answers, a closed port fails at once
    mp.setenv("HF_ENDPOINT", local_server)
    assert hub.unreachable() is None
    mp.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    t0 = time.time()
    assert "ConnectionRefusedError" in hub.unreachable()
    assert time.time() - t0 < 3
    # with a proxy configured, the probe is an HTTP request through it (the hub's own name is never
    # looked up here: .invalid names do not resolve, so only the proxy can have answered)
    mp.setenv("HF_ENDPOINT", "http://hub.invalid")
    mp.setenv("HTTP_PROXY", local_server)
    assert hub.unreachable() is None
    assert StubProxy.lines[-1].startswith("HEAD http://hub.invalid/")
    StubProxy.status = 502  # the proxy cannot reach the hub
    assert hub.unreachable() == f"HTTP 502 through the proxy {local_server}"
    mp.setenv("HF_ENDPOINT", "https://hub.invalid")  # https: HTTPS_PROXY, a CONNECT through it
    mp.setenv("https_proxy", local_server)
    assert "through the proxy" in hub.unreachable() and StubProxy.lines[-1].startswith("CONNECT hub.invalid:443")
    mp.setenv("NO_PROXY", "hub.invalid")  # bypassed: a direct probe, and the name does not resolve
    n = len(StubProxy.lines)
    assert "through the proxy" not in hub.unreachable() and len(StubProxy.lines) == n
    mp.delenv("NO_PROXY")
    mp.setenv("https_proxy", f"http://127.0.0.1:{closed_port()}")  # a dead proxy
    t0 = time.time()
    assert hub.unreachable().startswith("ProxyError through the proxy")
    assert time.time() - t0 < 3


def test_hub_source_offline_is_a_clear_error(no_proxy_env):
    mp = no_proxy_env
    src = Source(name="copa", hf="bigscience/P3", config="copa_best_option")
    # conftest sets HF_DATASETS_OFFLINE=1: no network is tried
    with pytest.raises(UserError, match="offline .* not in the local cache"):
        read_records(src)
    # online, but the hub (HF_ENDPOINT) does not answer: one quick probe, not 30 s of datasets' retries
    import datasets

    def no_retries(*args, **kwargs):
        raise AssertionError("datasets asked an unreachable hub")
    mp.setattr(datasets, "load_dataset", no_retries)
    mp.setenv("HF_DATASETS_OFFLINE", "0")
    mp.setenv("HF_HUB_OFFLINE", "0")
    endpoint = f"http://127.0.0.1:{closed_port()}"
    mp.setenv("HF_ENDPOINT", endpoint)
    t0 = time.time()
    with pytest.raises(UserError, match=f"hub source 'copa' .* needs the network, but the hub {endpoint} cannot "
                                        f"be reached .*Connection refused.*use a local file"):
        read_records(src)
    assert time.time() - t0 < 3


# ---------------------------------------------------------------------- packing and mixtures

def random_lengths(n, seed, lo=5, hi=40):
    return np.random.default_rng(seed).integers(lo, hi, n)


def examples_from_lengths(name, lengths, seed=0):
    rng = np.random.default_rng(seed)
    ex = Examples(name)
    for n in lengths:
        ex.ids.append(rng.integers(3, 100, n).astype(np.int32))
        ex.n_input.append(int(rng.integers(1, n)))
    return ex


def test_next_fit_packing_rows_and_arrays():
    lengths = [random_lengths(50, 1), random_lengths(30, 2)]
    examples = [examples_from_lengths("a", lengths[0], 1), examples_from_lengths("b", lengths[1], 2)]
    stream = PackedStream(lengths, [1, 1], row_len=64, seed=3, packing="next_fit")
    rows = stream.next_rows(40)
    for r, nxt in zip(rows, rows[1:]):
        used = sum(lengths[s][i] for s, i in r)
        assert used <= 64 and used + lengths[nxt[0][0]][nxt[0][1]] > 64  # closed only when the next did not fit
    token_ids, seg, is_input = rows_to_arrays(rows, examples, 64, pad_id=0)
    filled = 0
    for r, row in enumerate(rows):
        pos = 0
        for k, (s, i) in enumerate(row, start=1):
            n, n_in = lengths[s][i], examples[s].n_input[i]
            assert (token_ids[r, pos:pos + n] == examples[s].ids[i]).all()
            assert (seg[r, pos:pos + n] == k).all()
            assert is_input[r, pos:pos + n_in].all() and not is_input[r, pos + n_in:pos + n].any()
            pos += n
        assert (seg[r, pos:] == 0).all() and not is_input[r, pos:].any() and (token_ids[r, pos:] == 0).all()
        filled += pos
    assert stream.fill_rate() == pytest.approx(filled / (40 * 64))
    assert filled / (40 * 64) == pytest.approx((seg != 0).mean())
    # seeded: the same seed gives the same rows, another seed other rows
    assert PackedStream(lengths, [1, 1], 64, seed=3, packing="next_fit").next_rows(40) == rows
    assert PackedStream(lengths, [1, 1], 64, seed=4, packing="next_fit").next_rows(40) != rows


def test_every_example_once_per_epoch_in_a_new_order():
    lengths = [random_lengths(37, 5)]
    stream = PackedStream(lengths, [1.0], row_len=50, seed=0, packing="next_fit")
    seen = [i for row in stream.next_rows(400) for _, i in row]
    epoch0, epoch1 = seen[:37], seen[37:74]
    assert sorted(epoch0) == sorted(epoch1) == list(range(37)) and epoch0 != epoch1


def test_mixture_proportions_within_binomial_tolerance():
    weights = [1.0, 2.0, 5.0]
    lengths = [random_lengths(n, s) for n, s in ((20, 1), (300, 2), (1000, 3))]
    rows = PackedStream(lengths, weights, row_len=128, seed=0, packing="next_fit").next_rows(3000)
    counts = np.bincount([s for row in rows for s, _ in row], minlength=3)
    n, p = counts.sum(), np.array(weights) / sum(weights)
    assert n > 10000
    assert (np.abs(counts / n - p) < 4 * np.sqrt(p * (1 - p) / n)).all(), (counts / n, p)
    # Megatron's row blend: single-source rows whose counts track the weights to within one row
    stream = PackedStream(lengths, weights, row_len=128, seed=0, mixing="row", packing="next_fit")
    for k in range(1, 801):
        row = stream.next_row()
        assert len({s for s, _ in row}) == 1
        assert (np.abs(stream.rows_used - p * k) <= 1).all()


@pytest.mark.parametrize("mixing", ["example", "row"])
def test_stream_state_resumes_exactly(mixing):
    lengths = [random_lengths(13, 1), random_lengths(29, 2)]
    ref = PackedStream(lengths, [1, 3], row_len=60, seed=9, mixing=mixing, packing="next_fit")
    ref.next_rows(57)  # a few epochs of the small source, an open carried example
    state = json.loads(json.dumps(ref.state_dict()))  # plain values only
    want = ref.next_rows(50)
    resumed = PackedStream(lengths, [1, 3], row_len=60, seed=9, mixing=mixing, packing="next_fit")
    resumed.load_state_dict(state)
    assert resumed.next_rows(50) == want and resumed.fill_rate() == ref.fill_rate()


# ---------------------------------------------------------------------- masks, positions, loss

def random_rows(R=4, L=24, seed=0):
    """Random packed rows (L tokens after the shift) with padding, and an all-padding row."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((R, L + 1), dtype=np.int64)
    is_input = np.zeros((R, L + 1), dtype=bool)
    for r in range(R - 1):
        pos, k = 0, 1
        while True:
            n = int(rng.integers(3, 10))
            if pos + n > L + 1 - int(rng.integers(0, 4)):
                break
            seg[r, pos:pos + n] = k
            is_input[r, pos:pos + int(rng.integers(1, n))] = True
            pos, k = pos + n, k + 1
    return torch.as_tensor(seg), torch.as_tensor(is_input)


@pytest.mark.parametrize("prefixlm", [False, True])
def test_attention_mask_matches_brute_force(prefixlm):
    seg_full, inp_full = random_rows(6, 30, seed=int(prefixlm))
    seg, inp = seg_full[:, :-1], inp_full[:, :-1]
    mask = document_mask(seg, inp if prefixlm else None)  # what the model builds from segment ids
    R, L = seg.shape
    for b in range(R):
        for q in range(L):
            for k in range(L):
                s, i = seg[b].tolist(), inp[b].tolist()
                allowed = s[q] == s[k] and s[q] != 0 and (k <= q or (prefixlm and i[q] and i[k]))
                if s[q] == 0:
                    allowed = q == k  # a padding query sees itself only (no empty softmax row)
                assert bool(mask[b, q, k]) == allowed, (b, q, k)
                if allowed and s[q] != 0 and k > q:
                    assert prefixlm and i[q] and i[k]  # looking ahead: only inputs, only in prefix mode
    assert not mask[-1].logical_xor(torch.eye(L, dtype=torch.bool)).any()  # the all-padding row


def test_position_ids_restart_per_example():
    seg, _ = random_rows(5, 40, seed=3)
    pos = position_ids(seg)
    for b in range(seg.shape[0]):
        s = seg[b].tolist()
        for t in range(len(s)):
            start = t
            while start > 0 and s[start - 1] == s[t]:
                start -= 1
            assert pos[b, t] == (t - start if s[t] else 0)


def test_label_mask_is_exactly_the_target_labels():
    seg, inp = random_rows(5, 30, seed=4)
    token_ids = torch.arange(seg.numel()).view_as(seg)
    tokens, labels, label_mask, label_seg, tok_seg, _ = shift(token_ids, seg, inp)
    assert torch.equal(labels, token_ids[:, 1:]) and torch.equal(tokens, token_ids[:, :-1])
    for b in range(seg.shape[0]):
        for t in range(seg.shape[1] - 1):
            target_label = seg[b, t + 1] != 0 and not inp[b, t + 1]
            assert bool(label_mask[b, t]) == bool(target_label)
            if target_label:  # the token predicting a target is of the same example (input or target)
                assert tok_seg[b, t] == seg[b, t + 1] == label_seg[b, t]
            first_target = target_label and inp[b, t]
            if first_target:  # the input -> first target step is trained
                assert label_mask[b, t]


def test_loss_weights_by_hand():
    seg, inp = random_rows(8, 30, seed=5)
    _, _, m, lseg, _, _ = shift(seg.clone(), seg, inp)
    ce = torch.rand(m.shape, dtype=torch.float64)
    # token: sum over the whole global batch / its number of target labels
    w = loss_weights(m, lseg, "token", n_groups=4)
    assert (w * ce).sum().item() == pytest.approx(ce[m].sum().item() / m.sum().item(), rel=1e-12)
    # example: mean over examples of each example's mean target loss
    per_example = [ce[b][m[b] & (lseg[b] == k)].mean().item() for b in range(8) for k in range(1, 20)
                   if (m[b] & (lseg[b] == k)).any()]
    w = loss_weights(m, lseg, "example")
    assert (w * ce).sum().item() == pytest.approx(sum(per_example) / len(per_example), rel=1e-12)
    # token_microbatch: every micro-batch's token mean, averaged (Megatron)
    means = [ce[g * 2:(g + 1) * 2][m[g * 2:(g + 1) * 2]].mean().item() for g in range(4)]
    w = loss_weights(m, lseg, "token_microbatch", n_groups=4)
    assert (w * ce).sum().item() == pytest.approx(sum(means) / 4, rel=1e-12)
    assert (loss_weights(m, lseg, "token")[~m] == 0).all() and math.isfinite(w.sum().item())
    with pytest.raises(UserError, match="loss_normalization"):
        loss_weights(m, lseg, "tokens")


def test_t0_examples_proportional_weights_with_cap(tmp_path):
    mix = write(tmp_path / "m.json", {"max_examples_per_dataset": 1000, "train": [
        {"name": "big_p1", "dataset": "big", "path": "x.jsonl", "weight": "examples"},
        {"name": "big_p2", "dataset": "big", "path": "x.jsonl", "weight": "examples"},
        {"name": "big_p3", "dataset": "big", "path": "x.jsonl", "weight": "examples"},
        {"name": "small", "path": "y.jsonl", "weight": "examples"},
        {"name": "fixed", "path": "z.jsonl", "weight": 250}]})
    train, _ = load_mixture(mix)
    # a dataset over the cap: each of its 3 prompts gets 1000 // 3; under it: its own size
    assert resolve_weights(train, [5000, 5000, 5000, 400, 7]) == [333.0, 333.0, 333.0, 400.0, 250.0]
    with pytest.raises(UserError, match="max_examples_per_dataset"):
        load_mixture(write(tmp_path / "b.json", {"max_examples_per_dataset": 0, "train": [{"name": "a", "path": "a"}]}))
