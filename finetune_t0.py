"""T0-style multitask prompted finetuning of a pretrained model (docs/t0.md).

    python finetune_t0.py configs/t0_small.py --model_dir=out/base --mixture=data/t0/mixture.json \\
        [--prefixlm=True] [--optimizer=adafactor --adafactor_preset=t0] [--loss_normalization=example]
    torchrun --nproc_per_node=N finetune_t0.py ...
    python finetune_t0.py --make_demo_data=data/t0_demo      # the built-in multitask set (tinylab/t0/demo.py)
    python finetune_t0.py --model_dir=out/base --train-weighted-split-paths "T: 1 0:0.9 data/rte, 2 0:1 data/copa" \
        --valid-weighted-split-paths "rte: 1 0.9:1 data/rte" --test-weighted-split-paths ...   # Megatron's arguments
    python finetune_t0.py --preprocess --input=rte.jsonl --output_prefix=data/rte --model_dir=out/base
    python finetune_t0.py --help                              # every config key

Examples of the mixture's training sources are drawn in proportion to their weights, packed into
rows of max_seq_len + 1 tokens (best-fit decreasing; --packing=next_fit: greedy), attend only
within their own example (causal, or prefix-LM over the inputs), restart their positions at 0,
and are trained on their targets only (tinylab/t0/: mixture.py, sources/, encode.py, packing.py,
batches.py). Validation groups are evaluated on their own fixed rows (loss/valid/<name>) and,
when they have answer_choices, by rank classification (rank_acc/<name>, tinylab/t0/rank_eval.py);
test groups once at the end (loss/test/<name>). Megatron-DeepSpeed's indexed datasets and
weighted-split arguments are read as there (tinylab/t0/megatron.py).
The loop, checkpoints, exact resume (--init_from=resume_train), DDP and logging are
tinylab/training/'s (setup.py, trainer.py); the keys are assembled in tinylab/schema.py
(FINETUNE_T0), T0's own declared in tinylab/t0/options.py.
"""
import os

from tinylab.core.errors import UserError, cli_main
from tinylab.core.memory_budget import Shape, check_training
from tinylab.schema import FINETUNE_T0
from tinylab.t0.batches import T0Batches
from tinylab.t0.demo import write_demo_data
from tinylab.t0.finetune import T0Data, T0Evaluator, base_checkpoint, check_pretrain_text, resolve_tokenizer
from tinylab.t0.megatron_args import check_against_base
from tinylab.t0.mixture import mixture_from_config
from tinylab.t0.options import LossOptions, TokenizationOptions
from tinylab.t0.preprocess import preprocess
from tinylab.training.export_hook import write_bin_beside
from tinylab.training.options import TrainerOptions
from tinylab.training.setup import (
    Run,
    fit_and_close,
    init_model,
    open_run_folder,
    seed_everything,
    start_run,
    training_state,
)
from tinylab.training.trainer import Trainer

SCHEMA = FINETUNE_T0  # sweep.py reads a program's keys from here


def make_demo_data(cfg):
    out = cfg["make_demo_data"]  # guarded when the flags were parsed: new, or moved aside with --overwrite=True
    mixture = write_demo_data(out, seed=0)
    print(f"wrote {len(mixture['train'])} training and {len(mixture['valid'])} validation sources to "
          f"{os.path.join(out, 'mixture.json')}")


def main(argv=None):
    cfg = FINETUNE_T0.parse(argv)  # every value checked; nothing is written before this
    if cfg["make_demo_data"]:
        return make_demo_data(cfg)
    if cfg["preprocess"]:
        return preprocess(cfg)
    mixture = mixture_from_config(cfg)  # mistakes first, before anything is loaded
    base = base_checkpoint(cfg)
    base_len = base["model_args"]["max_seq_len"]
    if cfg["max_seq_len"] > base_len:
        raise UserError(f"max_seq_len={cfg['max_seq_len']} exceeds the base model's {base_len}")
    cfg["max_seq_len"] = cfg["max_seq_len"] or base_len
    check_against_base(cfg, base["model_args"])  # Megatron's architecture flags describe the loaded model
    tok = resolve_tokenizer(cfg, base)
    cfg["tokenizer_model"] = os.path.abspath(tok.model_path)  # so resume and eval_rank find it
    if cfg["pretrain_text"]:
        cfg["pretrain_text"] = check_pretrain_text(cfg["pretrain_text"], tok, base["model_args"]["vocab_size"])
    run = Run.from_config(cfg)
    # memory for the base model's shape, before anything is built or created
    check_training(cfg, run, Shape.from_model_args(base["model_args"]), packed=True)
    with open_run_folder(cfg, run) as run_dir:
        encoder = TokenizationOptions.from_config(cfg).encoder(tok)
        data = T0Data(mixture.train, mixture.valid, encoder, cfg["max_seq_len"] + 1,
                      log=print if run.master else (lambda *a: None), test=mixture.test,
                      overlap_check=cfg["overlap_check"], too_long=cfg["too_long_examples"])
        seed_everything(cfg["seed"])  # identical initial weights on every rank
        model, ckpt = init_model(cfg, run, ckpt=base)
        model.attention_impl = cfg["attention_impl"]  # how the packed rows attend (model.packed_attention)
        seed_everything(cfg["seed"] + run.dist.rank)  # training randomness (dropout) differs per rank
        world = run.dist.world_size
        stream = data.stream(cfg)
        loss = LossOptions.from_config(cfg)
        batches = T0Batches(stream, data.train, cfg["batch_size"], cfg["gradient_accumulation_steps"] // world,
                            run.dist.rank, world, loss.normalization, loss.prefixlm, run.device,
                            run.param_dtype, cfg["pad_id"], identity=data.identity(cfg))
        evaluator = T0Evaluator(cfg, run, data, encoder, stream)
        fill = data.stream(cfg)
        fill.next_rows(256)
        report = {"sources": data.report, "fill_rate_first_256_rows": fill.fill_rate(), "mixing": cfg["mixing"],
                  "packing": cfg["packing"],
                  "held_out": [g["name"] for g in data.valid if g["held_out"]], "test": [g["name"] for g in data.test]}
        state = training_state(cfg, ckpt, reset_progress=cfg["reset_progress"])  # reset: model_dir's optimizer state
        trainer = Trainer(TrainerOptions.from_config(cfg), run, model, batches, evaluator, state, config=cfg,
                          best_metric="loss/valid")
        if cfg["export_bin"]:  # model.bin beside every checkpoint (llama2.c v0, for run.c)
            trainer.save_hooks["export_bin"] = write_bin_beside
        start_run(run_dir, cfg, trainer)  # the first write: everything above may still refuse the run
        run_dir.write_json("data_report.json", report)
        if run.master:
            print(f"model: {model.num_params() / 1e6:.2f}M parameters; rows of {cfg['max_seq_len'] + 1} tokens, "
                  f"fill rate {fill.fill_rate():.3f} (first 256 rows, mixing={cfg['mixing']}, packing={cfg['packing']})")
        if run.master:
            trainer.logger.log({"iter": trainer.iter_num, "data": report}, kind="data")
        fit_and_close(trainer, run)


if __name__ == "__main__":
    cli_main(main)
