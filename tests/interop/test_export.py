"""export.py: llama2.c .bin v0/v1/v2, run.c tokenizer .bin, HF Llama export and import.

The references are independent of export.py: a numpy reader written here that follows the
byte layout of docs/interop.md section 1 and a numpy float64 forward pass rebuilt from the
parsed file; `transformers.LlamaForCausalLM` for the HF folder; sentencepiece for the tokenizer.
"""
import copy
import json
import os
import re
import struct

import numpy as np
import pytest
import torch
from conftest import TOK8192, assert_one_line_error, records, run_main, save_tiny_checkpoint
from conftest import tiny_model as shared_tiny_model

import export as export_cli
from tinylab.core.checkpoint import load_checkpoint, model_args_dict, save_checkpoint
from tinylab.core.errors import UserError
from tinylab.interop import hf, llama2c

TOKENS = np.array([[1, 5, 9, 33, 2, 60, 17, 3, 41, 8, 0, 12], [7, 7, 63, 1, 22, 5, 30, 49, 11, 2, 6, 4]])

# (n_kv_heads, tied): MHA and GQA, tied and untied
SHAPES = [(4, True), (4, False), (2, True), (2, False)]


def tiny_model(n_kv_heads=4, tied=True, seed=0, **kw):
    model = shared_tiny_model(seed=seed, n_kv_heads=n_kv_heads, vocab_size=64, max_seq_len=16, tie_embeddings=tied, **kw)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # random gains, so a reader that swaps or skips norms is caught
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith(("wq.weight", "wk.weight")):
                # sharper attention than at init (std 0.02 is almost uniform), so a wrong RoPE or
                # head layout changes the logits clearly
                p.mul_(10.0)
    return model


def save_tiny(path, model):
    margs = model_args_dict(model)
    return save_tiny_checkpoint(path, model, config={k: margs[k] for k in ("dim", "n_layers", "n_heads", "vocab_size")},
                                iter_num=7, best_val_loss=3.0, optimizer=None)


def our_logits(model, tokens=TOKENS):
    with torch.no_grad():
        return model(torch.as_tensor(tokens), all_logits=True).double().numpy()


# ---------------------------------------------------------------------- independent .bin reader

