"""llama2.c's files: model .bin files (v0 legacy, v1 fp32, v2 int8 Q8_0) both ways, and run.c's
tokenizer .bin.

The byte layouts are docs/interop.md section 1; export.py is the command line. Every output is
written under a temporary name and renamed, so a failure leaves nothing half-written.
"""
import os
import struct
import sys
from dataclasses import dataclass

import numpy as np
import torch

from model import ModelArgs, Transformer, precompute_freqs_cis
from tinylab.core.errors import UserError, first_line
from tinylab.core.fileio import atomic_file  # temp name + rename; a failure leaves nothing

MAGIC = 0x616B3432  # "ak42", header of the v1/v2 files
HEADER_BYTES = 256
LEGACY_HEADER = struct.Struct("<7i")  # dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len
# what run.c / runq.c hard-code; a model trained with other values still exports, with a warning
RUNC_NORM_EPS, RUNC_ROPE_THETA = 1e-5, 10000.0
# each layer's matrices in the order v1/v2 store them (all layers' wq, then all layers' wk, ...);
# v0 stores the same kinds in V0_LAYER_ORDER, the norms among them
LAYER_MATRICES = ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                  "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
V0_LAYER_ORDER = ("attention_norm", "attention.wq", "attention.wk", "attention.wv", "attention.wo",
                  "ffn_norm", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")


def fp32_bytes(t):
    """A tensor's values as little-endian float32 bytes (every fp32 field of these formats)."""
    return t.detach().to(torch.float32).contiguous().cpu().numpy().astype("<f4", copy=False).tobytes()


# ---------------------------------------------------------------------- model .bin

def shared_classifier(model: Transformer) -> bool:
    # llama2.c's test: an untied head that happens to equal the embedding is written once too
    return bool(torch.equal(model.tok_embeddings.weight, model.output.weight))


def _layer_tensors(model, name):
    """`name` of every layer in order ('attention.wq' -> [layer0.attention.wq.weight, ...])."""
    return [layer.get_submodule(name).weight for layer in model.layers]


def _header_fields(model, vocab_size):
    p = model.params
    hidden_dim = model.layers[0].feed_forward.w1.weight.shape[0]  # the real row count, not the rule
    return (p.dim, hidden_dim, p.n_layers, p.n_heads, p.kv_heads(), vocab_size, p.max_seq_len)


def _v1_header(model, version, group_size=None):
    header = struct.pack("<Ii", MAGIC, version) + LEGACY_HEADER.pack(*_header_fields(model, model.params.vocab_size))
    header += struct.pack("<B", int(shared_classifier(model)))
    if group_size is not None:
        header += struct.pack("<i", group_size)  # byte 37, unaligned, as llama2.c writes it
    return header + b"\0" * (HEADER_BYTES - len(header))


def _matrices(model):
    """Weight matrices in the v1/v2 order (v0 uses the same per-kind order with norms mixed in)."""
    mats = [model.tok_embeddings.weight]
    for name in LAYER_MATRICES:
        mats += _layer_tensors(model, name)
    if not shared_classifier(model):
        mats.append(model.output.weight)
    return mats


def _norms(model):
    return _layer_tensors(model, "attention_norm") + _layer_tensors(model, "ffn_norm") + [model.norm.weight]


def write_v0(model, f):
    p = model.params
    shared = shared_classifier(model)
    f.write(LEGACY_HEADER.pack(*_header_fields(model, p.vocab_size if shared else -p.vocab_size)))
    tensors = [model.tok_embeddings.weight]
    for name in V0_LAYER_ORDER:
        tensors += _layer_tensors(model, name)
    # run.c skips the RoPE tables but still expects them in the file
    tensors += [model.norm.weight, model.freqs_cos[:p.max_seq_len], model.freqs_sin[:p.max_seq_len]]
    if not shared:
        tensors.append(model.output.weight)
    for t in tensors:
        f.write(fp32_bytes(t))


def write_v1(model, f):
    f.write(_v1_header(model, 1))
    for t in _norms(model) + _matrices(model):
        f.write(fp32_bytes(t))


def quantize_q80(w, group_size):
    """Symmetric int8 per group of `group_size` consecutive values (row-major).
    Returns (int8 values, fp32 scales, max |w - q*scale|). An all-zero group gets scale 0 and
    q = 0 (llama2.c would compute 0/0 = NaN there; depth-grown models have zero wo/w2)."""
    w = w.detach().to(torch.float32).reshape(-1, group_size)
    scale = w.abs().amax(dim=1) / 127.0
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / divisor[:, None]).clamp(-127, 127).to(torch.int8)
    err = (q.to(torch.float32) * scale[:, None] - w).abs().max().item()
    return q, scale, err


def v2_group_size(dim, group_size=64):
    while dim % group_size:
        group_size //= 2
    return group_size


