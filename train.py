"""Pretrain or fine-tune a Llama-style model on a pretokenized TinyStories dataset.

    python train.py configs/base8M.py --learning_rate=1e-4          # one process
    torchrun --nproc_per_node=4 train.py configs/base91M.py          # DDP
    python train.py --help                                           # every config key

Config keys and defaults follow the fine-tuning study's train.py (itself llama2.c's), see
../shared/spec/tinystories-data.md; the loop itself lives in trainer.py (shared with
finetune_t0.py). This file adds what is specific to language modelling on TinyStories datasets:
the data, the evaluation losses on named datasets, and the generation evaluation.
"""
import os

import torch

from adafactor import ADAFACTOR_CONFIG_DEFAULTS, apply_optimizer_preset
from configurator import parse_config
from optim import OPTIMIZER_DEFAULTS
from errors import UserError, cli_main
from metrics import WANDB_CONFIG_DEFAULTS
from pretok_data import BatchLoader, check_dataset, dataset_dir
from trainer import (Run, Trainer, check_init_from, fit_and_close, init_model, seed_everything, training_state,
                     write_run_config)

DEFAULTS = dict(
    # I/O
    out_dir="out",
    model_dir="",  # resume_model: fine-tune from model_dir/ckpt.pt
    init_from="scratch",  # scratch | resume_train (continue out_dir) | resume_model
    eval_interval=2000,
    checkpoint_interval=0,  # 0: checkpoint at every eval_interval
    log_interval=1,
    eval_iters=100,
    eval_batch_size=0,  # micro-batch size of the loss evaluations; 0 = batch_size
    eval_only=False,
    always_save_checkpoint=True,  # False: a periodic checkpoint only when loss/test improved (llama2.c)
    save_best_model=False,  # also keep out_dir/ckpt_best.pt, the best loss/test so far
    seed=1337,
    **WANDB_CONFIG_DEFAULTS,  # wandb_log, wandb_project, wandb_run_name, wandb_entity, wandb_tags, wandb_mode
    # data
    batch_size=128,  # micro-batch size
    max_seq_len=256,
    vocab_source="custom",  # custom: <data_cache_dir>/tok{vocab_size}.model | llama2: the Llama 2 tokenizer
    vocab_size=8192,
    tokenizer_model="",  # path of the Llama 2 tokenizer.model when vocab_source=llama2
    data_cache_dir="data",
    dataset_name="F_none_MM_none_AT_none_RF_none_IS_none",
    eval_dataset_names=[],  # extra datasets whose test shard is evaluated as loss/<name>
    split_shards_pretrain=False,  # 80/20 split of the train shards into pretrain / fine-tune
    pretraining=True,  # with split_shards_pretrain: True = first 80%, False = last 20%
    # model
    dim=288,
    n_layers=6,
    n_heads=6,
    n_kv_heads=6,
    multiple_of=32,
    hidden_dim=0,  # 0: llama2.c's rule from dim and multiple_of
    dropout=0.0,
    tie_embeddings=True,
    # optimizer and schedule
    gradient_accumulation_steps=4,  # global: split across DDP processes
    learning_rate=5e-4,
    lr_scheduling=True,  # False: constant learning_rate (the *_no_lrs fine-tuning configs)
    max_iters=100000,
    weight_decay=1e-1,
    warmup_iters=1000,
    **OPTIMIZER_DEFAULTS,  # optimizer (adamw | adafactor), betas, eps, clipping, min_lr (optim.py)
    **ADAFACTOR_CONFIG_DEFAULTS,  # optimizer=adafactor settings and presets (t0, hf_t5, bloomz_adam)
    # staged training: in-run growth (grow.py; docs/growth.md)
    grow_schedule="",  # e.g. "2000:weights,6000:layers": double width / depth after those iterations
    grow_mode="target",  # target: schedule back to S_pre/c + LR re-warmup | exact: reproduce the small model
    grow_symmetry_breaking="",  # random | split | blockdiag | off; "" = random (target), off (exact)
    grow_c_width=1.776,  # S_target = S_pre / c after width growth
    grow_c_depth=1.412,  # ... after depth growth
    grow_rewarmup_iters=150,  # linear LR re-warmup after target-mode growth
    # generation evaluation
    temperature=1.0,
    top_k=0,  # 0: no top-k filtering
    max_new_tokens=350,
    generation_eval_iters=1,  # prompts per dataset = generation_eval_iters * generation_batch_size
    generation_batch_size=16,
    generation_eval_interval_multiplier=1,  # generations every N evaluations
    finegrained_log_iters=0,  # >0: also evaluate (with generations) often during the first N iters
    finegrained_eval_interval=0,  # 0: finegrained_log_iters // 10
    generation_datasets=[],  # which of "id" and eval_dataset_names get generations; [] = all of them
    feature_eval="",  # a feature (e.g. Twist): judge generations, log gen_feature_score (evaluation/eval_features.py)
    # system
    device="",  # "" = auto: cuda, mps, cpu
    dtype="",  # "" = auto: bfloat16 on CUDA (float16 without bf16), float32 otherwise; float64 allowed
    compile=False,
    peak_flops=0.0,  # device peak FLOP/s for MFU; 0 = known GPUs only (A100, H100, H200 bf16)
)


