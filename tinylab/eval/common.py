"""What the evaluation CLIs share: the model (our checkpoint or an HF Llama folder, imported in
memory), its tokenizer, local and hub text data, and the one machine-readable output line (their
common flags are keys.py's EVAL_KEYS).

Every CLI ends its stdout with one JSON line of its metrics (and writes the same object to
--out=FILE when asked), so scripts read the last line and people read the summary above it.
"""
import json
import os

import torch

from tinylab.core.checkpoint import load_checkpoint, model_from_checkpoint
from tinylab.core.errors import UserError, first_line
from tinylab.core.fileio import atomic_file, read_text, write_atomic  # noqa: F401  write_atomic: feature_judge
from tinylab.data.tokenizer import Tokenizer, tokenizer_for_checkpoint
from tinylab.interop import hub
from tinylab.interop.hf import imported_checkpoint, read_hf


def is_hf_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")) \
        and not os.path.isfile(os.path.join(path, "ckpt.pt"))


def load_model(path: str, device: str = "", dtype: str = "float32"):
    """(frozen model in eval mode, checkpoint dict). An HF Llama folder is imported in memory
    with export.py's importer, so its checkpoint has no training config."""
    if is_hf_dir(path):
        args, state = read_hf(path)
        ckpt = imported_checkpoint(args, state, f"hf:{path}")
    else:
        ckpt = load_checkpoint(path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model_from_checkpoint(ckpt).to(device=device, dtype=getattr(torch, dtype)).eval()
    model.requires_grad_(False)
    return model, ckpt


def load_for_args(a):
    """(model, checkpoint, tokenizer) for the flags of keys.EVAL_KEYS (every evaluation tool's; their
    --out files were checked by the output guard when the flags were parsed)."""
    model, ckpt = load_model(a.checkpoint, a.device, a.dtype)
    return model, ckpt, model_tokenizer(ckpt, model, a.checkpoint, a.tokenizer_model, a.data_cache_dir)


def model_tokenizer(ckpt: dict, model, checkpoint_path: str, tokenizer_model: str = "", data_cache_dir: str = ""):
    """The tokenizer the checkpoint was trained with (an HF folder's own tokenizer.model), or an
    explicit file; its size must match the model's vocabulary."""
    if not tokenizer_model and is_hf_dir(checkpoint_path):
        tokenizer_model = os.path.join(checkpoint_path, "tokenizer.model")
        if not os.path.isfile(tokenizer_model):
            raise UserError(f"{checkpoint_path} has no tokenizer.model; pass --tokenizer_model=PATH")
    tok = Tokenizer(tokenizer_model) if tokenizer_model else tokenizer_for_checkpoint(ckpt, None, data_cache_dir or None)
    if tok.vocab_size != model.params.vocab_size:
        raise UserError(f"tokenizer {tok.model_path} has {tok.vocab_size} pieces but the model's vocabulary "
                        f"is {model.params.vocab_size}")
    return tok


def cache_dir_of(ckpt: dict, data_cache_dir: str = "") -> str:
    return data_cache_dir or ckpt.get("config", {}).get("data_cache_dir") or "data"


def layout_vocab(ckpt: dict, tokenizer) -> int:
    """The vocab number of the dataset folders the model reads (tok{V}/; 0 = Llama 2 -> llama2/)."""
    return 0 if ckpt.get("config", {}).get("vocab_source") == "llama2" else tokenizer.vocab_size


def right_pad(seqs, value=0) -> torch.Tensor:
    """(len(seqs), longest) int64 rows, each sequence left-aligned, padded with `value`. Under
    causal attention a right-padded row scores its real positions exactly as it would alone."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def emit(metrics: dict, out: str = ""):
    """Print the metrics as the last stdout line; also write them to `out` (atomically; the output
    guard checked it before any work)."""
    line = json.dumps(metrics)
    if out:
        with atomic_file(out, parents=True) as f:
            f.write((line + "\n").encode())
    print(line, flush=True)


def read_rows(path: str, field: str = "text") -> list:
    """Text rows of a local file: .jsonl / .json (one JSON object per line, its `field`, or a
    JSON string), .parquet (the `field` column), anything else plain text, one row per line
    (line ends kept, as the raw WikiText rows have them)."""
    if not os.path.isfile(path):
        raise UserError(f"data file not found: {path}")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError("reading .parquet needs pyarrow (pip install pyarrow)") from None
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for a bad file
            raise UserError(f"{path} is not a readable parquet file ({first_line(e)})") from None
        if field not in table.column_names:
            raise UserError(f"{path} has no '{field}' column (columns: {', '.join(table.column_names)})")
        return [str(v) for v in table.column(field).to_pylist()]
    lines = read_text(path, "data file").splitlines(keepends=True)
    if ext not in (".jsonl", ".json"):
        return lines
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise UserError(f"{path}:{i} is not JSON ({e})") from None
        if isinstance(obj, dict):
            if not isinstance(obj.get(field), str):
                raise UserError(f"{path}:{i} has no string field '{field}'")
            obj = obj[field]
        if not isinstance(obj, str):
            raise UserError(f"{path}:{i}: expected an object with '{field}' or a string")
        rows.append(obj)
    return rows


def load_hf_rows(name: str, config, split: str, field: str = "text") -> list:
    """Rows of a Hugging Face dataset through `datasets` (needs the network or its local cache);
    an unreachable hub is one quick error line (hub.py), not half a minute of retries."""
    ds = hub.load_dataset(name, config, split, fix="offline? pass --data=PATH to a local file")
    if field not in ds.column_names:
        raise UserError(f"dataset {name} has no '{field}' column")
    return list(ds[field])
