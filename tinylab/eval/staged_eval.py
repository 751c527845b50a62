"""What staged-training's evaluation interfaces share (evaluation/eval_wikitext.py's `eval` and
`train` subcommands, evaluation/eval_lambada.py with its flags; docs/evaluation.md, "The
staged-training repository's commands"): the model flags, the model they name, and the rewriting
of click-style flags for argparse.

The model (`load_named_model`):
    --checkpoint-file=out/ckpt.pt        our checkpoint (or its folder, or an HF Llama folder) with
                                         its own tokenizer; --skip-loading-weights: its
                                         architecture at initialisation (seeded by --seed)
    --checkpoint-file=x.ckpt             a staged-training PyTorch Lightning GPT-2 checkpoint:
                                         built as the original did, through transformers, from
                                         --model-name's config and tokenizer (default gpt2)
    --model-name=NAME (or nothing)       any Hugging Face causal LM, hub name or local folder
                                         (default gpt2), with its own tokenizer, via transformers
A run folder written by `eval_wikitext.py train` has no tokenizer: its staged_training.json
(beside ckpt.pt) records the BOS / EOS ids its token-file blocks were made with.
"""
import json
import os
from dataclasses import dataclass
from typing import Optional

import torch

from model import ModelArgs, Transformer
from tinylab.core.checkpoint import load_checkpoint
from tinylab.core.config import Key
from tinylab.core.errors import UserError, first_line
from tinylab.eval.common import is_hf_dir, load_model, model_tokenizer
from tinylab.eval.hf_models import lightning_gpt2_state, load_hf_causal_lm, load_lightning_gpt2
from tinylab.interop.hf import imported_checkpoint, read_hf

RUN_INFO = "staged_training.json"  # written by `eval_wikitext.py train` into its log_dir
DEFAULT_MODEL_NAME = "gpt2"  # the original's --model-name default

MODEL_NAME = Key("model_name", "", "a Hugging Face causal LM, hub name or local folder, evaluated through transformers "
                 "with its own tokenizer ('' = gpt2, the original's default, unless --checkpoint-file is ours)",
                 aliases=("model-name",), input=True)
CHECKPOINT_FILE = Key("checkpoint_file", "", "our checkpoint (ckpt.pt or its folder; an HF Llama folder too), or a "
                      "staged-training Lightning GPT-2 checkpoint (built from --model-name's config and tokenizer)",
                      aliases=("checkpoint-file",), input=True)
SKIP_LOADING_WEIGHTS = Key("skip_loading_weights", False, "leave the model's weights at their random initialisation "
                           "(the architecture's baseline; seeded by --seed)", aliases=("skip-loading-weights",))
BOS_ID = Key("bos_id", -1, "token-file blocks: the BOS id; -1 = the run's staged_training.json or the tokenizer's",
             range="[-1, inf)", aliases=("bos-id",))
EOS_ID = Key("eos_id", -1, "token-file blocks: the EOS id; -1 = the run's staged_training.json or the tokenizer's",
             range="[-1, inf)", aliases=("eos-id",))


def flag_argv(argv, schema):
    """click flags are bare (`--amp`), and click lets positional arguments follow them; argparse
    would read the next word as the flag's value. Every bare boolean flag of `schema` (either
    spelling) becomes `--flag=True`."""
    bools = set()
    for k in schema.keys.values():
        if k.type is bool:
            bools |= {f"--{k.name}", *(f"--{a}" for a in k.aliases)}
    return [f"{a}=True" if a in bools else a for a in argv]


@dataclass
class Loaded:
    model: Optional[torch.nn.Module]
    tokenizer: object  # tokenizer.Tokenizer, hf_models.HFTokenizer, or None (not needed, not loaded)
    kind: str  # "ours" | "hf" | "lightning"
    name: str
    ckpt: Optional[dict] = None
    run_info: Optional[dict] = None


def read_run_info(checkpoint_path: str) -> Optional[dict]:
    folder = checkpoint_path if os.path.isdir(checkpoint_path) else os.path.dirname(os.path.abspath(checkpoint_path))
    path = os.path.join(folder, RUN_INFO)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except ValueError as e:
        raise UserError(f"{path} is not readable JSON ({first_line(e)}); delete it or pass --bos-id / --eos-id") from None
    if not isinstance(info, dict):
        raise UserError(f"{path} is not a JSON object; delete it or pass --bos-id / --eos-id")
    return info


