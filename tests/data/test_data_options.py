"""The language-modelling data keys: declared in tinylab/data/options.py, assembled by schema.py
unchanged, read as typed options, and the loader built from them."""
import os

import numpy as np

from tinylab.data.options import LM_DATA_KEYS, LM_SPLIT_KEYS, LMDataOptions
from tinylab.data.pretokenized import BatchLoader
from tinylab.schema import LM_DATA, TRAIN


def test_train_reads_the_data_keys_in_their_order():
    names = [k.name for k in LM_DATA]
    assert names[:len(LM_DATA_KEYS)] == ["batch_size", "max_seq_len", "vocab_source", "vocab_size", "tokenizer_model",
                                         "data_cache_dir", "dataset_name", "eval_dataset_names", "eval_batch_size"]
    assert names[-2:] == ["split_shards_pretrain", "pretraining"] == [k.name for k in LM_SPLIT_KEYS]
    for key in LM_DATA_KEYS + LM_SPLIT_KEYS:
        assert TRAIN.keys[key.name] is key
    d = TRAIN.defaults()
    assert (d["batch_size"], d["max_seq_len"], d["vocab_size"], d["dataset_name"]) == \
        (128, 256, 8192, "F_none_MM_none_AT_none_RF_none_IS_none")


def test_typed_options():
    cfg = TRAIN.parse(["--vocab_size=512", "--eval_dataset_names=a,b", "--data_cache_dir=cache"])
    data = LMDataOptions.from_config(cfg)
    assert (data.vocab_size, data.layout_vocab, data.eval_dataset_names) == (512, 512, ["a", "b"])
    assert data.tokenizer_model is None and data.eval_batch_size == data.batch_size == 128
    assert data.dataset_dir() == os.path.join("cache", "tok512", "F_none_MM_none_AT_none_RF_none_IS_none")
    assert data.dataset_dir("a") == os.path.join("cache", "tok512", "a")
    llama = LMDataOptions.from_config(TRAIN.parse(["--vocab_source=llama2", "--eval_batch_size=4",
                                                   "--tokenizer_model=t.model"]))
    assert llama.layout_vocab == 0 and llama.dataset_dir("x") == os.path.join("data", "llama2", "x")
    assert (llama.eval_batch_size, llama.tokenizer_model) == (4, "t.model")


def test_loader_from_options_is_the_loader_of_its_values(tiny_corpus):
    cfg = TRAIN.parse([f"--data_cache_dir={tiny_corpus.cache_dir}", "--dataset_name=pretrain-all", "--batch_size=3",
                       "--max_seq_len=16", "--split_shards_pretrain=True", "--pretraining=False"])
    data = LMDataOptions.from_config(cfg)
    ours = BatchLoader.from_options(data, "train", 5)
    direct = BatchLoader(os.path.join(tiny_corpus.cache_dir, "tok8192", "pretrain-all"), "train", 3, 16, 5,
                         split_shards_pretrain=True, pretraining=False)
    assert ours.paths == direct.paths and ours.paths[0].endswith("data02.bin")  # the fine-tuning 20%
    for _ in range(3):
        (x, y), (x2, y2) = next(ours), next(direct)
        assert x.shape == (3, 16) and np.array_equal(x, x2) and np.array_equal(y, y2)
