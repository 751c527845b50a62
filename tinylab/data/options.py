"""The config keys of language-modelling data (train.py's "data" section), declared next to the
code that reads them, and their typed values (`LMDataOptions.from_config`).

schema.py assembles the programs' key sets from these lists; other programs reuse single keys
with their own defaults (BATCH_SIZE.replace(default=16, ...)).
"""
from dataclasses import dataclass
from typing import Optional

from tinylab.core.config import Key
from tinylab.data.records import dataset_dir

BATCH_SIZE = Key("batch_size", 128, "micro-batch size (sequences per forward pass) in each process", range="[1, inf)",
                 nargs=1)
MAX_SEQ_LEN = Key("max_seq_len", 256, "context length in tokens", range="[1, inf)")
TOKENIZER_MODEL = Key("tokenizer_model", "", "sentencepiece .model to use instead of the default one", input=True)
DATA_CACHE_DIR = Key("data_cache_dir", "data", "where raw shards, tokenizers and pretokenized datasets live",
                     nonempty=True)

# which dataset, read how (the batch-size and sequence-length warmups that follow them in --help are
# the training loop's: training/warmup.py)
LM_DATA_KEYS = [
    BATCH_SIZE, MAX_SEQ_LEN,
    Key("vocab_source", "custom", "custom: <data_cache_dir>/tok{vocab_size}.model, else tokenizers/tok{vocab_size}"
        ".model | llama2: the Llama 2 tokenizers/tokenizer.model",
        choices=("custom", "llama2")),
    Key("vocab_size", 8192, "tokenizer size (vocab_source=custom); ids are stored as uint16", range="[1, 65536]"),
    TOKENIZER_MODEL, DATA_CACHE_DIR,
    Key("dataset_name", "F_none_MM_none_AT_none_RF_none_IS_none", "pretokenized dataset to train on "
        "(<data_cache_dir>/tok{V}/<dataset_name>)", nonempty=True),
    Key("eval_dataset_names", [], "extra datasets whose test shard is evaluated as loss/<name>"),
    Key("eval_batch_size", 0, "micro-batch size of the loss evaluations; 0 = batch_size", range="[0, inf)"),
]
# which train shards (pretokenized.shard_paths)
LM_SPLIT_KEYS = [
    Key("split_shards_pretrain", False, "80/20 split of the train shards into pretrain / fine-tune"),
    Key("pretraining", True, "with split_shards_pretrain: True = the first 80%, False = the last 20%"),
]


@dataclass
class LMDataOptions:
    batch_size: int
    max_seq_len: int
    vocab_source: str  # custom | llama2
    vocab_size: int
    tokenizer_model: Optional[str]  # None: the default file for the vocabulary (tokenizer.py)
    data_cache_dir: str
    dataset_name: str
    eval_dataset_names: list
    eval_batch_size: int  # resolved: batch_size when the key is 0
    split_shards_pretrain: bool
    pretraining: bool

    @classmethod
    def from_config(cls, cfg) -> "LMDataOptions":
        return cls(cfg["batch_size"], cfg["max_seq_len"], cfg["vocab_source"], cfg["vocab_size"],
                   cfg["tokenizer_model"] or None, cfg["data_cache_dir"], cfg["dataset_name"],
                   list(cfg["eval_dataset_names"]), cfg["eval_batch_size"] or cfg["batch_size"],
                   cfg["split_shards_pretrain"], cfg["pretraining"])

    @property
    def layout_vocab(self) -> int:
        """The vocabulary number of the data layout: 0 = the Llama 2 tokenizer's (llama2/)."""
        return 0 if self.vocab_source == "llama2" else self.vocab_size

    def dataset_dir(self, name: str = None) -> str:
        """The folder of dataset `name` (default: the training dataset)."""
        return dataset_dir(self.data_cache_dir, self.layout_vocab, name or self.dataset_name)