def _probe_lightning(path: str):
    """The GPT-2 state dict if `path` is a staged-training Lightning checkpoint (read with
    torch.load(weights_only=True, mmap=True): cheap, and a pickle is never executed)."""
    if not os.path.isfile(path):
        return None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001  not a zip checkpoint, or not weights-only: load_checkpoint says why
        return None
    return lightning_gpt2_state(obj)


def _init_only(path, device, dtype, seed):
    """Our checkpoint's architecture at initialisation, and its checkpoint dict."""
    if is_hf_dir(path):
        ckpt = imported_checkpoint(*read_hf(path), f"hf:{path}")
    else:
        ckpt = load_checkpoint(path)
    torch.manual_seed(seed)
    model = Transformer(ModelArgs.from_dict(ckpt["model_args"]))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device=device, dtype=getattr(torch, dtype)).eval()
    model.requires_grad_(False)
    return model, ckpt


def load_named_model(a, need_model=True, need_tokenizer=True, log=print) -> Loaded:
    """The model and tokenizer the original's flags name (module docstring). `a` has
    checkpoint_file, model_name, skip_loading_weights (optional), device, dtype, seed,
    tokenizer_model, data_cache_dir. need_model=False skips an HF model's weights (a dry run);
    need_tokenizer=False skips our checkpoint's tokenizer (token files with known BOS / EOS)."""
    skip = getattr(a, "skip_loading_weights", False)
    if a.checkpoint_file:
        path = a.checkpoint_file
        if not os.path.exists(path):
            raise UserError(f"checkpoint not found: {path}")
        state = _probe_lightning(path)
        if state is not None:
            name = a.model_name or DEFAULT_MODEL_NAME
            model, tok = load_lightning_gpt2(path, state, name, a.device, a.dtype, skip, a.seed, need_model, log=log)
            return Loaded(model, tok, "lightning", f"{path} (staged-training GPT-2, config and tokenizer of {name})")
        if a.model_name:
            raise UserError(f"--model-name={a.model_name} and --checkpoint-file={path}: our checkpoint carries its own "
                            f"architecture and tokenizer; pass one of the two (--model-name goes with a staged-training "
                            f"GPT-2 checkpoint only)")
        model, ckpt = _init_only(path, a.device, a.dtype, a.seed) if skip else load_model(path, a.device, a.dtype)
        tok = model_tokenizer(ckpt, model, path, a.tokenizer_model, a.data_cache_dir) if need_tokenizer else None
        what = " (architecture only: random initialisation)" if skip else ""
        return Loaded(model, tok, "ours", f"{path}{what}", ckpt=ckpt, run_info=read_run_info(path))
    if a.tokenizer_model:
        raise UserError("--tokenizer_model applies to our checkpoints (--checkpoint-file); a --model-name model "
                        "uses its own tokenizer")
    name = a.model_name or DEFAULT_MODEL_NAME
    model, tok = load_hf_causal_lm(name, a.device, a.dtype, skip, a.seed, need_model)
    what = " (architecture only: random initialisation)" if skip else ""
    return Loaded(model, tok, "hf", f"{name} (transformers){what}")


def special_ids(a, loaded: Loaded):
    """(BOS, EOS) for token-file blocks: --bos-id / --eos-id, else the run's staged_training.json,
    else the tokenizer's (the original: its GPT-2 tokenizer's <|endoftext|> for both)."""
    info = loaded.run_info or {}
    out = []
    for name, flag in (("bos_id", "--bos-id"), ("eos_id", "--eos-id")):
        value = getattr(a, name)
        if value < 0:
            value = info.get(name)
        if value is None and loaded.tokenizer is not None:
            value = getattr(loaded.tokenizer, name)
        if value is None or not isinstance(value, int) or value < 0:
            raise UserError(f"no {name.split('_')[0].upper()} id for the token-file blocks: the model's tokenizer has "
                            f"none; pass {flag}=ID")
        out.append(value)
    return tuple(out)


def needs_tokenizer_for_ids(a, loaded_run_info) -> bool:
    info = loaded_run_info or {}
    return any(getattr(a, n) < 0 and not isinstance(info.get(n), int) for n in ("bos_id", "eos_id"))
