"""Hugging Face Llama folders, both ways: export (config.json, generation_config.json, fp32
model.safetensors, the tokenizer) and import (safetensors, sharded or not, or pytorch_model.bin)
as an ordinary checkpoint; safetensors read and written without the package.

Formats: docs/interop.md sections 2-3. Two layouts of the same network meet here: llama2.c/Meta
rotate adjacent pairs (2i, 2i+1) of each head, HF rotates (i, i + head_dim/2); the rows of wq and
wk are permuted per head on the way to HF and back on the way in (k with n_kv_heads), which keeps
every q.k dot product, and therefore the logits, unchanged. export.py is the command line.
Every output is written under a temporary name and renamed, so a failure leaves nothing half-written.
"""
import json
import math
import os
import shutil
import struct
import sys

import torch

from model import ModelArgs, Transformer
from tinylab.core.checkpoint import FORMAT_VERSION, load_weights, model_args_dict
from tinylab.core.errors import UserError, first_line
from tinylab.core.fileio import building_dir  # temp name + rename; a failure leaves nothing
from tinylab.interop.hf_tokenizer import HF_TOKENIZER_FILES, tokenizer_files, write_tokenizer_files
from tinylab.interop.llama2c import (  # the tie test, the fp32 layout and the tokenizer reader are shared
    fp32_bytes,
    load_sentencepiece,
    shared_classifier,
)

HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.model") + HF_TOKENIZER_FILES


# ---------------------------------------------------------------------- RoPE row layout

def permute_rope(w, n_heads):
    """Meta/llama2.c rows -> HF rows within each head: HF row j*(h/2)+i <- Meta row 2i+j."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def unpermute_rope(w, n_heads):
    """The inverse of permute_rope (HF -> Meta)."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


# ours -> HF, per layer; q and k additionally get the RoPE row permutation
HF_LAYER_NAMES = {
    "attention_norm": "input_layernorm", "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj",
}


def hf_state_dict(model, permute=True):
    """HF-named fp32 tensors; `permute=False` exists only for the test's negative control."""
    p = model.params
    out = {"model.embed_tokens.weight": model.tok_embeddings.weight}
    for i, layer in enumerate(model.layers):
        for ours, theirs in HF_LAYER_NAMES.items():
            w = layer.get_submodule(ours).weight
            if permute and ours == "attention.wq":
                w = permute_rope(w, p.n_heads)
            elif permute and ours == "attention.wk":
                w = permute_rope(w, p.kv_heads())
            out[f"model.layers.{i}.{theirs}.weight"] = w
    out["model.norm.weight"] = model.norm.weight
    if not shared_classifier(model):
        out["lm_head.weight"] = model.output.weight  # tied: HF re-ties on load, safetensors refuses aliases
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def _transformers_version():
    try:
        from importlib.metadata import version
        return version("transformers")
    except Exception:  # not installed: the export does not need it
        return "5.0.0"


def hf_config(model, bos_id=1, eos_id=2):
    p = model.params
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": p.vocab_size,
        "hidden_size": p.dim,
        "intermediate_size": model.layers[0].feed_forward.w1.weight.shape[0],
        "num_hidden_layers": p.n_layers,
        "num_attention_heads": p.n_heads,
        "num_key_value_heads": p.kv_heads(),
        "head_dim": p.dim // p.n_heads,
        "hidden_act": "silu",
        "max_position_embeddings": p.max_seq_len,
        "rms_norm_eps": p.norm_eps,  # explicit: HF's default 1e-6 differs from llama2.c's 1e-5
        # transformers 4.x reads the first two, 5.x the third; writing both serves either
        "rope_theta": float(p.rope_theta),
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(p.rope_theta)},
        "tie_word_embeddings": shared_classifier(model),
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": None,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "float32",
        "transformers_version": _transformers_version(),
    }


SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def write_safetensors(f, tensors):
    """safetensors without the package: u64 header length, JSON header, raw little-endian data."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        n = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as the reference writer does
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for t in tensors.values():
        f.write(fp32_bytes(t))


def read_safetensors(path):
    """All tensors of a safetensors file. The header is checked against the file before any byte is
    used, so a truncated or damaged file is refused by name, never read as zeros or garbage."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"cannot read {path} ({first_line(e, 120)})")
    if len(data) < 8:
        raise UserError(f"{path} is not a safetensors file ({len(data)} bytes, too short for the header length)")
    (n,) = struct.unpack_from("<Q", data, 0)
    if n > len(data) - 8:
        raise UserError(f"{path} is truncated or not a safetensors file (its header length {n} exceeds the {len(data)}-byte file)")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise UserError(f"{path} is not a safetensors file (header is not JSON: {first_line(e, 120)})")
    if not isinstance(header, dict):
        raise UserError(f"{path} is not a safetensors file (header is not a JSON object)")
    data_len = len(data) - 8 - n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name}"
        try:
            dtype_name, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise UserError(f"{where} has a malformed header entry (needs dtype, shape and data_offsets [begin, end])")
        dtype = SAFETENSORS_DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None:
            raise UserError(f"{where} has unsupported dtype {dtype_name!r} (known: {', '.join(SAFETENSORS_DTYPES)})")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(begin, int) and isinstance(end, int)):
            raise UserError(f"{where} has a malformed shape {shape!r} or data_offsets {info['data_offsets']!r}")
        if not 0 <= begin <= end <= data_len:
            raise UserError(f"{where}: bytes [{begin}, {end}) lie outside the {data_len}-byte data section (truncated file?)")
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if end - begin != nbytes:
            raise UserError(f"{where}: {end - begin} bytes for shape {shape} of {dtype_name}, which needs {nbytes}")
        # bytearray: a writable copy (torch.frombuffer refuses empty buffers, hence the 0-element case)
        buf = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(buf, dtype=dtype).reshape(shape) if buf else torch.empty(shape, dtype=dtype)
    return out


def read_torch_weights(path):
    """A pytorch_model.bin (or one of its shards): a dict of tensors, or a one-line error."""
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # on arbitrary bytes the unpickler raises almost anything (IndexError, KeyError, ...)
        raise UserError(f"{path} is not a readable PyTorch weights file ({first_line(e, 120)})")
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise UserError(f"{path} is not a PyTorch state dict (expected a dict of tensors)")
    return sd


def export_hf(model, out_dir, tokenizer=None, permute=True, log=print):
    """The HF folder: config, generation config, weights and, with a sentencepiece `tokenizer`, the
    original tokenizer.model plus the tokenizer.json / configs AutoTokenizer loads (hf_tokenizer.py).
    Everything is checked (and the tokenizer converted) before the folder is touched."""
    bos_id, eos_id, tok_files = 1, 2, {}
    if tokenizer is not None:
        sp = load_sentencepiece(tokenizer)
        bos_id, eos_id = sp.bos_id(), sp.eos_id()
        tok_files = tokenizer_files(tokenizer, model.params.max_seq_len)
        if sp.get_piece_size() != model.params.vocab_size:
            print(f"warning: tokenizer has {sp.get_piece_size()} pieces, the model's vocab_size is {model.params.vocab_size}", file=sys.stderr)
    if os.path.exists(out_dir):
        # the folder is replaced as a whole: only if it holds nothing but an earlier export
        if not os.path.isdir(out_dir):
            raise UserError(f"{out_dir} exists and is not a folder")
        foreign = sorted(set(os.listdir(out_dir)) - set(HF_FILES))
        if foreign:
            raise UserError(f"{out_dir} already holds other files ({', '.join(foreign[:3])}); choose a new or empty folder")
    config = hf_config(model, bos_id, eos_id)
    with torch.no_grad(), building_dir(out_dir) as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": bos_id, "eos_token_id": eos_id, "transformers_version": config["transformers_version"]}, f, indent=2)
        with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
            write_safetensors(f, hf_state_dict(model, permute))
        if tokenizer is not None:
            shutil.copyfile(tokenizer, os.path.join(tmp, "tokenizer.model"))  # for sentencepiece / llama.cpp users
            write_tokenizer_files(tok_files, tmp)
    log(f"wrote {out_dir} (HF LlamaForCausalLM, fp32 safetensors{', tokenizer' if tokenizer else ''})")


