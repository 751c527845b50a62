"""Hugging Face causal language models behind this project's evaluation interfaces, through
`transformers` (imported only here, only when asked for): staged-training's `--model-name` (a hub
name or a local folder of any causal LM) and its PyTorch Lightning GPT-2 checkpoints.

    HFCausalLM    the model: forward(tokens, all_logits=True) -> logits, .params.max_seq_len /
                  .params.vocab_size, as perplexity.py and lambada.py call our Transformer
    HFTokenizer   the tokenizer: encode(text, bos) (bos: the tokenizer's own special tokens, e.g.
                  none for GPT-2, BOS for Llama), encode_batch, decode, bos_id / eos_id / pad_id
    load_hf_causal_lm(name, ...)      the model (or its architecture at initialisation) + tokenizer
    lightning_gpt2_state(ckpt)        the GPT-2 state dict inside a staged-training checkpoint
    load_lightning_gpt2(path, ...)    that checkpoint as the original's eval built it

Every failure (no transformers, an unreachable hub, offline and not cached, no such model, a
checkpoint that does not fit) is one UserError line.
"""
import os
from types import SimpleNamespace

import torch
from torch import nn

from tinylab.core.errors import UserError, first_line
from tinylab.interop import hub


def _transformers(why):
    try:
        import transformers
    except ImportError:
        raise UserError(f"{why} needs the `transformers` package (pip install transformers)") from None
    transformers.utils.logging.disable_progress_bar()  # its "Loading weights" bars are not our output
    return transformers


class HFCausalLM(nn.Module):
    """A transformers causal LM with this project's model call: model(tokens, all_logits=True)
    returns (B, T, vocab) logits. No attention mask is passed: batches are right-padded, which
    causal attention keeps away from every real position (staged-training passed none either)."""

    def __init__(self, hf_model, name: str):
        super().__init__()
        self.hf, self.name = hf_model, name
        cfg = hf_model.config
        max_len = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        vocab = hf_model.get_output_embeddings().weight.shape[0]
        self.params = SimpleNamespace(max_seq_len=int(max_len) if max_len else 1 << 30, vocab_size=int(vocab))

    def forward(self, tokens, all_logits=True):
        return self.hf(input_ids=tokens).logits

    def num_params(self):
        return sum(p.numel() for p in self.hf.parameters())


class HFTokenizer:
    """A transformers tokenizer with this project's Tokenizer calls. `bos=True` means the
    tokenizer's own special tokens (add_special_tokens=True: none for GPT-2, BOS for Llama-style
    tokenizers); `bos=False` the text's tokens only. BOS / EOS for token-file blocks are the
    original's choice: bos_token_id or else cls_token_id, eos_token_id or else sep_token_id."""

    def __init__(self, tok, name: str):
        self.tok, self.model_path = tok, name
        self.bos_id = tok.bos_token_id if tok.bos_token_id is not None else tok.cls_token_id
        self.eos_id = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
        self.pad_id = tok.pad_token_id
        self.vocab_size = len(tok)

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list:
        return list(self.tok(text, add_special_tokens=bos)["input_ids"])

    def encode_batch(self, texts, bos: bool = True, eos: bool = False, num_threads: int = 1) -> list:
        texts = list(texts)
        return [list(ids) for ids in self.tok(texts, add_special_tokens=bos)["input_ids"]] if texts else []

    def decode(self, ids) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return self.tok.decode([int(i) for i in ids])


def _check_reachable(name: str, flag: str):
    """A hub name (not a local folder) needs the hub or the local cache: an unreachable hub is one
    quick line (hub.py's probe), not transformers' retries."""
    if os.path.isdir(name):
        return
    if os.path.exists(name) or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise UserError(f"{flag}={name}: no such model folder")
    if hub.offline():
        return  # transformers reads its cache; not cached is its error, translated below
    problem = hub.unreachable()
    if problem:
        raise UserError(f"{flag}={name} needs the Hugging Face hub, but {hub.endpoint()} cannot be reached "
                        f"({problem}); pass a local model folder, or download it where the network works "
                        f"(then HF_HUB_OFFLINE=1 reads the cache)")


def _loading(name, flag, fn):
    try:
        return fn()
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001  not cached, no such repo, not a causal LM, a broken folder: the user's
        mode = " (offline: HF_HUB_OFFLINE set, and not in the local cache?)" if hub.offline() and not os.path.isdir(name) else ""
        raise UserError(f"{flag}={name}: transformers cannot load it{mode} ({first_line(e)})") from None