def write_v2(model, f, group_size=64, log=print):
    """Q8_0 file for runq.c; returns the largest per-element quantisation error."""
    group_size = v2_group_size(model.params.dim, group_size)
    mats = _matrices(model)
    for w in mats:
        if w.numel() % group_size:
            raise UserError(f"a weight of shape {tuple(w.shape)} is not a multiple of the Q8_0 group size {group_size}")
    f.write(_v1_header(model, 2, group_size))
    for t in _norms(model):
        f.write(fp32_bytes(t))
    max_err = 0.0
    for i, w in enumerate(mats):
        q, scale, err = quantize_q80(w, group_size)
        # per tensor: its int8 values then its scales (the current llama2.c layout)
        f.write(q.numpy().tobytes())
        f.write(fp32_bytes(scale))
        max_err = max(max_err, err)
        log(f"{i + 1}/{len(mats)} quantized {tuple(w.shape)} to Q8_0 (group size {group_size}) with max error {err:.6g}")
    log(f"max quantization error across all weights: {max_err:.9g}")
    return max_err


def export_bin(model, path, version, group_size=64, log=print):
    """Write llama2.c file version 0, 1 or 2 (atomically)."""
    p = model.params
    if p.norm_eps != RUNC_NORM_EPS or p.rope_theta != RUNC_ROPE_THETA:
        print(f"warning: run.c assumes norm_eps={RUNC_NORM_EPS} and rope_theta={RUNC_ROPE_THETA:g}; this model has "
              f"norm_eps={p.norm_eps} and rope_theta={p.rope_theta:g}, which the .bin cannot record", file=sys.stderr)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with torch.no_grad(), atomic_file(path) as f:
        if version == 0:
            write_v0(model, f)
        elif version == 1:
            write_v1(model, f)
        else:
            write_v2(model, f, group_size, log=log)
    log(f"wrote {path} (llama2.c v{version}, {os.path.getsize(path)} bytes)")


