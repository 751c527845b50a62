"""Language modelling on pretokenized TinyStories datasets (train.py): which data layout and
tokenizer a config means, and the evaluation the loop runs every eval_interval: mean losses on
fixed batches of named datasets (masked as training is, with document_mask), and generations
from the instruction headers of test examples (logged as tables, optionally judged for a
feature).

The generation evaluation's keys (GENERATION_KEYS, train.py's "generation evaluation" section) are
declared here, read once into GenerationOptions; the loss sets come from the data keys.
"""
import math
import os
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.core.progress import progress
from tinylab.data.documents import DocumentOptions
from tinylab.data.pretokenized import BatchLoader, check_dataset
from tinylab.data.records import FEATURES, dataset_dir
from tinylab.data.template import extract_story, header_end
from tinylab.data.tokenizer import Tokenizer, tokenizer_model_path
from tinylab.eval.common import layout_vocab
from tinylab.eval.feature_judge import FeatureScore, make_judge

# ---------------------------------------------------------------------- keys and options

MAX_NEW_TOKENS = Key("max_new_tokens", 350, "tokens generated per prompt; 0 = no generations", range="[0, inf)")
TEMPERATURE = Key("temperature", 1.0, "sampling temperature; 0 = greedy", range="[0, inf)")
TOP_K = Key("top_k", 0, "sample among the k most likely tokens; 0 = all", range="[0, inf)")
# the study's train.py declares eval_batch_size / generation_eval_batch_size but reads neither:
# every evaluation iterator is built with the training micro-batch (its train.py:159-199)
EVAL_BATCH_SIZES = Key("eval_batch_sizes", "own", "own: loss evaluations read eval_batch_size rows per batch, "
                       "generations generation_batch_size prompts | batch_size: both use batch_size (the study's "
                       "train.py, which never read its eval batch sizes)", choices=("own", "batch_size"))
declare_difference(EVAL_BATCH_SIZES, original="batch_size", family="study",
                   behaviour="eval_batch_size and generation_eval_batch_size are never read: loss evaluations and "
                   "generations use batch_size (generation_eval_iters x batch_size prompts)",
                   source="RobertKirk/tinystories-wrappers train.py:160")
# where the eval datasets' generation prompts come from (the training dataset's: its test shard)
GENERATION_PROMPT_SPLIT = Key("generation_prompt_split", "test", "test: every dataset's generation prompts come "
                              "from its test shard | train: eval_dataset_names' prompts from their train shards "
                              "(the study's train.py; the training dataset's stay on its test shard)",
                              choices=("test", "train"))
declare_difference(GENERATION_PROMPT_SPLIT, original="train", family="study",
                   behaviour="do_generations passes an eval dataset's name as the split, so its prompts come from its "
                   "train shards (with split_shards_pretrain and pretraining=False, their last 20%)",
                   source="RobertKirk/tinystories-wrappers train.py:542")
GENERATION_KEYS = [
    TEMPERATURE, TOP_K, MAX_NEW_TOKENS,
    Key("generation_eval_iters", 1, "prompts per dataset = generation_eval_iters * generation_batch_size; "
        "0 = no generations", range="[0, inf)"),
    Key("generation_batch_size", 16, "prompts generated together", range="[1, inf)",
        aliases=("generation_eval_batch_size",)),
    Key("generation_eval_interval_multiplier", 1, "generations every N evaluations", range="[1, inf)"),
    Key("generation_datasets", [], "which of 'id' and eval_dataset_names get generations; [] = all of them"),
    Key("feature_eval", "", "a feature to judge in the generations, logged as gen_feature_score "
        "(evaluation/eval_features.py)", choices=("",) + FEATURES),
    GENERATION_PROMPT_SPLIT,
]
_DEFAULT = {k.name: k.default for k in GENERATION_KEYS}


@dataclass(frozen=True)
class GenerationOptions:
    """GENERATION_KEYS' values: what the generation evaluation samples, how, and how often."""
    temperature: float = _DEFAULT["temperature"]
    top_k: int = _DEFAULT["top_k"]  # 0 = all tokens
    max_new_tokens: int = _DEFAULT["max_new_tokens"]
    eval_iters: int = _DEFAULT["generation_eval_iters"]  # prompts per dataset = eval_iters * batch_size
    batch_size: int = _DEFAULT["generation_batch_size"]
    interval_multiplier: int = _DEFAULT["generation_eval_interval_multiplier"]  # generations every N evaluations
    datasets: tuple = ()  # 'id' and eval dataset names; () = all of them
    feature_eval: str = _DEFAULT["feature_eval"]  # a feature judged in the generations; "" = none
    prompt_split: str = _DEFAULT["generation_prompt_split"]  # the eval datasets' prompts: test | train shards

    @classmethod
    def from_config(cls, cfg) -> "GenerationOptions":
        batch = cfg["batch_size"] if cfg["eval_batch_sizes"] == "batch_size" else cfg["generation_batch_size"]
        return cls(cfg["temperature"], cfg["top_k"], cfg["max_new_tokens"], cfg["generation_eval_iters"],
                   batch, cfg["generation_eval_interval_multiplier"],
                   tuple(cfg["generation_datasets"]), cfg["feature_eval"], cfg["generation_prompt_split"])

    @property
    def enabled(self) -> bool:
        return self.max_new_tokens > 0 and self.eval_iters > 0