def dataset_vocab(cfg):
    """The vocab number of the data layout (0 = Llama 2) and the model's vocabulary size."""
    if cfg["vocab_source"] == "llama2":
        return 0, 32000
    if cfg["vocab_source"] != "custom":
        raise UserError(f"vocab_source must be 'custom' or 'llama2', not '{cfg['vocab_source']}'")
    return cfg["vocab_size"], cfg["vocab_size"]


def load_tokenizer(cfg):
    from tokenizer import Tokenizer, tokenizer_model_path
    layout_vocab, _ = dataset_vocab(cfg)
    return Tokenizer(tokenizer_model_path(cfg["data_cache_dir"], layout_vocab, cfg.get("tokenizer_model") or None))


class LMEvaluator:
    """Mean LM loss on fixed batches of the train split, the test split and each eval dataset's
    test split; and, when asked, generations from BOS-aligned test prompts of every dataset."""

    def __init__(self, cfg, run, tokenizer):
        self.cfg, self.run, self.tokenizer = cfg, run, tokenizer
        self.logger = None
        vocab, _ = dataset_vocab(cfg)
        main_dir = dataset_dir(cfg["data_cache_dir"], vocab, cfg["dataset_name"])
        self.loss_sets = {"train": (main_dir, "train"), "test": (main_dir, "test")}
        self.gen_sets = {"id": main_dir}
        for name in cfg["eval_dataset_names"]:
            self.loss_sets[name] = (dataset_dir(cfg["data_cache_dir"], vocab, name), "test")
            self.gen_sets[name] = dataset_dir(cfg["data_cache_dir"], vocab, name)
        unknown = set(cfg.get("generation_datasets") or []) - set(self.gen_sets)
        if unknown:
            raise UserError(f"generation_datasets names {sorted(unknown)}, which are neither 'id' nor in eval_dataset_names")
        if cfg.get("generation_datasets"):
            self.gen_sets = {k: v for k, v in self.gen_sets.items() if k in cfg["generation_datasets"]}
        self.feature_score = None
        if cfg.get("feature_eval") and run.master:
            from evaluation.eval_features import FeatureScore, make_judge
            self.feature_score = FeatureScore(make_judge(cfg["feature_eval"], cfg["data_cache_dir"], flag="feature_eval"))
            print(f"feature_eval={cfg['feature_eval']}: judge {self.feature_score.judge.description}")

    def loader(self, data_dir, split, batch_size, split_on_bos=False):
        cfg = self.cfg
        return BatchLoader(data_dir, split, batch_size, cfg["max_seq_len"], seed=cfg["seed"],
                           split_on_bos=split_on_bos, bos_id=self.tokenizer.bos_id, device=self.run.device,
                           split_shards_pretrain=cfg["split_shards_pretrain"] and split != "test",
                           pretraining=cfg["pretraining"])

    def __call__(self, model, iter_num, generations):
        metrics = {}
        for name, (data_dir, split) in self.loss_sets.items():
            # a fresh loader re-seeds identically: the same batches at every evaluation
            batches = self.loader(data_dir, split, self.cfg["eval_batch_size"] or self.cfg["batch_size"])
            losses = torch.zeros(self.cfg["eval_iters"])
            for k in range(self.cfg["eval_iters"]):
                x, y = next(batches)
                model(x, y, return_logits=False)
                losses[k] = model.last_loss.float()
            metrics[f"loss/{name}"] = losses.mean().item()
        if generations and self.cfg["max_new_tokens"] > 0:
            for name, data_dir in self.gen_sets.items():
                rows = self.generate(model, data_dir, iter_num)
                if self.feature_score is not None:
                    self.feature_score.add(name, rows)
                if self.logger is not None:
                    self.logger.log_table(f"generations/{name}", ["prefix", "clean_prefix", "generation", "target", "iter_num"], rows, iter_num)
            if self.feature_score is not None:  # among prompts asking for the feature: pooled and per dataset
                metrics.update(self.feature_score.metrics())
        return metrics

    def generate(self, model, data_dir, iter_num):
        """Sample stories for the instruction headers of BOS-aligned test examples."""
        from dataset_spec import extract_story, header_end
        cfg, tok = self.cfg, self.tokenizer
        n_prompts = cfg["generation_eval_iters"] * cfg["generation_batch_size"]
        windows = self.loader(data_dir, "test", cfg["generation_batch_size"], split_on_bos=True)
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
        prompts, targets = prompts[:n_prompts], targets[:n_prompts]
        if not prompts:
            print(f"warning: no test window of {data_dir} holds a whole header within max_seq_len; no generations")
        rows = []
        gen = torch.Generator(device=self.run.device).manual_seed(cfg["seed"] + iter_num)
        bs = cfg["generation_batch_size"]
        from tinystories import progress
        for start in progress(range(0, len(prompts), bs), desc=f"generating ({os.path.basename(data_dir)})",
                              unit="batch", leave=False):
            chunk = prompts[start:start + bs]
            longest = max(len(p) for p in chunk)
            # past max_seq_len the model sees the last max_seq_len tokens (llama2.c's cropping)
            new = cfg["max_new_tokens"]
            idx = torch.zeros(len(chunk), longest, dtype=torch.long)
            mask = torch.zeros(len(chunk), longest, dtype=torch.bool)
            for i, p in enumerate(chunk):  # left padding: every prompt ends where generation starts
                idx[i, longest - len(p):] = torch.tensor(p)
                mask[i, longest - len(p):] = True
            out = model.generate(idx.to(self.run.device), new, temperature=cfg["temperature"],
                                 top_k=cfg["top_k"] or None, prompt_mask=mask.to(self.run.device), generator=gen)
            for i, p in enumerate(chunk):
                prefix = tok.decode(p)
                generation = extract_story(out[i, longest:].tolist(), tok)
                rows.append([prefix, prefix.strip(), generation, targets[start + i], iter_num])
        return rows


