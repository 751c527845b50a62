"""The flags every evaluation tool shares (evaluation/*.py; schema.py assembles them as EVAL, and
each tool derives its own schema from it with its own section): the model and its tokenizer, the
device and precision, the batch size, the seed, and the --out JSON with its --force.

--out is declared as an output (Key(output="json")): the output guard (tinylab/core/outputs.py)
checks it when the flags are parsed, before any work, and common.emit writes it atomically.
"""
from tinylab.core.config import Key, check_device

DTYPES = ("float32", "float64", "bfloat16", "float16")  # the precisions a model is loaded in (torch dtype names)

CHECKPOINT = Key("checkpoint", "out/ckpt.pt", "our checkpoint (ckpt.pt or its folder) or a Hugging Face Llama folder",
                 nonempty=True, input=True)
TOOL_DATA_CACHE = Key("data_cache_dir", "", "where tokenizers and datasets live (default: the checkpoint's config)")

EVAL_KEYS = [
    CHECKPOINT,
    Key("tokenizer_model", "", "sentencepiece .model (default: the one the checkpoint's config names)", input=True),
    TOOL_DATA_CACHE,
    Key("device", "", "cpu, cuda, ... ('' = cuda when available)", check=check_device),
    Key("dtype", "float32", "precision of the model", choices=DTYPES),
    Key("batch_size", 8, "sequences per forward pass", range="[1, inf)"),
    Key("seed", 1337, "seed of every random choice (data order, initial weights, dropout, sampling)", range="[0, inf)"),
    Key("out", "", "also write the metrics JSON to this file (an existing one only with --force)", output="json"),
    Key("force", False, "replace an existing --out (never a checkpoint, a run's files or another kind)"),
]