def loss_batch_size(cfg) -> int:
    """Rows per batch of the loss evaluations (eval_batch_sizes says whether eval_batch_size counts)."""
    if cfg["eval_batch_sizes"] == "batch_size":
        return cfg["batch_size"]
    return cfg["eval_batch_size"] or cfg["batch_size"]


def check_generation_datasets(cfg):
    unknown = sorted(set(cfg["generation_datasets"]) - {"id", *cfg["eval_dataset_names"]})
    if unknown:
        raise UserError(f"generation_datasets names {unknown}, which are neither 'id' nor in eval_dataset_names")


# ---------------------------------------------------------------------- the evaluation

def dataset_vocab(cfg):
    """The vocab number of the data layout (0 = Llama 2) and the model's vocabulary size."""
    if cfg["vocab_source"] == "llama2":
        return 0, 32000
    return cfg["vocab_size"], cfg["vocab_size"]


def lm_tokenizer(cfg) -> Tokenizer:
    """The tokenizer of the config's data layout (or its explicit tokenizer_model)."""
    layout_vocab, _ = dataset_vocab(cfg)
    return Tokenizer(tokenizer_model_path(cfg["data_cache_dir"], layout_vocab, cfg["tokenizer_model"] or None))


class LMEvaluator:
    """Mean LM loss on fixed batches of the train split, the test split and each eval dataset's
    test split; and, when asked, generations from BOS-aligned test prompts of every dataset (of the
    eval datasets' train shards with generation_prompt_split=train)."""

    def __init__(self, cfg, run, tokenizer, generation: GenerationOptions):
        """`cfg`: the data keys (datasets, layout, batch sizes, eval_iters, seed); `generation`: the
        generation evaluation's options."""
        self.cfg, self.run, self.tokenizer, self.generation = cfg, run, tokenizer, generation
        self.documents = DocumentOptions.from_config(cfg)  # the loss evaluations mask as training does
        self.logger = None
        vocab, _ = dataset_vocab(cfg)
        main_dir = dataset_dir(cfg["data_cache_dir"], vocab, cfg["dataset_name"])
        self.loss_sets = {"train": (main_dir, "train"), "test": (main_dir, "test")}
        self.gen_sets = {"id": (main_dir, "test")}  # name -> (folder, split of its prompts)
        for name in cfg["eval_dataset_names"]:
            self.loss_sets[name] = (dataset_dir(cfg["data_cache_dir"], vocab, name), "test")
            self.gen_sets[name] = (dataset_dir(cfg["data_cache_dir"], vocab, name), generation.prompt_split)
        if generation.datasets:  # (checked against the datasets by check_generation_datasets)
            self.gen_sets = {k: v for k, v in self.gen_sets.items() if k in generation.datasets}
        self.feature_score = None
        if generation.feature_eval and run.master:
            self.feature_score = FeatureScore(make_judge(generation.feature_eval, cfg["data_cache_dir"],
                                                         flag="feature_eval"))
            print(f"feature_eval={generation.feature_eval}: judge {self.feature_score.judge.description}")

    def loader(self, data_dir, split, batch_size, split_on_bos=False):
        cfg = self.cfg
        return BatchLoader(data_dir, split, batch_size, cfg["max_seq_len"], seed=cfg["seed"],
                           split_on_bos=split_on_bos, bos_id=self.tokenizer.bos_id, device=self.run.device,
                           split_shards_pretrain=cfg["split_shards_pretrain"] and split != "test",
                           pretraining=cfg["pretraining"])

    def __call__(self, model, iter_num, generations):
        metrics = self.loss_metrics(model)
        if generations and self.generation.enabled:
            for name, (data_dir, split) in self.gen_sets.items():
                rows = self.generate(model, data_dir, iter_num, split)
                if self.feature_score is not None:
                    self.feature_score.add(name, rows)
                if self.logger is not None:
                    self.logger.log_table(f"generations/{name}", ["prefix", "clean_prefix", "generation", "target", "iter_num"], rows, iter_num)
            if self.feature_score is not None:  # among prompts asking for the feature: pooled and per dataset
                metrics.update(self.feature_score.metrics())
        return metrics

    def loss_metrics(self, model):
        """loss/<name> of every loss set (probes.HeadsEvaluator has its heads' metrics instead)."""
        metrics = {}
        for name, (data_dir, split) in self.loss_sets.items():
            # a fresh loader re-seeds identically: the same batches at every evaluation
            batches = self.loader(data_dir, split, loss_batch_size(self.cfg))
            losses = torch.zeros(self.cfg["eval_iters"])
            for k in range(self.cfg["eval_iters"]):
                x, y = next(batches)
                model(x, y, return_logits=False, **self.documents.inputs(x, self.tokenizer.bos_id))
                losses[k] = model.last_loss.float()
            metrics[f"loss/{name}"] = losses.mean().item()
        return metrics

    def prompts(self, data_dir, split="test"):
        """(prompts, targets): the instruction headers (token ids, BOS first) and the stories of the
        first eval_iters * batch_size BOS-aligned windows of `split` that hold a whole header."""
        opts, tok = self.generation, self.tokenizer
        n_prompts = opts.eval_iters * opts.batch_size
        windows = self.loader(data_dir, split, opts.batch_size, split_on_bos=True)
        prompts, targets = [], []
        for _ in range(10 * n_prompts):  # bounded: a tiny max_seq_len may never hold a header
            if len(prompts) >= n_prompts:
                break
            x, _ = next(windows)
            for row in x.tolist():
                try:
                    h = header_end(row, tok)
                except ValueError:  # the window is too short to hold the whole header
                    continue
                prompts.append(row[:h])
                targets.append(extract_story(row[h:], tok))
        if not prompts:
            print(f"warning: no {split} window of {data_dir} holds a whole header within max_seq_len; no generations")
        return prompts[:n_prompts], targets[:n_prompts]

    def generate(self, model, data_dir, iter_num, split="test"):
        """Sample stories for the instruction headers of BOS-aligned examples of `split`."""
        opts, tok = self.generation, self.tokenizer
        prompts, targets = self.prompts(data_dir, split)
        rows = []
        gen = torch.Generator(device=self.run.device).manual_seed(self.cfg["seed"] + iter_num)
        bs = opts.batch_size
        for start in progress(range(0, len(prompts), bs), desc=f"generating ({os.path.basename(data_dir)})",
                              unit="batch", leave=False):
            chunk = prompts[start:start + bs]
            longest = max(len(p) for p in chunk)
            idx = torch.zeros(len(chunk), longest, dtype=torch.long)
            mask = torch.zeros(len(chunk), longest, dtype=torch.bool)
            for i, p in enumerate(chunk):  # left padding: every prompt ends where generation starts
                idx[i, longest - len(p):] = torch.tensor(p)
                mask[i, longest - len(p):] = True
            # a row stops at BOS, which starts the next example: extract_story cuts there anyway.
            # Past max_seq_len the window restarts from the last half (model.generate)
            out = model.generate(idx.to(self.run.device), opts.max_new_tokens, temperature=opts.temperature,
                                 top_k=opts.top_k or None, prompt_mask=mask.to(self.run.device), generator=gen,
                                 stop_token=tok.bos_id)
            for i, p in enumerate(chunk):
                prefix = tok.decode(p)
                generation = extract_story(out[i, longest:].tolist(), tok)
                rows.append([prefix, prefix.strip(), generation, targets[start + i], iter_num])
        return rows