def load_hf_tokenizer(name: str, flag: str = "--model-name") -> HFTokenizer:
    transformers = _transformers(f"{flag}={name}")
    _check_reachable(name, flag)
    return HFTokenizer(_loading(name, flag, lambda: transformers.AutoTokenizer.from_pretrained(name)), name)


def _placed(model, device, dtype):
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device=device, dtype=getattr(torch, dtype)).eval()
    model.requires_grad_(False)
    return model


def load_hf_causal_lm(name: str, device: str = "", dtype: str = "float32", skip_weights: bool = False, seed: int = 0,
                      need_model: bool = True, flag: str = "--model-name"):
    """(HFCausalLM or None, HFTokenizer) of a hub name or local folder. skip_weights: the model's
    architecture (its config) at initialisation, seeded (the original's --skip-loading-weights)."""
    transformers = _transformers(f"{flag}={name}")
    tok = load_hf_tokenizer(name, flag)
    if not need_model:
        return None, tok
    if skip_weights:
        config = _loading(name, flag, lambda: transformers.AutoConfig.from_pretrained(name))
        torch.manual_seed(seed)
        hf = _loading(name, flag, lambda: transformers.AutoModelForCausalLM.from_config(config))
    else:
        hf = _loading(name, flag, lambda: transformers.AutoModelForCausalLM.from_pretrained(name))
    return _placed(HFCausalLM(hf, name), device, dtype), tok


# ---------------------------------------------------------------------- staged-training's checkpoints

def lightning_gpt2_state(ckpt):
    """The GPT-2 state dict of a staged-training (PyTorch Lightning) checkpoint, its "model."
    prefixes removed as the original did, or None when `ckpt` is not one."""
    if not isinstance(ckpt, dict) or "model" in ckpt or not isinstance(ckpt.get("state_dict"), dict):
        return None
    state = {k.replace("model.", ""): v for k, v in ckpt["state_dict"].items()}
    return state if "transformer.wte.weight" in state else None


_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers older transformers saved


def load_lightning_gpt2(path: str, state: dict, model_name: str, device: str = "", dtype: str = "float32",
                        skip_weights: bool = False, seed: int = 0, need_model: bool = True, log=print):
    """The original's eval of a Lightning checkpoint: GPT2Config of `model_name` with the width
    and depth read off the weights, n_head guessed as the original did (16 for widths 1536 and
    3072, else 8), n_positions 1024, the weights loaded strictly; the tokenizer is model_name's.
    File names with "alibi" / "rotary" selected position-embedding variants of the original's own
    fork of transformers, which stock transformers does not have: refused."""
    flag = "--model-name"
    for variant in ("alibi", "rotary"):
        if variant in path:
            raise UserError(f"{path}: the original read '{variant}' in a checkpoint's file name as a position-embedding "
                            f"variant of its own fork of transformers, which stock transformers cannot evaluate")
    transformers = _transformers(f"{path} (a staged-training GPT-2 checkpoint)")
    tok = load_hf_tokenizer(model_name, flag)
    if not need_model:
        return None, tok
    config = _loading(model_name, flag, lambda: transformers.GPT2Config.from_pretrained(model_name))
    config.n_embd = int(state["transformer.wte.weight"].shape[1])
    config.n_layer = len([k for k in state if k.endswith("mlp.c_proj.bias")])
    config.n_head = 16 if config.n_embd in (1536, 3072) else 8
    config.n_positions = 1024
    log(f"Adjusting hidden_size to {config.n_embd}, num_layers to {config.n_layer} (n_head {config.n_head}, "
        f"as the original guessed)")
    if config.n_embd % config.n_head:
        raise UserError(f"{path}: width {config.n_embd} is not divisible by the {config.n_head} heads the original assumes")
    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(config)
    if not skip_weights:
        weights = {k: v for k, v in state.items() if not k.endswith(_BUFFERS)}
        own = {k: v for k, v in hf.state_dict().items() if not k.endswith(_BUFFERS)}
        if "lm_head.weight" in own and "lm_head.weight" not in weights:
            weights["lm_head.weight"] = weights["transformer.wte.weight"]  # tied
        missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
        if missing or unexpected:
            raise UserError(f"{path}: the weights do not fit {model_name}'s GPT-2 (missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]})")
        bad = [k for k in own if tuple(own[k].shape) != tuple(weights[k].shape)]
        if bad:
            raise UserError(f"{path}: tensor {bad[0]} has shape {tuple(weights[bad[0]].shape)}, the GPT-2 built from "
                            f"{model_name} expects {tuple(own[bad[0]].shape)}")
        hf.load_state_dict(weights, strict=False)
    return _placed(HFCausalLM(hf, f"{path} (GPT-2 from {model_name})"), device, dtype), tok
