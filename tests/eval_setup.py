"""Shared by the evaluation tests: a small synthesized corpus with the released 8192-piece
tokenizer, and tiny random checkpoints that name it."""
import os
import shutil
from types import SimpleNamespace

import torch
from conftest import TOK8192, WIKITEXT  # noqa: F401  (re-exported for the evaluation tests)

from model import ModelArgs, Transformer
from tinylab import checkpoint as ckpt_lib


def make_corpus(root, num_shards=3, stories_per_shard=300, seed=0):
    """root: raw shards, tok8192.model, and the datasets pretrain-all and filter-adv-Twist."""
    from tinylab import tinystories_data as tinystories
    from tinylab.dataset_spec import parse_spec
    tinystories.synthesize(root, num_shards=num_shards, stories_per_shard=stories_per_shard, seed=seed)
    shutil.copy(TOK8192, os.path.join(root, "tok8192.model"))
    tinystories.pretokenize(root, 8192, parse_spec(), dataset_name="pretrain-all", seed=0, workers=1)
    tinystories.pretokenize(root, 8192, parse_spec(filtering="features!=Twist", adversarial_training="features=Twist:1.0"),
                            dataset_name="filter-adv-Twist", seed=0, workers=1)
    return SimpleNamespace(cache_dir=root, raw_dir=os.path.join(root, "TinyStories_all_data"),
                           dataset_dir=lambda name: os.path.join(root, "tok8192", name))


def tiny_model(max_seq_len=64, seed=0, dtype=torch.float32, n_layers=2):
    torch.manual_seed(seed)
    model = Transformer(ModelArgs(dim=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, vocab_size=8192,
                                  multiple_of=16, max_seq_len=max_seq_len))
    return model.to(dtype).eval()


def save_tiny_checkpoint(path, cache_dir, **model_kwargs):
    """A random tiny model whose config names cache_dir (and so cache_dir/tok8192.model)."""
    model = tiny_model(**model_kwargs)
    ckpt_lib.save_checkpoint({"model": model.state_dict(), "model_args": ckpt_lib.model_args_dict(model),
                              "iter_num": 0, "config": {"vocab_size": 8192, "vocab_source": "custom",
                                                        "data_cache_dir": cache_dir}}, path)
    return path