def generate_rows(model, tokenizer, ckpt, data_cache_dir, dataset, num_samples, batch_size, max_new_tokens,
                  temperature, top_k, seed):
    """Generation rows for the first num_samples BOS-aligned test prompts of `dataset`, made by
    train.py's own generation evaluation (same prompt choice, sampling and story extraction)."""
    vocab = layout_vocab(ckpt, tokenizer)
    check_dataset(data_cache_dir, vocab, dataset, tokenizer.model_path)
    # the data keys the evaluator reads (train.py's defaults where the model does not say)
    cfg = dict(data_cache_dir=data_cache_dir, vocab_source="llama2" if vocab == 0 else "custom", vocab_size=vocab,
               dataset_name=dataset, eval_dataset_names=[], max_seq_len=model.params.max_seq_len, seed=seed,
               split_shards_pretrain=False, pretraining=True, document_mask=False, document_positions=False)
    generation = GenerationOptions(temperature, top_k, max_new_tokens, math.ceil(num_samples / batch_size), batch_size)
    run = SimpleNamespace(device=str(next(model.parameters()).device), master=True)
    rows = LMEvaluator(cfg, run, tokenizer, generation).generate(model, dataset_dir(data_cache_dir, vocab, dataset), 0)
    return rows[:num_samples]
