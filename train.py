"""Pretrain or fine-tune a Llama-style model on a pretokenized TinyStories dataset.

    python train.py configs/base8M.py --learning_rate=1e-4          # one process
    torchrun --nproc_per_node=4 train.py configs/base91M.py          # DDP
    python train.py --help                                           # every config key

Config keys and defaults follow the fine-tuning study's train.py (itself llama2.c's), see
../shared/spec/tinystories-data.md; the loop itself lives in trainer.py (shared with
finetune_t0.py). This file adds what is specific to language modelling on TinyStories datasets:
the data, the evaluation losses on named datasets, and the generation evaluation.
"""


from tinylab.config import parse_config
from tinylab.errors import UserError, cli_main
from tinylab.lm_eval import LMEvaluator, dataset_vocab, load_tokenizer
from tinylab.optim import apply_optimizer_preset
from tinylab.pretokenized import BatchLoader, check_dataset, dataset_dir
from tinylab.schema import TRAIN_DEFAULTS as DEFAULTS
from tinylab.trainer import (
    Run,
    Trainer,
    check_init_from,
    fit_and_close,
    init_model,
    seed_everything,
    training_state,
    write_run_config,
)


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
