"""`finetune_t0.py --preprocess`: a Megatron indexed prefix from a json / jsonl / parquet file of
T0 records, written as Megatron-DeepSpeed's tools/preprocess_data.py (branch t0loading) writes it
(docs/t0.md, "Megatron-DeepSpeed's data and arguments"):

    python finetune_t0.py --preprocess --input rte.jsonl --output-prefix data/rte --json-key inputs \\
        --tokenizer-type PretrainedFromHF --tokenizer-name-or-path tok/
    python finetune_t0.py --preprocess --input rte.jsonl --output-prefix data/rte --json-key targets \\
        --tokenizer-type PretrainedFromHF --tokenizer-name-or-path tok/ --append-eod --prepend-space

Each json key K gives <prefix>_K_document.{bin,idx}: one item per record (one document each, as
without --split-sentences), uint16 ids below 65,500 tokens and int32 above. Two tokenisations:
  - a Hugging Face tokenizer folder (--tokenizer-name-or-path): Megatron's, exactly: the item is
    tokenizer.encode(text) (" " + text with --prepend-space), then EOS with --append-eod (else BOS
    with --append-bos), nothing else;
  - the base checkpoint's sentencepiece tokenizer (--model_dir or --tokenizer_model): as training
    tokenises text (add_bos, target_space, add_eos), so the prefix trains exactly as its file does.
Only the files of the keys given are written and guarded, so the recipe's two passes (inputs,
then targets with --append-eod, same prefix) build one prefix.
"""
import os

from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.core.outputs import guard_prefix
from tinylab.data.tokenizer import Tokenizer
from tinylab.t0 import megatron as megatron_data
from tinylab.t0.encode import encode_records, usable
from tinylab.t0.finetune import base_checkpoint, resolve_tokenizer
from tinylab.t0.megatron_args import load_hf_tokenizer
from tinylab.t0.mixture import Source
from tinylab.t0.options import TokenizationOptions
from tinylab.t0.sources import read_records

HF_ONLY = ("append_eod", "append_bos", "prepend_space")  # Megatron's tokenisation flags

PREPROCESS_KEYS = [
    Key("json_keys", list(megatron_data.FIELDS), "--preprocess: the record keys written, each as "
        "<output_prefix>_<key>_document.{bin,idx} (Megatron's --json-keys; inputs and/or targets)", type=list,
        nargs="+", aliases=("json-keys", "json-key")),
    Key("append_eod", False, "--preprocess with --tokenizer-name-or-path: the tokenizer's EOS after every item "
        "(Megatron's --append-eod; its recipes give it for the targets)", nargs=0, aliases=("append-eod",)),
    Key("append_bos", False, "--preprocess with --tokenizer-name-or-path: BOS after every item, unless "
        "--append-eod (Megatron's --append-bos)", nargs=0, aliases=("append-bos",)),
    Key("prepend_space", False, "--preprocess with --tokenizer-name-or-path: tokenise ' ' + text (Megatron's "
        "--prepend-space)", nargs=0, aliases=("prepend-space",)),
    Key("dataset_impl", "mmap", "--preprocess: the indexed format; only mmap (Megatron's preprocess_data.py "
        "cannot write lazy / cached either: make_builder asserts dtype is None for them)",
        choices=("mmap", "lazy", "cached"), nargs=1, aliases=("dataset-impl",)),
    Key("workers", 1, "--preprocess: Megatron's worker processes; accepted, one process here (the order is "
        "kept either way)", range="[1, inf)", nargs=1),
]


def check_preprocess(cfg):
    """--preprocess's keys: its command's own, and nothing of it without it."""
    hf = cfg["megatron_tokenizer_name_or_path"]
    if not cfg["preprocess"]:
        given = [k.name for k in PREPROCESS_KEYS if cfg[k.name] != k.default]
        if cfg["input"] or cfg["output_prefix"] or given:
            names = ", ".join(f"--{n}" for n in (["input"] * bool(cfg["input"]) + ["output_prefix"] *
                                                 bool(cfg["output_prefix"]) + given))
            raise UserError(f"{names}: these flags are for --preprocess (a Megatron indexed dataset from a json / "
                            f"jsonl file)")
        return
    if not cfg["input"] or not cfg["output_prefix"]:
        raise UserError("--preprocess needs --input=FILE.jsonl and --output_prefix=PREFIX")
    if cfg["make_demo_data"]:
        raise UserError("--preprocess and --make_demo_data are two separate commands; give one")
    if hf and (cfg["tokenizer_model"] or cfg["model_dir"]):
        raise UserError("--preprocess tokenises with one tokenizer: --tokenizer-name-or-path (Megatron's Hugging Face "
                        "tokenisation) or --model_dir / --tokenizer_model (training's), not both")
    if not hf and not cfg["tokenizer_model"] and not cfg["model_dir"]:
        raise UserError("--preprocess tokenises with the base checkpoint's tokenizer: give --model_dir=DIR "
                        "(or --tokenizer_model=FILE.model, or --tokenizer-type PretrainedFromHF "
                        "--tokenizer-name-or-path DIR)")
    keys = cfg["json_keys"]
    bad = [k for k in keys if k not in megatron_data.FIELDS]
    if not keys or bad or len(set(keys)) != len(keys):
        raise UserError(f"--json-keys {' '.join(keys) or '(none)'}: a T0 prefix holds the keys inputs and/or targets, "
                        f"each once" + (f" ({bad[0]!r} is neither)" if bad else ""))
    if cfg["dataset_impl"] != "mmap":
        raise UserError(f"--dataset-impl {cfg['dataset_impl']}: only mmap is written (Megatron's preprocess_data.py "
                        f"asserts for lazy / cached too)")
    flags = [f"--{k.replace('_', '-')}" for k in HF_ONLY if cfg[k]]
    if flags and not hf:
        raise UserError(f"{', '.join(flags)}: Megatron's tokenisation flags go with --tokenizer-name-or-path; with "
                        f"the checkpoint's tokenizer add_bos / target_space / add_eos say what is added")


