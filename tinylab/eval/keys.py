"""The flags every evaluation tool shares (evaluation/*.py; schema.py assembles them as EVAL, and
each tool derives its own schema from it with its own section): the model and its tokenizer, the
device and precision, the batch size, the seed, and the --out JSON with its --force.

--out is declared as an output (Key(output="json")): the output guard (tinylab/core/outputs.py)
checks it when the flags are parsed, before any work, and common.emit writes it atomically.
"""
from tinylab.core.config import Key
from tinylab.core.run_keys import DEVICE, DTYPES, SEED
from tinylab.data.options import BATCH_SIZE, DATA_CACHE_DIR, TOKENIZER_MODEL

# the same Key objects as train.py's where a setting is the same setting, with the tools' defaults
CHECKPOINT = Key("checkpoint", "out/ckpt.pt", "our checkpoint (ckpt.pt or its folder) or a Hugging Face Llama folder",
                 nonempty=True, input=True)
TOOL_DATA_CACHE = DATA_CACHE_DIR.replace(default="", nonempty=False,
                                         help="where tokenizers and datasets live (default: the checkpoint's config)")

EVAL_KEYS = [
    CHECKPOINT,
    TOKENIZER_MODEL.replace(help="sentencepiece .model (default: the one the checkpoint's config names)"),
    TOOL_DATA_CACHE,
    DEVICE.replace(help="cpu, cuda, ... ('' = cuda when available)"),
    Key("dtype", "float32", "precision of the model", choices=DTYPES),
    BATCH_SIZE.replace(default=8, help="sequences per forward pass"),
    SEED,
    Key("out", "", "also write the metrics JSON to this file (an existing one only with --force)", output="json"),
    Key("force", False, "replace an existing --out (never a checkpoint, a run's files or another kind)"),
]
