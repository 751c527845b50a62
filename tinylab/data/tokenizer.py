"""A small sentencepiece wrapper, and where a vocabulary size's tokenizer file lives.

    --tokenizer_model=PATH          any V: that file
    <data_cache_dir>/tok{V}.model   V > 0: trained by `tinystories.py train_vocab` (the datasets of
                                    that cache were made with it, so it wins over the shipped one;
                                    a notice says so when the two differ)
    tokenizers/tok{V}.model         V > 0, no cache copy: the shipped file (tok8192, the study's)
    tokenizers/tokenizer.model      V = 0: the Llama 2 tokenizer, shipped with llama2.c's
                                    tokenizer.bin (tokenizers/README.md)
Every program that needs a tokenizer (train.py, tinystories.py pretokenize, sample.py, the
evaluation tools, finetune_t0.py) resolves it here, so none needs a copy in data_cache_dir.
"""
import hashlib
import os
import sys

import sentencepiece as spm

from tinylab import REPO
from tinylab.core.errors import UserError


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# the tokenizers that ship with the repository (tokenizers/README.md: sources and licences)
SHIPPED_DIR = os.path.join(REPO, "tokenizers")
_compared = set()  # cache files already compared with the shipped file (one notice per process)


def shipped_tokenizer_path(vocab_size: int):
    """tokenizers/tok{V}.model (V = 0: the Llama 2 tokenizers/tokenizer.model) if it ships, else None."""
    path = os.path.join(SHIPPED_DIR, "tokenizer.model" if vocab_size == 0 else f"tok{vocab_size}.model")
    return path if os.path.isfile(path) else None


def tokenizer_model_path(data_cache_dir: str, vocab_size: int, tokenizer_model: str = None) -> str:
    """The tokenizer file for `vocab_size` (module docstring: explicit file, data cache copy,
    shipped file). UserError (saying how to get one) when there is none."""
    if vocab_size < 0:
        raise UserError(f"--vocab_size must be >= 0, got {vocab_size}")
    if tokenizer_model:
        if not os.path.isfile(tokenizer_model):
            raise UserError(f"tokenizer model {tokenizer_model} not found")
        return tokenizer_model
    shipped = shipped_tokenizer_path(vocab_size)
    if vocab_size == 0:
        if shipped is None:
            raise UserError(f"--vocab_size=0 means the Llama 2 tokenizer, but {SHIPPED_DIR}/tokenizer.model is "
                            f"missing: pass --tokenizer_model=PATH/tokenizer.model (it ships with karpathy/llama2.c)")
        return shipped
    path = os.path.join(data_cache_dir, f"tok{vocab_size}.model")
    if os.path.isfile(path):
        if shipped is not None and path not in _compared:
            _compared.add(path)
            if file_sha256(path) != file_sha256(shipped):
                print(f"notice: using {path} (the data cache's own tok{vocab_size}, e.g. from train_vocab, which "
                      f"its datasets were made with), not the shipped {shipped}, which differs", file=sys.stderr)
        return path
    if shipped is not None:
        return shipped
    raise UserError(f"tokenizer {path} not found: run: python tinystories.py train_vocab "
                    f"--vocab_size={vocab_size} --data_cache_dir={data_cache_dir} "
                    f"({SHIPPED_DIR} has no tok{vocab_size}.model either)")


class Tokenizer:
    def __init__(self, model_path: str):
        if not os.path.isfile(model_path):
            raise UserError(f"tokenizer model {model_path} not found")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=model_path)
        except (OSError, RuntimeError) as e:
            raise UserError(f"{model_path} is not a sentencepiece model ({e})") from None
        self.model_path = model_path
        self.vocab_size = self.sp.vocab_size()
        self.bos_id = self.sp.bos_id()
        self.eos_id = self.sp.eos_id()
        self._sha256 = None

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = file_sha256(self.model_path)
        return self._sha256

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list:
        return self.sp.encode(text, add_bos=bos, add_eos=eos)

    def encode_batch(self, texts: list, bos: bool = True, eos: bool = False, num_threads: int = 1) -> list:
        """One C++ call for many texts. num_threads=1 by default: callers parallelise with
        processes, and extra threads per process would only oversubscribe the cores."""
        return self.sp.encode(list(texts), add_bos=bos, add_eos=eos, num_threads=num_threads)

    def decode(self, ids) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return self.sp.decode([int(i) for i in ids])


def load_tokenizer(data_cache_dir: str, vocab_size: int, tokenizer_model: str = None) -> Tokenizer:
    """Resolve and load the tokenizer for `vocab_size`, checking that its size matches (V > 0)."""
    tok = Tokenizer(tokenizer_model_path(data_cache_dir, vocab_size, tokenizer_model))
    if vocab_size > 0 and tok.vocab_size != vocab_size:
        raise UserError(f"tokenizer {tok.model_path} has {tok.vocab_size} pieces but --vocab_size={vocab_size}")
    return tok


def tokenizer_for_checkpoint(ckpt, tokenizer_model=None, data_cache_dir=None):
    """The tokenizer a checkpoint was trained with (or an explicit model file)."""
    cfg = ckpt.get("config", {})
    if tokenizer_model:
        return Tokenizer(tokenizer_model)
    vocab = 0 if cfg.get("vocab_source") == "llama2" else cfg.get("vocab_size", ckpt["model_args"]["vocab_size"])
    cache = data_cache_dir or cfg.get("data_cache_dir", "data")
    return Tokenizer(tokenizer_model_path(cache, vocab, cfg.get("tokenizer_model") or None))