def main(argv=None):
    cfg = apply_optimizer_preset(parse_config(DEFAULTS, argv, prog="train.py"), DEFAULTS)
    check_init_from(cfg)
    layout_vocab, model_vocab = dataset_vocab(cfg)
    cfg["vocab_size"] = model_vocab
    run = Run(cfg)
    manifest = check_dataset(cfg["data_cache_dir"], layout_vocab, cfg["dataset_name"], cfg.get("tokenizer_model") or None)
    for name in cfg["eval_dataset_names"]:
        check_dataset(cfg["data_cache_dir"], layout_vocab, name, cfg.get("tokenizer_model") or None)
    tokenizer = load_tokenizer(cfg)
    seed_everything(cfg["seed"])  # identical initial weights on every rank
    model, ckpt = init_model(cfg, run)
    if model.params.vocab_size != manifest.get("vocab_size", model.params.vocab_size):
        raise UserError(f"model vocabulary ({model.params.vocab_size}) does not match dataset "
                        f"'{cfg['dataset_name']}' (vocab {manifest['vocab_size']})")
    seed_everything(cfg["seed"] + run.dist.rank)  # training randomness (dropout) differs per rank
    write_run_config(cfg, run)
    if run.master:
        print(f"model: {model.num_params() / 1e6:.2f}M parameters, {model.params.n_layers} layers, dim {model.params.dim}")
    batches = BatchLoader(dataset_dir(cfg["data_cache_dir"], layout_vocab, cfg["dataset_name"]), "train",
                          cfg["batch_size"], cfg["max_seq_len"], seed=cfg["seed"], rank=run.dist.rank,
                          world_size=run.dist.world_size, split_shards_pretrain=cfg["split_shards_pretrain"],
                          pretraining=cfg["pretraining"], bos_id=tokenizer.bos_id, device=run.device)
    evaluator = LMEvaluator(cfg, run, tokenizer)
    trainer = Trainer(cfg, run, model, batches, evaluator, training_state(cfg, ckpt))
    evaluator.logger = trainer.logger
    fit_and_close(trainer, run)


if __name__ == "__main__":
    cli_main(main)
