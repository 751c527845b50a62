"""compat=original for train.py's evaluation (the study's train.py, RobertKirk/tinystories-wrappers):
eval_batch_sizes=batch_size (the original never read eval_batch_size / generation_eval_batch_size)
and generation_prompt_split=train (an eval dataset's generation prompts from its train shards),
against the original's batch shapes and prompt selection re-implemented here."""
import glob
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tinylab.data.tokenizer import Tokenizer
from tinylab.eval.lm_eval import GenerationOptions, LMEvaluator
from tinylab.schema import TRAIN

VOCAB = 1024
L = 256  # long enough for every window to hold its whole header


class Recorder:
    """A model that records the batch shapes the evaluator hands it (loss forward, generate)."""

    def __init__(self, bos):
        self.bos, self.calls = bos, []
        self.last_loss = torch.tensor(1.0)

    def __call__(self, x, y, return_logits=False):
        self.calls.append(("loss", tuple(x.shape)))

    def generate(self, idx, max_new_tokens, **kw):
        self.calls.append(("generate", tuple(idx.shape)))
        return torch.cat([idx, torch.full((idx.shape[0], max_new_tokens), self.bos)], dim=1)


def evaluator(corpus, **over):
    cfg = {**TRAIN.defaults(), "data_cache_dir": corpus.cache_dir, "vocab_size": VOCAB, "max_seq_len": L,
           "dataset_name": TRAIN.defaults()["dataset_name"], "eval_dataset_names": ["filter-Twist"], **over}
    tok = Tokenizer(os.path.join(corpus.cache_dir, f"tok{VOCAB}.model"))
    run = SimpleNamespace(device="cpu", master=True)
    return LMEvaluator(cfg, run, tok, GenerationOptions.from_config(cfg)), tok


@pytest.mark.parametrize("sizes, loss_rows, gen_rows", [("own", 5, 2), ("batch_size", 3, 3)])
def test_eval_batch_sizes(lab_corpus, sizes, loss_rows, gen_rows):
    ev, tok = evaluator(lab_corpus, batch_size=3, eval_batch_size=5, generation_batch_size=2, eval_iters=2,
                        generation_eval_iters=2, max_new_tokens=4, eval_batch_sizes=sizes)
    model = Recorder(tok.bos_id)
    ev(model, 0, generations=True)
    losses = [shape for kind, shape in model.calls if kind == "loss"]
    gens = [shape for kind, shape in model.calls if kind == "generate"]
    # loss/train, loss/test, loss/filter-Twist: eval_iters batches each
    assert losses == [(loss_rows, L)] * (3 * 2)
    # 'id' and filter-Twist: generation_eval_iters batches of gen_rows prompts each (the original:
    # generation_eval_iters x batch_size prompts, train.py:515-516)
    assert [rows for rows, _ in gens] == [gen_rows] * (2 * 2)


def original_prompts(dataset_dir, split, tok, split_shards_pretrain=False, pretraining=True):
    """The original's generation prompts (headers) of one dataset and split, as a set: the shards
    of PretokDataset (tinystories.py:411-422), its split_on_bos windows (tinystories.py:462-482:
    every BOS but the last, windows of L + 1 tokens, shorter ones skipped), the header cut on the
    decoded text (train.py:494-495). A window without a whole header is left out (the original
    would raise an IndexError at train.py:499)."""
    shards = sorted(glob.glob(os.path.join(dataset_dir, "*.bin")))
    if split == "test":
        shards = shards[:1]
    else:
        shards = shards[1:]
        if split_shards_pretrain:
            cut = int(len(shards) * 0.8)
            shards = shards[:cut] if pretraining else shards[cut:]
    out = set()
    for shard in shards:
        m = np.memmap(shard, dtype=np.uint16, mode="r")
        for start in np.where(m == 1)[0][:-1]:
            x = torch.from_numpy(m[start:start + L + 1].astype(np.int64))[:-1]
            if len(x) < L:
                continue
            text = tok.decode(x.tolist())
            if "\nStory: " in text:
                out.add(text.split("\nStory: ")[0])
    return out


def our_prompts(ev, tok, name):
    data_dir, split = ev.gen_sets[name]
    prompts, _ = ev.prompts(data_dir, split)
    return {tok.decode(p).split("\nStory:")[0] for p in prompts}


@pytest.mark.slow
@pytest.mark.parametrize("pretrain_split", [False, True])
def test_generation_prompts_come_from_the_originals_split(lab_corpus, pretrain_split):
    # ask for at least as many prompts as there are windows: the loader's first epoch visits each once
    over = dict(generation_batch_size=100, generation_eval_iters=7, split_shards_pretrain=pretrain_split,
                pretraining=not pretrain_split)
    fixed, tok = evaluator(lab_corpus, **over)
    original, _ = evaluator(lab_corpus, generation_prompt_split="train", **over)
    train_dir = lab_corpus.dataset(TRAIN.defaults()["dataset_name"], VOCAB)
    eval_dir = lab_corpus.dataset("filter-Twist", VOCAB)
    # the training dataset's prompts: its shard 0 (train.py:538 split="test"), in both modes
    for ev in (fixed, original):
        assert our_prompts(ev, tok, "id") == original_prompts(train_dir, "test", tok)
    # an eval dataset's: the original passes its name as the split (train.py:542), i.e. train shards
    want = original_prompts(eval_dir, "train", tok, pretrain_split, not pretrain_split)
    assert len(want) > 100 and our_prompts(original, tok, "filter-Twist") == want
    assert our_prompts(fixed, tok, "filter-Twist") == original_prompts(eval_dir, "test", tok) != want