def _hf_weights(hf_dir):
    """All tensors of an HF directory: model.safetensors, sharded safetensors, or pytorch_model.bin."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = os.path.join(hf_dir, index_name)
        if os.path.isfile(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise UserError(f"{index} is not a readable shard index ({first_line(e, 120)})")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise UserError(f"{index}: weight_map is not a mapping of tensor names to shard files")
            files = sorted(set(weight_map.values()))
            # every shard must be there: importing only some would leave weights missing or mixed
            for name in files:
                if not os.path.isfile(os.path.join(hf_dir, name)):
                    raise UserError(f"{os.path.join(hf_dir, name)} not found (a shard named in {index_name})")
            break
    else:
        files = [n for n in ("model.safetensors", "pytorch_model.bin") if os.path.isfile(os.path.join(hf_dir, n))][:1]
    if not files:
        raise UserError(f"{hf_dir} has no model.safetensors or pytorch_model.bin")
    weights = {}
    for name in files:
        path = os.path.join(hf_dir, name)
        weights.update(read_safetensors(path) if name.endswith(".safetensors") else read_torch_weights(path))
    return weights


def hf_model_args(config, where):
    """ModelArgs from an HF config.json dict, refusing what our model cannot represent."""
    arch = config.get("architectures") or []
    if arch and "LlamaForCausalLM" not in arch:
        raise UserError(f"{where}: unsupported architecture {', '.join(map(str, arch))} (only LlamaForCausalLM can be imported)")
    if not arch and config.get("model_type") != "llama":
        raise UserError(f"{where}: unsupported model_type {config.get('model_type')!r} (only llama / LlamaForCausalLM can be imported)")
    try:
        dim, n_heads = config["hidden_size"], config["num_attention_heads"]
        args = dict(dim=dim, n_layers=config["num_hidden_layers"], n_heads=n_heads,
                    n_kv_heads=config.get("num_key_value_heads") or n_heads, vocab_size=config["vocab_size"],
                    hidden_dim=config["intermediate_size"], max_seq_len=config.get("max_position_embeddings", 2048),
                    norm_eps=config.get("rms_norm_eps", 1e-6))  # 1e-6: LlamaConfig's default when absent
    except KeyError as e:
        raise UserError(f"{where} lacks the field {e.args[0]}")
    rope = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if scaling or rope_type != "default":
        raise UserError(f"{where}: RoPE scaling {scaling or rope_type!r} is not supported (plain RoPE only)")
    args["rope_theta"] = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    unsupported = [f"{k}={config[k]!r}" for k, ok in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False))
                   if config.get(k, ok) != ok]
    if config.get("head_dim") not in (None, dim // n_heads):
        unsupported.append(f"head_dim={config['head_dim']} (ours is hidden_size/num_attention_heads = {dim // n_heads})")
    if unsupported:
        raise UserError(f"{where}: unsupported Llama variant: {', '.join(unsupported)}")
    return args


def read_hf(hf_dir):
    """(ModelArgs, our state dict) from an HF Llama directory."""
    cfg_path = os.path.join(hf_dir, "config.json")
    if not os.path.isdir(hf_dir):
        raise UserError(f"HF model folder not found: {hf_dir}")
    if not os.path.isfile(cfg_path):
        raise UserError(f"{hf_dir} has no config.json (not a Hugging Face model folder)")
    try:
        with open(cfg_path) as f:
            config = json.load(f)
    except ValueError as e:
        raise UserError(f"{cfg_path} is not valid JSON ({e})")
    args = hf_model_args(config, cfg_path)
    hf = {k: v.to(torch.float32) for k, v in _hf_weights(hf_dir).items()}
    state = {}

    def take(name):
        if name not in hf:
            raise UserError(f"{hf_dir}: weights lack {name}")
        return hf[name]
    state["tok_embeddings.weight"] = take("model.embed_tokens.weight")
    for i in range(args["n_layers"]):
        for ours, theirs in HF_LAYER_NAMES.items():
            w = take(f"model.layers.{i}.{theirs}.weight")
            if ours == "attention.wq":
                w = unpermute_rope(w, args["n_heads"])
            elif ours == "attention.wk":
                w = unpermute_rope(w, args["n_kv_heads"])  # k has only the kv heads (GQA)
            state[f"layers.{i}.{ours}.weight"] = w
    state["norm.weight"] = take("model.norm.weight")
    head = hf.get("lm_head.weight")
    tied = head is None or torch.equal(head, state["tok_embeddings.weight"])
    state["output.weight"] = state["tok_embeddings.weight"] if tied else head
    return ModelArgs(**args, tie_embeddings=tied), {k: v.contiguous() for k, v in state.items()}


def imported_checkpoint(args: ModelArgs, state, source):
    """An ordinary checkpoint at iteration 0 with no optimizer state (what resume_model loads)."""
    model = Transformer(args)
    load_weights(model, state)  # the tie is real again: output.weight is tok_embeddings.weight
    margs = model_args_dict(model)
    margs["n_kv_heads"] = args.kv_heads()
    config = {k: margs[k] for k in ("vocab_size", "max_seq_len", "dim", "n_layers", "n_heads", "n_kv_heads",
                                    "multiple_of", "dropout")}
    return {"model": model.state_dict(), "model_args": margs, "iter_num": 0, "best_val_loss": 1e9,
            "config": config, "optimizer": None, "format_version": FORMAT_VERSION, "imported_from": source}


def import_output_path(out):
    return out if out.endswith(".pt") else os.path.join(out, "ckpt.pt")