class Cursor:
    def __init__(self, data, pos=0):
        self.data, self.pos = data, pos

    def f32(self, *shape):
        n = int(np.prod(shape))
        a = np.frombuffer(self.data, dtype="<f4", count=n, offset=self.pos).reshape(shape)
        self.pos += 4 * n
        return a

    def q80(self, shape, gs):
        """int8 values then fp32 scales of one tensor (interleaved per tensor)."""
        n = int(np.prod(shape))
        q = np.frombuffer(self.data, dtype=np.int8, count=n, offset=self.pos)
        self.pos += n
        s = self.f32(n // gs)
        return q, s, (q.reshape(-1, gs).astype(np.float32) * s[:, None]).reshape(shape)


def np_read_bin(path):
    """Parse a llama2.c model file the way run.c / runq.c do; returns (header, weights, extra)."""
    data = open(path, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    if magic == 0x616B3432:
        version = struct.unpack("<i", data[4:8])[0]
        dim, hidden, L, H, KV, V, S = struct.unpack("<7i", data[8:36])
        shared = data[36] == 1
        gs = struct.unpack("<i", data[37:41])[0] if version == 2 else None
        assert data[41 if version == 2 else 37:256] == b"\0" * (256 - (41 if version == 2 else 37))
        c = Cursor(data, 256)
    else:
        version, gs = 0, None
        dim, hidden, L, H, KV, V, S = struct.unpack("<7i", data[:28])
        shared, V = V > 0, abs(V)
        c = Cursor(data, 28)
    hd = dim // H
    kvd = KV * hd
    hp = dict(version=version, dim=dim, hidden=hidden, L=L, H=H, KV=KV, V=V, S=S, shared=shared, gs=gs)
    shapes = dict(wq=(dim, dim), wk=(kvd, dim), wv=(kvd, dim), wo=(dim, dim), w1=(hidden, dim), w2=(dim, hidden), w3=(hidden, dim))
    W, extra = {}, {"q": {}, "s": {}}
    if version == 0:
        W["emb"] = c.f32(V, dim)
        W["att_norm"] = [c.f32(dim) for _ in range(L)]
        for k in ("wq", "wk", "wv", "wo"):
            W[k] = [c.f32(*shapes[k]) for _ in range(L)]
        W["ffn_norm"] = [c.f32(dim) for _ in range(L)]
        for k in ("w1", "w2", "w3"):
            W[k] = [c.f32(*shapes[k]) for _ in range(L)]
        W["norm"] = c.f32(dim)
        extra["cos"], extra["sin"] = c.f32(S, hd // 2), c.f32(S, hd // 2)
        if not shared:
            W["out"] = c.f32(V, dim)
    else:
        W["att_norm"] = [c.f32(dim) for _ in range(L)]
        W["ffn_norm"] = [c.f32(dim) for _ in range(L)]
        W["norm"] = c.f32(dim)
        names = [("emb", (V, dim), None)] + [(k, shapes[k], l) for k in ("wq", "wk", "wv", "wo", "w1", "w2", "w3") for l in range(L)]
        if not shared:
            names.append(("out", (V, dim), None))
        for k, shape, l in names:
            if version == 1:
                w = c.f32(*shape)
            else:
                q, s, w = c.q80(shape, gs)
                extra["q"][(k, l)], extra["s"][(k, l)] = q, s
            if l is None:
                W[k] = w
            else:
                W.setdefault(k, []).append(w)
    assert c.pos == len(data), f"{len(data) - c.pos} bytes left unread"
    if shared:
        W["out"] = W["emb"]
    return hp, W, extra


def np_rope_tables(hd, S, theta=10000.0):
    freqs = 1.0 / theta ** (np.arange(0, hd, 2)[: hd // 2] / hd)
    ang = np.outer(np.arange(S), freqs)
    return np.cos(ang), np.sin(ang)


def np_forward(hp, W, tokens, eps=1e-5, theta=10000.0):
    """Llama forward in float64 from the parsed weights, run.c's algorithm (interleaved RoPE pairs)."""
    dim, H, KV = hp["dim"], hp["H"], hp["KV"]
    hd = dim // H
    T = tokens.shape[1]
    cos, sin = np_rope_tables(hd, T, theta)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g.astype(np.float64)

    def rope(x):  # x (T, heads, hd)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos[:, None] - b * sin[:, None]
        out[..., 1::2] = a * sin[:, None] + b * cos[:, None]
        return out

    f64 = {k: ([w.astype(np.float64) for w in v] if isinstance(v, list) else v.astype(np.float64)) for k, v in W.items()}
    out = []
    for seq in tokens:
        x = f64["emb"][seq]
        for l in range(hp["L"]):
            h = rms(x, f64["att_norm"][l])
            q = rope((h @ f64["wq"][l].T).reshape(T, H, hd))
            k = rope((h @ f64["wk"][l].T).reshape(T, KV, hd))
            v = (h @ f64["wv"][l].T).reshape(T, KV, hd)
            att = np.zeros((T, H, hd))
            for head in range(H):
                kv = head // (H // KV)
                s = q[:, head] @ k[:, kv].T / np.sqrt(hd)
                s[np.triu_indices(T, 1)] = -np.inf
                p = np.exp(s - s.max(-1, keepdims=True))
                att[:, head] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
            x = x + att.reshape(T, dim) @ f64["wo"][l].T
            h = rms(x, f64["ffn_norm"][l])
            a, b = h @ f64["w1"][l].T, h @ f64["w3"][l].T
            x = x + (a / (1 + np.exp(-a)) * b) @ f64["w2"][l].T
        out.append(rms(x, f64["norm"]) @ f64["out"].T)
    return np.stack(out)


def ours_as_np(model):
    """Our weights in the reader's naming, for exact comparisons."""
    g = lambda t: t.detach().numpy()
    W = {"emb": g(model.tok_embeddings.weight), "norm": g(model.norm.weight), "out": g(model.output.weight)}
    for key, name in (("att_norm", "attention_norm"), ("ffn_norm", "ffn_norm"), ("wq", "attention.wq"), ("wk", "attention.wk"),
                      ("wv", "attention.wv"), ("wo", "attention.wo"), ("w1", "feed_forward.w1"), ("w2", "feed_forward.w2"),
                      ("w3", "feed_forward.w3")):
        W[key] = [g(layer.get_submodule(name).weight) for layer in model.layers]
    return W


def expected_v0_size(d, f, L, V, S, kvd, hd, shared):
    # the spec's size formula, section 1
    return 28 + 4 * (V * d + 2 * L * d + L * (2 * d * d + 2 * kvd * d + 3 * f * d) + d + S * hd + (0 if shared else V * d))


# ---------------------------------------------------------------------- llama2.c .bin

@pytest.mark.parametrize("n_kv_heads,tied", [(4, True), (2, False)])
def test_bin_v0_v1_independent_reader_matches_logits(tmp_path, n_kv_heads, tied):
    model = tiny_model(n_kv_heads, tied)
    ckpt = save_tiny(tmp_path / "ckpt.pt", model)
    ref = our_logits(model)
    ours = ours_as_np(model)
    for version in (0, 1):
        out = tmp_path / f"v{version}.bin"
        if version == (0 if tied else 1):  # each version once through the CLI, once in-process
            run_main("export.py", [str(out), f"--version={version}", f"--checkpoint={ckpt}"], check=True)
        else:
            llama2c.export_bin(model, str(out), version, log=lambda *a: None)
        hp, W, extra = np_read_bin(out)
        assert (hp["version"], hp["dim"], hp["hidden"], hp["L"], hp["H"], hp["KV"], hp["V"], hp["S"], hp["shared"]) == \
            (version, 32, 96, 2, 4, n_kv_heads, 64, 16, tied)
        if version == 0:
            raw_vocab = struct.unpack("<7i", out.read_bytes()[:28])[5]
            assert raw_vocab == (64 if tied else -64)  # negative vocab = unshared classifier
            assert out.stat().st_size == expected_v0_size(32, 96, 2, 64, 16, n_kv_heads * 8, 8, tied)
            cos, sin = np_rope_tables(8, 16)
            np.testing.assert_allclose(extra["cos"], cos, atol=1e-6)
            np.testing.assert_allclose(extra["sin"], sin, atol=1e-6)
        else:
            assert out.stat().st_size == 256 + (expected_v0_size(32, 96, 2, 64, 16, n_kv_heads * 8, 8, tied) - 28 - 4 * 16 * 8)
        # every tensor bit-exact and in the right place
        for key, val in ours.items():
            for a, b in zip(val if isinstance(val, list) else [val], W[key] if isinstance(W[key], list) else [W[key]]):
                assert np.array_equal(a, b), (version, key)
        logits = np_forward(hp, W, TOKENS)
        err = np.abs(logits - ref).max()
        assert err <= 1e-5, (version, err)
        print(f"v{version} kv={n_kv_heads} tied={tied}: max |dlogits| numpy-from-file vs ours = {err:.2e}")


def test_bin_v2_q80_within_printed_error(tmp_path):
    model = tiny_model(2, False)
    with torch.no_grad():
        # a depth-grown model has all-zero wo / w2 in its new layers: zero groups must not give NaN
        model.layers[1].attention.wo.weight.zero_()
    ckpt = save_tiny(tmp_path / "ckpt.pt", model)
    out = tmp_path / "v2.bin"
    proc = run_main("export.py", [str(out), "--version=2", f"--checkpoint={ckpt}"], check=True)
    printed = float(re.search(r"max quantization error across all weights: (\S+)", proc.stdout).group(1))
    hp, W, extra = np_read_bin(out)
    assert hp["version"] == 2 and hp["gs"] == 32 and not hp["shared"]  # 64 halved until it divides dim=32
    ours = ours_as_np(model)
    worst = 0.0
    for (key, l), q in extra["q"].items():
        s = extra["s"][(key, l)]
        orig = ours[key] if l is None else ours[key][l]
        deq = W[key] if l is None else W[key][l]
        assert q.min() >= -127 and q.max() <= 127 and np.all(np.isfinite(s))
        # per element |w - q*scale| <= scale/2 (plus fp32 rounding of the division)
        err = np.abs(deq - orig).reshape(-1, 32)
        assert np.all(err <= s[:, None] / 2 * (1 + 1e-5) + 1e-12), key
        np.testing.assert_allclose(s, np.abs(orig).reshape(-1, 32).max(1) / 127, rtol=1e-6)
        worst = max(worst, err.max())
    wo = extra["q"][("wo", 1)], extra["s"][("wo", 1)]
    assert not wo[0].any() and not wo[1].any()  # the zero tensor: q = 0 and scale = 0
    assert worst <= printed * (1 + 1e-6) and worst >= printed * (1 - 1e-6)
    # norms stay fp32 and exact
    assert all(np.array_equal(a, b) for a, b in zip(ours["att_norm"] + ours["ffn_norm"], W["att_norm"] + W["ffn_norm"]))
    # the numpy forward over the dequantised file equals our model loaded with the same weights ...
    deq_model = copy.deepcopy(model)
    with torch.no_grad():
        for key, name in (("wq", "attention.wq"), ("wk", "attention.wk"), ("wv", "attention.wv"), ("wo", "attention.wo"),
                          ("w1", "feed_forward.w1"), ("w2", "feed_forward.w2"), ("w3", "feed_forward.w3")):
            for l, layer in enumerate(deq_model.layers):
                layer.get_submodule(name).weight.copy_(torch.from_numpy(W[key][l]))
        deq_model.tok_embeddings.weight.copy_(torch.from_numpy(W["emb"]))
        deq_model.output.weight.copy_(torch.from_numpy(W["out"]))
    np_logits = np_forward(hp, W, TOKENS)
    assert np.abs(np_logits - our_logits(deq_model)).max() <= 1e-5
    # ... and is close to the fp32 model: the weight error is small, so the logit error is too
    ref = our_logits(model)
    dlogit = np.abs(np_logits - ref).max()
    print(f"v2: max weight error {printed:.3g}, max |dlogits| vs fp32 {dlogit:.3g} (logit range {np.abs(ref).max():.3g})")
    assert 0 < dlogit < 0.05 * np.abs(ref).max()


def test_import_bin_round_trip(tmp_path):
    for n_kv_heads, tied in [(4, True), (2, False)]:
        model = tiny_model(n_kv_heads, tied, seed=3)
        for version in (0, 1, 2):
            out = tmp_path / f"m{n_kv_heads}_{version}.bin"
            llama2c.export_bin(model, str(out), version, log=lambda *a: None)
            dest = tmp_path / f"imported{n_kv_heads}_{version}"
            if version == 0 and not tied:  # once through the CLI (a folder output gets ckpt.pt) ...
                run_main("export.py", [str(dest), f"--import_bin={out}"], check=True)
            else:  # ... the rest in-process, to keep the test fast
                save_checkpoint(hf.imported_checkpoint(*llama2c.read_bin(str(out)), "test"), str(dest / "ckpt.pt"))
            ck = load_checkpoint(str(dest / "ckpt.pt"))
            assert ck["iter_num"] == 0 and ck["optimizer"] is None and ck["best_val_loss"] == 1e9
            assert ck["model_args"]["tie_embeddings"] == tied and ck["model_args"]["hidden_dim"] == 96
            assert ck["config"]["n_kv_heads"] == n_kv_heads
            if version < 2:
                for k, v in model.state_dict().items():
                    assert torch.equal(ck["model"][k], v), (version, k)
            else:
                _, W, _ = np_read_bin(out)  # the importer dequantises exactly as the reference reader
                assert np.array_equal(ck["model"]["layers.1.attention.wk.weight"].numpy(), W["wk"][1])
                assert np.array_equal(ck["model"]["tok_embeddings.weight"].numpy(), W["emb"])


# ---------------------------------------------------------------------- tokenizer .bin

def test_tokenizer_bin_round_trip(tmp_path):
    import sentencepiece as spm
    model_path = TOK8192
    out = tmp_path / "tok.bin"
    run_main("export.py", ["--tokenizer", model_path, str(out)], check=True)
    data = out.read_bytes()
    sp = spm.SentencePieceProcessor(model_file=model_path)
    max_len = struct.unpack_from("<I", data, 0)[0]
    pos, lengths = 4, []
    for i in range(sp.get_piece_size()):
        score, n = struct.unpack_from("<fi", data, pos)
        text = data[pos + 8:pos + 8 + n].decode("utf-8")
        pos += 8 + n
        want = {sp.bos_id(): "\n<s>\n", sp.eos_id(): "\n</s>\n"}.get(i, sp.id_to_piece(i).replace("\u2581", " "))
        assert text == want and score == np.float32(sp.get_score(i)), i
        lengths.append(n)
    assert pos == len(data) and max_len == max(lengths)
    assert "<0x0A>" in [sp.id_to_piece(i) for i in range(20)]  # byte-fallback pieces are written literally
    # default output path: beside the model, .model -> .bin
    (tmp_path / "copy.model").write_bytes(open(model_path, "rb").read())
    export_cli.main([f"--tokenizer={tmp_path / 'copy.model'}"])
    assert (tmp_path / "copy.bin").read_bytes() == data


# ---------------------------------------------------------------------- Hugging Face

def test_rope_permutation_is_the_spec_mapping():
    h, n_heads, cols = 8, 3, 5
    w = torch.arange(n_heads * h * cols, dtype=torch.float32).reshape(n_heads * h, cols)
    rows = hf.permute_rope(w, n_heads)
    for n in range(n_heads):
        for i in range(h // 2):
            for j in (0, 1):
                assert torch.equal(rows[n * h + j * (h // 2) + i], w[n * h + 2 * i + j])
    assert torch.equal(hf.unpermute_rope(rows, n_heads), w)


def hf_logits(path, tokens=TOKENS):
    from transformers import LlamaForCausalLM
    llama = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        return llama(torch.as_tensor(tokens)).logits.double().numpy()


def kl(p_logits, q_logits):
    lp = torch.log_softmax(torch.as_tensor(p_logits), -1)
    lq = torch.log_softmax(torch.as_tensor(q_logits), -1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def read_safetensors_header(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    ends = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:])) and 8 + n + ends[-1][1] == len(data)
    return header


@pytest.mark.parametrize("n_kv_heads,tied", SHAPES)
def test_hf_export_matches_transformers_and_imports_back(tmp_path, n_kv_heads, tied):
    extra = {"rope_theta": 50000.0} if (n_kv_heads, tied) == (2, False) else {}  # a non-default theta must travel
    model = tiny_model(n_kv_heads, tied, **extra)
    out = tmp_path / "hf"
    hf.export_hf(model, str(out), log=lambda *a: None)
    cfg = json.load(open(out / "config.json"))
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["rms_norm_eps"] == 1e-5
    theta = extra.get("rope_theta", 10000.0)
    assert cfg["rope_theta"] == theta and cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": theta}
    assert "rope_scaling" in cfg and cfg["rope_scaling"] is None
    assert cfg["tie_word_embeddings"] is tied and cfg["num_key_value_heads"] == n_kv_heads
    assert cfg["intermediate_size"] == 96 and cfg["head_dim"] == 8 and cfg["max_position_embeddings"] == 16
    header = read_safetensors_header(out / "model.safetensors")
    assert ("lm_head.weight" in header) is (not tied)
    assert header["model.layers.1.self_attn.k_proj.weight"]["shape"] == [n_kv_heads * 8, 32]
    assert all(v["dtype"] == "F32" for k, v in header.items() if k != "__metadata__")

    ref, got = our_logits(model), hf_logits(out)
    err = np.abs(ref - got).max()
    print(f"HF kv={n_kv_heads} tied={tied}: max |dlogits| = {err:.2e}, KL = {kl(ref, got):.2e}")
    assert err <= 1e-5 and abs(kl(ref, got)) < 1e-10

    args, state = hf.read_hf(str(out))
    assert args.tie_embeddings is tied and args.kv_heads() == n_kv_heads and args.rope_theta == theta
    for k, v in model.state_dict().items():
        assert torch.equal(state[k], v), k


def test_hf_export_without_permutation_differs(tmp_path):
    """Negative control: the RoPE permutation matters, so the comparison above can fail."""
    model = tiny_model(2, True)
    hf.export_hf(model, str(tmp_path / "hf"), permute=False, log=lambda *a: None)
    ref, got = our_logits(model), hf_logits(tmp_path / "hf")
    err = np.abs(ref - got).max()
    print(f"HF without the RoPE permutation: max |dlogits| = {err:.2e}, KL = {kl(ref, got):.2e}")
    assert err > 1e-2


def test_hf_cli_with_tokenizer_and_import_of_a_native_hf_model(tmp_path):
    import sentencepiece as spm
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = TOK8192
    # CLI export with tokenizer: the folder is complete for AutoTokenizer
    model = tiny_model(2, False)
    ckpt = save_tiny(tmp_path / "ckpt.pt", model)
    run_main("export.py", [str(tmp_path / "hf"), "--version=-1", f"--checkpoint={ckpt}", f"--tokenizer={tok}"], check=True)
    assert sorted(os.listdir(tmp_path / "hf")) == sorted(hf.HF_FILES)
    text = "Once upon a time, there was a little girl named Lily."
    ids = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))(text)["input_ids"]
    assert ids == [1] + spm.SentencePieceProcessor(model_file=tok).encode(text)
    assert np.abs(hf_logits(tmp_path / "hf") - our_logits(model)).max() <= 1e-5

    # a model written by transformers itself (not by our exporter), GQA and untied, imported via the CLI
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(1)
    native = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in native.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "norm" not in name else 0.1) + (1.0 if "norm" in name else 0.0))
    native.save_pretrained(str(tmp_path / "native"))
    run_main("export.py", [str(tmp_path / "imported.pt"), f"--import_hf={tmp_path / 'native'}"], check=True)
    from tinylab.core.checkpoint import model_from_checkpoint
    ck = load_checkpoint(str(tmp_path / "imported.pt"))
    ours = model_from_checkpoint(ck).eval()
    with torch.no_grad():
        want = native(torch.as_tensor(TOKENS)).logits.double().numpy()
    err = np.abs(our_logits(ours) - want).max()
    print(f"native HF -> ours: max |dlogits| = {err:.2e}")
    assert err <= 1e-5
    assert ck["model_args"]["hidden_dim"] == 40 and ck["model_args"]["n_kv_heads"] == 2 and not ck["model_args"]["tie_embeddings"]


def test_hf_export_generates_our_greedy_text(tmp_path):
    """The exported folder as every HF tool loads it: AutoTokenizer -> AutoModelForCausalLM.generate
    -> decode gives exactly the ids and text of our own greedy generation (decoded by sentencepiece)."""
    import sentencepiece as spm
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = shared_tiny_model(seed=3, vocab_size=8192, max_seq_len=64, tie_embeddings=False).eval()
    with torch.no_grad():  # sharper than at init, so greedy choices are far from ties
        for name, p in model.named_parameters():
            if name.endswith(("wq.weight", "wk.weight", "output.weight")):
                p.mul_(10.0)
    ckpt = save_tiny(tmp_path / "ckpt.pt", model)
    run_main("export.py", [str(tmp_path / "hf"), "--version=-1", f"--checkpoint={ckpt}", f"--tokenizer={TOK8192}"],
             check=True)
    sp = spm.SentencePieceProcessor(model_file=TOK8192)
    prompt = "Once upon a time, there was a little girl named Lily."
    prompt_ids = [sp.bos_id()] + sp.encode(prompt)
    ours = model.generate(torch.tensor([prompt_ids]), 24, temperature=0.0)[0].tolist()

    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    llama = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    enc = tok(prompt, return_tensors="pt")
    assert enc["input_ids"][0].tolist() == prompt_ids
    theirs = llama.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=sp.eos_id())[0].tolist()
    assert sp.eos_id() not in theirs and theirs == ours  # all 24 tokens generated, none of them EOS
    text = tok.decode(theirs[len(prompt_ids):], skip_special_tokens=True)
    assert text == sp.decode(ours[len(prompt_ids):]) and len(text) > 20
    with torch.no_grad():  # and the logits along the way
        err = (llama(torch.tensor([ours])).logits - model(torch.tensor([ours]), all_logits=True)).abs().max()
    assert err <= 1e-4


# ---------------------------------------------------------------------- bad input

def test_bad_input_one_line_and_nothing_written(tmp_path):
    model = tiny_model()
    ckpt = save_tiny(tmp_path / "ckpt.pt", model)
    out = tmp_path / "out.bin"
    # through the CLI: the one-line error format
    assert_one_line_error(run_main("export.py", [str(out), "--version=3", f"--checkpoint={ckpt}"]),
                          "--version=3: must be one of -1, 0, 1, 2")
    assert_one_line_error(run_main("export.py", [str(out), "--version=1", f"--checkpoint={tmp_path / 'nope.pt'}"]),
                          "checkpoint not found")
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    (mistral / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}))
    assert_one_line_error(run_main("export.py", [str(tmp_path / "imp"), f"--import_hf={mistral}"]), "MistralForCausalLM")
    # in-process (the same UserError that cli_main prints as one line), to keep the test fast
    empty = tmp_path / "hf_empty"
    empty.mkdir()
    cases = [
        (["x", "--version=x"], "--version"),
        ([str(tmp_path / "imp"), f"--import_hf={empty}"], "no config.json"),
        ([str(tmp_path / "imp"), f"--import_hf={tmp_path / 'absent'}"], "not found"),
        ([str(tmp_path / "hf"), "--version=-1", f"--checkpoint={ckpt}", f"--tokenizer={tmp_path / 'absent.model'}"], "tokenizer"),
        (["--tokenizer", str(ckpt), str(tmp_path / "t.bin")], "not a sentencepiece model"),
        ([str(tmp_path / "imp"), f"--import_bin={ckpt}"], "not a llama2.c model file"),
        ([str(tmp_path)], "nothing to do"),
    ]
    llama = json.loads(json.dumps(hf.hf_config(model)))
    for field, value in (("hidden_act", "gelu"), ("attention_bias", True), ("rope_scaling", {"rope_type": "linear", "factor": 2.0})):
        odd = tmp_path / f"odd_{field}"
        odd.mkdir()
        (odd / "config.json").write_text(json.dumps(dict(llama, **{field: value})))
        cases.append(([str(tmp_path / "imp"), f"--import_hf={odd}"], field.split("_")[0] if field != "rope_scaling" else "RoPE scaling"))
    for argv, fragment in cases:
        with pytest.raises(UserError, match=re.escape(fragment)):
            export_cli.main(argv)
    # a truncated llama2.c file is refused, not misread
    good = tmp_path / "good.bin"
    llama2c.export_bin(model, str(good), 1, log=lambda *a: None)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(good.read_bytes()[:-4])
    with pytest.raises(UserError, match="bytes, but its v1 header describes"):
        export_cli.main([str(tmp_path / "imp"), f"--import_bin={bad}"])
    assert not out.exists() and not (tmp_path / "imp").exists() and not (tmp_path / "hf").exists()
    assert not (tmp_path / "t.bin").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp")] == []


def split_safetensors(path):
    """(header dict, data section bytes) of a safetensors file, for the tests that damage one."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def join_safetensors(header, body):
    raw = json.dumps(header).encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw + body


def test_hf_import_refuses_damaged_safetensors(tmp_path):
    """A truncated or inconsistent model.safetensors is a one-line error naming file and tensor,
    never an import with zeroed weights (the old reader substituted zeros past the end of the file)."""
    model = tiny_model(2, False)
    good = tmp_path / "good"
    hf.export_hf(model, str(good), log=lambda *a: None)
    header, body = split_safetensors(good / "model.safetensors")
    tensors = sorted((v["data_offsets"], k) for k, v in header.items() if k != "__metadata__")
    (last_begin, _), last = tensors[-1]
    mid = "model.layers.0.self_attn.q_proj.weight"  # a matrix in the middle of the data
    mid_begin, mid_end = header[mid]["data_offsets"]
    assert tensors[0][0][0] < mid_begin and mid_end < last_begin
    bad_dtype = json.loads(json.dumps(header))
    bad_dtype[mid]["dtype"] = "I4"
    bad_size = json.loads(json.dumps(header))
    bad_size[mid]["shape"] = [bad_size[mid]["shape"][0] // 2, bad_size[mid]["shape"][1]]  # offsets cover twice that
    no_offsets = json.loads(json.dumps(header))
    del no_offsets[mid]["data_offsets"]
    past_end = json.loads(json.dumps(header))
    past_end[mid]["data_offsets"] = [len(body), len(body) + mid_end - mid_begin]
    full = join_safetensors(header, body)
    cases = [
        ("cut_at_tensor", join_safetensors(header, body[:last_begin]), [last, "outside"]),  # was: zeros, rc 0
        ("cut_in_tensor", join_safetensors(header, body[:mid_begin + 6]), [mid, "outside"]),  # was: a traceback
        ("short", full[:5], ["too short"]),
        ("header_len", struct.pack("<Q", 10 ** 12) + full[8:], ["header length"]),
        ("not_json", struct.pack("<Q", 16) + b"{not json at all" + body, ["not JSON"]),
        ("json_list", join_safetensors([1, 2], body), ["not a JSON object"]),
        ("dtype", join_safetensors(bad_dtype, body), [mid, "unsupported dtype 'I4'"]),
        ("size", join_safetensors(bad_size, body), [mid, "which needs"]),
        ("no_offsets", join_safetensors(no_offsets, body), [mid, "malformed"]),
        ("past_end", join_safetensors(past_end, body), [mid, "outside"]),
    ]
    for case, data, fragments in cases:
        folder = tmp_path / case
        folder.mkdir()
        (folder / "config.json").write_bytes((good / "config.json").read_bytes())
        (folder / "model.safetensors").write_bytes(data)
        out = tmp_path / f"imp_{case}.pt"
        if case in ("cut_at_tensor", "cut_in_tensor"):  # the reported bugs, through the CLI
            proc = run_main("export.py", [str(out), f"--import_hf={folder}"])
            assert_one_line_error(proc, str(folder / "model.safetensors"), *fragments)
            assert proc.returncode == 2
        else:
            with pytest.raises(UserError) as e:
                export_cli.main([str(out), f"--import_hf={folder}"])
            assert str(folder / "model.safetensors") in str(e.value) and "\n" not in str(e.value), case
            for fragment in fragments:
                assert fragment in str(e.value), (case, str(e.value))
        assert not out.exists(), case
    # the undamaged file still imports exactly, and a 0-element tensor is legal (not a cut)
    args, state = hf.read_hf(str(good))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(join_safetensors({"e": {"dtype": "F16", "shape": [0, 3], "data_offsets": [0, 0]}}, b""))
    assert hf.read_safetensors(str(empty))["e"].shape == (0, 3)
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp")] == []


def test_hf_import_missing_shard_or_unreadable_bin(tmp_path):
    model = tiny_model(2, False)
    good = tmp_path / "good"
    hf.export_hf(model, str(good), log=lambda *a: None)
    names = list(split_safetensors(good / "model.safetensors")[0])
    names.remove("__metadata__")

    # a shard named in the index that is not there (was: FileNotFoundError traceback)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_bytes((good / "config.json").read_bytes())
    (sharded / "model-00001-of-00002.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    weight_map = {k: "model-00001-of-00002.safetensors" for k in names}
    weight_map[names[-1]] = "model-00002-of-00002.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    proc = run_main("export.py", [str(tmp_path / "imp_shard.pt"), f"--import_hf={sharded}"])
    assert_one_line_error(proc, str(sharded / "model-00002-of-00002.safetensors"), "not found", "model.safetensors.index.json")
    # once every shard is there, the same index imports
    weight_map[names[-1]] = "model-00001-of-00002.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert all(torch.equal(hf.read_hf(str(sharded))[1][k], v) for k, v in model.state_dict().items())
    (sharded / "model.safetensors.index.json").write_text("{")
    with pytest.raises(UserError, match="model.safetensors.index.json is not a readable shard index"):
        export_cli.main([str(tmp_path / "imp_index.pt"), f"--import_hf={sharded}"])

    # pytorch_model.bin: a good one imports, a corrupt one is a one-line error (was: torch.load traceback)
    binned = tmp_path / "binned"
    binned.mkdir()
    (binned / "config.json").write_bytes((good / "config.json").read_bytes())
    torch.save(hf.hf_state_dict(model), str(binned / "pytorch_model.bin"))
    assert all(torch.equal(hf.read_hf(str(binned))[1][k], v) for k, v in model.state_dict().items())
    weights = binned / "pytorch_model.bin"
    weights.write_bytes(b"this is not a zip archive nor a pickle")
    proc = run_main("export.py", [str(tmp_path / "imp_bin.pt"), f"--import_hf={binned}"])
    assert_one_line_error(proc, str(weights), "not a readable PyTorch weights file")
    for case, make in (("empty", lambda: weights.write_bytes(b"")),
                       ("list", lambda: torch.save([torch.zeros(2)], str(weights)))):
        make()
        with pytest.raises(UserError, match=re.escape(str(weights))):
            export_cli.main([str(tmp_path / f"imp_{case}.pt"), f"--import_hf={binned}"])
    assert [p for p in os.listdir(tmp_path) if p.startswith("imp")] == []


def test_version_is_checked_in_every_mode(tmp_path):
    """An unknown --version is refused before anything is read, whatever the mode; a valid one where
    it does nothing (imports, the tokenizer .bin) is refused too instead of silently ignored."""
    model = tiny_model()
    ckpt = save_tiny(tmp_path / "ckpt.pt", model)
    hf_dir = tmp_path / "hf"
    hf.export_hf(model, str(hf_dir), log=lambda *a: None)
    good_bin = tmp_path / "good.bin"
    llama2c.export_bin(model, str(good_bin), 1, log=lambda *a: None)
    tok = TOK8192
    out = tmp_path / "out"
    # the old code imported / wrote the tokenizer with rc 0 here
    assert_one_line_error(run_main("export.py", [str(out), "--version=3", f"--import_hf={hf_dir}"]), "--version=3: must be one of")
    cases = [
        ([str(out), "--version=9", f"--import_bin={good_bin}"], "--version=9: must be one of"),
        ([str(out), "--version=-2", f"--tokenizer={tok}"], "--version=-2: must be one of"),
        ([str(out), "--version=5"], "--version=5: must be one of"),
        ([str(out), "--version=1", f"--import_bin={good_bin}"], "--version=1 applies only to a --checkpoint export"),
        ([str(out), "--version=0", f"--import_hf={hf_dir}"], "--version=0 applies only to a --checkpoint export"),
        ([str(out), "--version=-1", f"--tokenizer={tok}"], "--version=-1 applies only to a --checkpoint export"),
        # --group_size only shapes v2's quantisation: elsewhere it would be silently ignored
        ([str(out), "--version=1", f"--checkpoint={ckpt}", "--group_size=32"], "--group_size=32 applies only to --version=2"),
        ([str(out), f"--checkpoint={ckpt}", "--group_size=32"], "--group_size=32 applies only to --version=2"),
        ([str(out), "--version=2", f"--checkpoint={ckpt}", "--group_size=0"], "--group_size=0: must be in [1, inf)"),
    ]
    for argv, fragment in cases:
        with pytest.raises(UserError, match=re.escape(fragment)):
            export_cli.main(argv)
    assert not out.exists()
    # without --version a checkpoint export is still v0 (no "ak42" magic, vocab in the 28-byte header)
    export_cli.main([str(tmp_path / "v0.bin"), f"--checkpoint={ckpt}"])
    assert np_read_bin(tmp_path / "v0.bin")[0]["version"] == 0


# ---------------------------------------------------------------------- into training

def test_train_fine_tunes_an_imported_checkpoint(lab_corpus, tmp_path):
    """HF folder -> export.py --import_hf -> train.py --init_from=resume_model --model_dir=DIR: the
    imported weights are the ones trained (the first evaluation equals our model's loss on the same
    batches, measured through the original checkpoint)."""
    data, vocab = lab_corpus.cache_dir, 1024  # a trained tokenizer and its default dataset
    model = shared_tiny_model(vocab_size=vocab, max_seq_len=32, tie_embeddings=False)
    original = tmp_path / "original"
    save_tiny(original / "ckpt.pt", model)
    hf.export_hf(model, str(tmp_path / "hf"), log=lambda *a: None)
    run_main("export.py", [str(tmp_path / "imported"), f"--import_hf={tmp_path / 'hf'}"], check=True)

    def first_eval(model_dir, out, **extra):
        args = dict(init_from="resume_model", model_dir=model_dir, out_dir=out, data_cache_dir=data, vocab_size=vocab,
                    max_seq_len=32, batch_size=4, gradient_accumulation_steps=1, max_iters=2, eval_interval=2,
                    eval_iters=2, max_new_tokens=0, device="cpu", dtype="float32", lr_scheduling=False, **extra)
        proc = run_main("train.py", [f"--{k}={v}" for k, v in args.items()])
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return records(out, "eval")[0]

    imported = first_eval(str(tmp_path / "imported"), str(tmp_path / "ft"))
    reference = first_eval(str(original), str(tmp_path / "ref"), eval_only=True)
    assert imported["iter"] == 0 and imported["loss/test"] == reference["loss/test"]
    assert load_checkpoint(str(tmp_path / "ft" / "ckpt.pt"))["iter_num"] == 2  # it trained on from there


@pytest.mark.parametrize("dtype, code", [(torch.bfloat16, "BF16"), (torch.float16, "F16")])
def test_hf_import_of_half_precision_weights(tmp_path, dtype, code):
    """Hub checkpoints are usually bf16/fp16: importing one gives our fp32 model holding exactly
    the rounded weights (compared here with the exported fp32 weights cast the same way)."""
    model = tiny_model(2, False)
    folder = tmp_path / "hf"
    hf.export_hf(model, str(folder), log=lambda *a: None)
    tensors = hf.read_safetensors(str(folder / "model.safetensors"))
    new_header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.to(dtype).contiguous().view(torch.int16).numpy().tobytes()
        new_header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    (folder / "model.safetensors").write_bytes(join_safetensors(new_header, b"".join(chunks)))
    args, state = hf.read_hf(str(folder))
    ours = model.state_dict()
    for k, v in state.items():
        assert v.dtype == torch.float32
        assert torch.equal(v, ours[k].to(dtype).to(torch.float32)), k