@dataclass
class BinHeader:
    """What a llama2.c model file's header says, and where its tensors start."""
    version: int
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    max_seq_len: int
    shared: bool  # one matrix for the embedding and the output head
    group_size: int  # Q8_0 group size (v2); 0 otherwise
    offset: int  # the first tensor's byte

    def nbytes(self, shape, kind):
        """Bytes of one tensor: kind "f" is always fp32, kind "m" (a matrix) is Q8_0 in v2."""
        n = int(np.prod(shape))
        return n * 4 if (kind == "f" or self.version != 2) else n + (n // self.group_size) * 4


def _read_header(data, path) -> BinHeader:
    """The header of either layout: v1/v2 begin with MAGIC, v0 with the seven shape fields (a
    negative vocab_size there meaning an untied head). Refuses implausible values by name."""
    if len(data) < LEGACY_HEADER.size:
        raise UserError(f"{path} is too short to be a llama2.c model file ({len(data)} bytes)")
    magic, version = struct.unpack_from("<Ii", data, 0)
    if magic == MAGIC:
        if version not in (1, 2) or len(data) < HEADER_BYTES:
            raise UserError(f"{path}: unsupported llama2.c file version {version} (1 and 2 are known)")
        fields = LEGACY_HEADER.unpack_from(data, 8)
        shared = bool(data[36])
        group_size = struct.unpack_from("<i", data, 37)[0] if version == 2 else 0
        offset = HEADER_BYTES
    else:
        version, group_size, offset = 0, 0, LEGACY_HEADER.size
        fields = LEGACY_HEADER.unpack_from(data, 0)
        shared = fields[5] > 0
        fields = fields[:5] + (abs(fields[5]),) + fields[6:]
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = fields
    if min(fields) <= 0 or dim % n_heads or n_heads % n_kv:
        raise UserError(f"{path} is not a llama2.c model file (implausible header: dim={dim}, hidden_dim={hidden}, n_layers={n_layers}, "
                        f"n_heads={n_heads}, n_kv_heads={n_kv}, vocab_size={vocab}, max_seq_len={seq_len})")
    if version == 2 and (group_size <= 0 or dim % group_size):
        raise UserError(f"{path}: Q8_0 group size {group_size} does not divide dim {dim}")
    return BinHeader(version, *fields, shared, group_size, offset)


def _tensor_order(h: BinHeader):
    """The file's tensors in order, as (state-dict name, shape, kind): kind "f" always fp32,
    "m" a matrix (Q8_0 in v2). v0 also holds the RoPE tables (freqs_cos, freqs_sin)."""
    head_dim = h.dim // h.n_heads
    kv_dim = h.n_kv_heads * head_dim
    shapes = {"attention.wq": (h.dim, h.dim), "attention.wk": (kv_dim, h.dim), "attention.wv": (kv_dim, h.dim),
              "attention.wo": (h.dim, h.dim), "feed_forward.w1": (h.hidden_dim, h.dim),
              "feed_forward.w2": (h.dim, h.hidden_dim), "feed_forward.w3": (h.hidden_dim, h.dim)}

    def per_layer(name, shape, kind):
        return [(f"layers.{i}.{name}.weight", shape, kind) for i in range(h.n_layers)]
    norms = (per_layer("attention_norm", (h.dim,), "f") + per_layer("ffn_norm", (h.dim,), "f")
             + [("norm.weight", (h.dim,), "f")])
    mats = [("tok_embeddings.weight", (h.vocab_size, h.dim), "m")]
    for name in LAYER_MATRICES:
        mats += per_layer(name, shapes[name], "m")
    head = [] if h.shared else [("output.weight", (h.vocab_size, h.dim), "m")]
    if h.version != 0:
        return norms + mats + head
    rope = [("freqs_cos", (h.max_seq_len, head_dim // 2), "f"), ("freqs_sin", (h.max_seq_len, head_dim // 2), "f")]
    order = [mats[0]]
    for name in V0_LAYER_ORDER:
        order += [t for t in norms + mats if t[0].endswith(f".{name}.weight")]
    return order + [norms[-1]] + rope + head


def _read_tensors(data, h: BinHeader, order):
    """{name: fp32 tensor} of every tensor in `order`, v2's matrices dequantised."""
    state, offset = {}, h.offset
    for name, shape, kind in order:
        n = int(np.prod(shape))
        if kind == "m" and h.version == 2:
            q = np.frombuffer(data, dtype=np.int8, count=n, offset=offset).astype(np.float32)
            scale = np.frombuffer(data, dtype="<f4", count=n // h.group_size, offset=offset + n)
            arr = (q.reshape(-1, h.group_size) * scale[:, None]).reshape(shape)
        else:
            arr = np.frombuffer(data, dtype="<f4", count=n, offset=offset).reshape(shape)
        offset += h.nbytes(shape, kind)
        state[name] = torch.from_numpy(arr.astype(np.float32))  # copies out of the read-only buffer
    return state


def _check_rope_tables(state, h: BinHeader, path):
    """v0's tables record theta; the formats after v0 do not and run.c assumes 10000: a v0 file
    with other tables cannot be represented with RUNC_ROPE_THETA. Removes them from `state`."""
    cos, sin = precompute_freqs_cis(h.dim // h.n_heads, h.max_seq_len, RUNC_ROPE_THETA)
    if not (torch.allclose(state.pop("freqs_cos"), cos, atol=1e-5) and torch.allclose(state.pop("freqs_sin"), sin, atol=1e-5)):
        raise UserError(f"{path}: its RoPE tables are not those of rope_theta={RUNC_ROPE_THETA:g}; cannot import")


def read_bin(path):
    """Parse a llama2.c v0/v1/v2 file into (ModelArgs, state dict of fp32 tensors); v2 weights are
    dequantised. The file size must match the header exactly."""
    if not os.path.isfile(path):
        raise UserError(f"llama2.c model file not found: {path}")
    with open(path, "rb") as f:
        data = f.read()
    h = _read_header(data, path)
    order = _tensor_order(h)
    expected = h.offset + sum(h.nbytes(s, k) for _, s, k in order)
    if expected != len(data):
        raise UserError(f"{path}: {len(data)} bytes, but its v{h.version} header describes a {expected}-byte file")
    state = _read_tensors(data, h, order)
    if h.shared:
        state["output.weight"] = state["tok_embeddings.weight"]
    if h.version == 0:
        _check_rope_tables(state, h, path)
    args = ModelArgs(dim=h.dim, n_layers=h.n_layers, n_heads=h.n_heads, n_kv_heads=h.n_kv_heads,
                     vocab_size=h.vocab_size, hidden_dim=h.hidden_dim, max_seq_len=h.max_seq_len,
                     tie_embeddings=h.shared, norm_eps=RUNC_NORM_EPS, rope_theta=RUNC_ROPE_THETA)
    return args, state


# ---------------------------------------------------------------------- tokenizer .bin

def load_sentencepiece(model_path):
    import sentencepiece as spm
    if not os.path.isfile(model_path):
        raise UserError(f"tokenizer model not found: {model_path}")
    try:
        return spm.SentencePieceProcessor(model_file=model_path)
    except (RuntimeError, OSError) as e:
        raise UserError(f"{model_path} is not a sentencepiece model ({first_line(e, 120)})")


def export_tokenizer(model_path, out_path, log=print):
    """run.c's tokenizer file: uint32 max_token_length, then per id: f32 score, i32 length, bytes."""
    sp = load_sentencepiece(model_path)
    tokens, scores = [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if i == sp.bos_id():
            piece = "\n<s>\n"
        elif i == sp.eos_id():
            piece = "\n</s>\n"
        tokens.append(piece.replace("\u2581", " ").encode("utf-8"))
        scores.append(sp.get_score(i))
    max_len = max(len(t) for t in tokens)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with atomic_file(out_path) as f:
        f.write(struct.pack("<I", max_len))
        for b, s in zip(tokens, scores):
            f.write(struct.pack("<fi", s, len(b)))
            f.write(b)
    log(f"wrote {out_path} ({len(tokens)} tokens, max token length {max_len})")