def _hf_items(tok, texts, cfg, field):
    """Megatron's Encoder.encode for one json key, without --split-sentences (IdentitySplitter):
    tokenize(" " * prepend_space + text), then EOD (else BOS) appended to the document's item."""
    extra = []
    if cfg["append_eod"] or cfg["append_bos"]:
        which = "eos" if cfg["append_eod"] else "bos"
        token = getattr(tok, f"{which}_token_id")
        if token is None:  # Megatron: AttributeError("Token doesn't exist")
            raise UserError(f"--append-{'eod' if which == 'eos' else 'bos'}: tokenizer "
                            f"{cfg['megatron_tokenizer_name_or_path']} has no {which} token")
        extra = [token]
    texts = [f" {t}" if cfg["prepend_space"] else t for t in texts]
    items = []
    # the batch call gives each text's tokenizer.encode(text) (special tokens as encode adds them)
    for i, ids in enumerate(tok(texts, add_special_tokens=True)["input_ids"]):
        if not ids:  # Megatron skips it in this key's file only, shifting one half against the other
            raise UserError(f"--input record {i + 1}: its {field} tokenise to no tokens (Megatron's preprocess_data.py "
                            f"would leave it out of the {field} file only, misaligning inputs and targets)")
        items.append(list(ids) + extra)
    return items


def _checkpoint_items(cfg, rows):
    """(items by key, vocabulary size, tokenizer path) with training's tokenisation."""
    if cfg["tokenizer_model"] and not cfg["model_dir"]:
        tok = Tokenizer(cfg["tokenizer_model"])
    else:
        tok = resolve_tokenizer(cfg, base_checkpoint(cfg))
    pairs = encode_records(rows, TokenizationOptions.from_config(cfg).encoder(tok))
    by_field = {"inputs": [a for a, _ in pairs], "targets": [b for _, b in pairs]}
    return {f: by_field[f] for f in cfg["json_keys"]}, tok.vocab_size, tok.model_path


def preprocess(cfg):
    """python finetune_t0.py --preprocess --input=data.jsonl --output_prefix=PFX [--json-keys K ...]:
    the records' keys as PFX_<key>_document.{bin,idx} (see the module docstring). Records with an
    empty (or blank) input or target are skipped in every pass, so the halves stay aligned. The
    keys' files are checked by the output guard first (existing ones only with --overwrite=True)
    and written atomically; nothing is written on any error."""
    prefix, path, hf = cfg["output_prefix"], cfg["input"], cfg["megatron_tokenizer_name_or_path"]
    inputs = [p for p in (path, hf, cfg["tokenizer_model"]) if p]
    guard_prefix(prefix, cfg["overwrite"], inputs, "--output_prefix", "--overwrite=True", fields=cfg["json_keys"])
    megatron_data.check_outputs(prefix)
    if not os.path.isfile(path):
        raise UserError(f"--input file {path} not found")
    # any kind of file source with text records (an unsupported file type is read_records' error)
    rows, skipped = usable(read_records(Source(name=os.path.basename(path), path=path)))
    if not rows:
        raise UserError(f"--input {path} has no record with non-empty 'inputs' and 'targets'")
    if hf:
        tok = load_hf_tokenizer(hf)
        items = {f: _hf_items(tok, [r[f] for r in rows], cfg, f) for f in cfg["json_keys"]}
        vocab, how = len(tok), (f"Hugging Face tokenizer {hf}, prepend_space={cfg['prepend_space']}, "
                                f"append_eod={cfg['append_eod']}, append_bos={cfg['append_bos']}")
    else:
        items, vocab, model = _checkpoint_items(cfg, rows)
        how = (f"tokenizer {model}, add_bos={cfg['add_bos']}, target_space={cfg['target_space']}, "
               f"add_eos={cfg['add_eos']}")
    megatron_data.write_fields(prefix, items, vocab)
    files = " and ".join(f"{prefix}_{f}_document.{{bin,idx}}" for f in items)
    print(f"wrote {len(rows)} examples ({skipped} with empty inputs or targets skipped) to {files} ({how})")
