"""Pretrain or fine-tune a Llama-style model on a pretokenized TinyStories dataset.

    python train.py configs/base8M.py --learning_rate=1e-4          # one process
    torchrun --nproc_per_node=4 train.py configs/base91M.py          # DDP
    python train.py --help                                           # every config key

Config keys and defaults follow the fine-tuning study's train.py (itself llama2.c's); each component
declares its keys, with their allowed values, and tinylab/schema.py assembles them (TRAIN). The run's
setup is tinylab/training/setup.py's, the loop tinylab/training/trainer.py's (both shared with
finetune_t0.py); what is specific to language modelling on TinyStories datasets, the
evaluation losses on named datasets and the generation evaluation, is tinylab/eval/lm_eval.py's.
probes=True / lenses=True train the original's per-layer heads on the frozen model instead
(tinylab/eval/probes.py; docs/evaluation.md).
"""
import os
import sys

from tinylab.core.errors import UserError, cli_main
from tinylab.core.memory_budget import Shape, check_training
from tinylab.data.documents import DocumentBatches, DocumentOptions
from tinylab.data.options import LMDataOptions
from tinylab.data.pretokenized import BatchLoader, check_dataset
from tinylab.eval.lm_eval import GenerationOptions, LMEvaluator, dataset_vocab, lm_tokenizer
from tinylab.eval.probes import HeadsEvaluator, check_feature_labels, heads_for_config
from tinylab.growth.hook import GrowthHook
from tinylab.schema import GROW, TRAIN
from tinylab.training.export_hook import write_bin_beside
from tinylab.training.options import TrainerOptions
from tinylab.training.restart import RestartOptions
from tinylab.training.setup import (
    Run,
    fit_and_close,
    init_model,
    open_run_folder,
    seed_everything,
    start_run,
    training_state,
)
from tinylab.training.staged_flags import doubled_checkpoint, notice
from tinylab.training.trainer import Trainer
from tinylab.training.warmup import BatchWarmup

SCHEMA = TRAIN  # sweep.py reads a program's keys from here


def grow_and_exit(cfg) -> bool:
    """staged-training's `--doubling weights|layers --resume X` (gpt_pretrain.py:1362-1453): grow X
    into X.doubled_weights / X.doubled_layer with grow.py and stop; the same command run again
    trains from that file (the translation resumes it). The restart flags act when it is resumed."""
    if cfg["doubling"] is None or cfg["resume_ckpt"] == doubled_checkpoint(cfg):
        return False
    import grow
    argv = ["--doubling", cfg["doubling"], "--resume", cfg["resume_ckpt"]]
    if cfg["doubling_layers"] is not None:
        argv += ["--doubling_layers", cfg["doubling_layers"]]
    if cfg["compat"] == "original" and "compat" in GROW.keys:
        argv.append("--compat=original")
    grow.main(argv)
    say_translation(cfg)
    print(f"the grown checkpoint is trained by this command run again, or by --resume {doubled_checkpoint(cfg)}")
    return True


def say_translation(cfg):
    """The staged-training flags' translation, once (rank 0), when nothing can refuse the run any
    more (an error stays the one line on stderr)."""
    said = notice(cfg)
    if said and os.environ.get("RANK", "0") == "0":
        print(said, file=sys.stderr)


def main(argv=None):
    cfg = TRAIN.parse(argv)  # every value checked; nothing is written before this
    if grow_and_exit(cfg):
        return
    data = LMDataOptions.from_config(cfg)
    cfg["vocab_size"] = dataset_vocab(cfg)[1]  # the model's (32000 with vocab_source=llama2)
    manifest = check_dataset(data.data_cache_dir, data.layout_vocab, data.dataset_name, data.tokenizer_model)
    for name in data.eval_dataset_names:
        check_dataset(data.data_cache_dir, data.layout_vocab, name, data.tokenizer_model)
    tokenizer = lm_tokenizer(cfg)
    if cfg["probes"]:  # their labels are the examples' Features lines
        check_feature_labels(data.dataset_dir(), "train", tokenizer, f"probes=True: dataset_name={data.dataset_name}",
                             data.split_shards_pretrain, data.pretraining)
        for name in data.eval_dataset_names:
            check_feature_labels(data.dataset_dir(name), "test", tokenizer, f"probes=True: eval_dataset_names {name}")
    run = Run.from_config(cfg)
    if cfg["init_from"] == "scratch":  # (a resumed shape is the checkpoint's: init_model checks it)
        check_training(cfg, run, Shape.from_config(cfg))  # memory, before anything is built or created
    with open_run_folder(cfg, run) as run_dir:
        seed_everything(cfg["seed"])  # identical initial weights on every rank
        model, ckpt = init_model(cfg, run)
        if model.params.vocab_size != manifest["vocab_size"]:
            raise UserError(f"model vocabulary ({model.params.vocab_size}) does not match dataset "
                            f"'{cfg['dataset_name']}' (vocab {manifest['vocab_size']})")
        heads = heads_for_config(cfg, model, ckpt)  # probes / lenses: trained instead of the (frozen) model
        seed_everything(cfg["seed"] + run.dist.rank)  # training randomness (dropout) differs per rank
        batches = BatchLoader.from_options(data, "train", cfg["seed"], rank=run.dist.rank, world_size=run.dist.world_size,
                                           bos_id=tokenizer.bos_id, device=run.device,
                                           split_on_bos=cfg["probes"])  # probes read each window's story
        documents = DocumentOptions.from_config(cfg)
        if documents.mask:  # each token attends within its own story (tinylab/data/documents.py)
            batches = DocumentBatches(batches, tokenizer.bos_id, documents)
        generation = GenerationOptions.from_config(cfg)
        if heads is None:
            evaluator = LMEvaluator(cfg, run, tokenizer, generation)
        else:
            batches = heads.batches(batches, tokenizer)
            evaluator = HeadsEvaluator(cfg, run, tokenizer, generation, heads)
        state = training_state(cfg, ckpt)
        if state is not None:  # staged-training's restart flags (a resumed run)
            state = RestartOptions.from_config(cfg).apply(state, cfg, log=print if run.master else (lambda _: None))
        trainer = Trainer(TrainerOptions.from_config(cfg), run, model, batches, evaluator, state,
                          config=cfg, generation_every=generation.interval_multiplier,
                          batch_warmup=BatchWarmup.from_config(cfg), critical_batch_size=cfg["critical_batch_size"],
                          heads=heads)
        if cfg["export_bin"]:  # model.bin beside every checkpoint (llama2.c v0, for run.c)
            trainer.save_hooks["export_bin"] = write_bin_beside
        start_run(run_dir, cfg, trainer)  # the first write: everything above may still refuse the run
        say_translation(cfg)
        if run.master:
            print(f"model: {model.num_params() / 1e6:.2f}M parameters, {model.params.n_layers} layers, "
                  f"dim {model.params.dim}")
        growth = GrowthHook.from_config(cfg, state)
        if growth is not None:
            trainer.step_hooks["growth"] = growth
        evaluator.logger = trainer.logger
        fit_and_close(trainer, run)


if __name__ == "__main__":
    cli_main(main)
