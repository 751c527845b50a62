"""T0-style multitask prompted finetuning of a pretrained model (spec ../shared/spec/t0-finetuning.md).

    python finetune_t0.py configs/t0_small.py --model_dir=out/base --mixture=data/t0/mixture.json \\
        [--prefixlm=True] [--optimizer=adafactor --adafactor_preset=t0] [--loss_normalization=example]
    torchrun --nproc_per_node=N finetune_t0.py ...
    python finetune_t0.py --make_demo_data=data/t0_demo      # the built-in multitask set (t0_demo.py)
    python finetune_t0.py --help                              # every config key

Examples of the mixture's training sources are drawn in proportion to their weights, packed
greedily into rows of max_seq_len + 1 tokens, attend only within their own example (causal, or
prefix-LM over the inputs), restart their positions at 0, and are trained on their targets only
(t0_data.py). Validation groups are evaluated on their own fixed rows (loss/valid/<name>) and, when
they have answer_choices, by rank classification (rank_acc/<name>, evaluation/eval_rank.py).
The loop, checkpoints, exact resume (--init_from=resume_train), DDP and logging are trainer.py's.
"""
import json
import os

from tinylab.config import parse_config
from tinylab.errors import UserError, cli_main
from tinylab.schema import T0_DEFAULTS as DEFAULTS
from tinylab.t0_data import (
    TOKENIZATION_DEFAULTS,
    ExampleEncoder,
    T0Batches,
    load_mixture,
)
from tinylab.t0_finetune import (
    T0Data,
    T0Evaluator,
    apply_presets,
    base_checkpoint,
    check_config,
    check_pretrain_text,
    resolve_tokenizer,
)
from tinylab.trainer import (
    Run,
    Trainer,
    fit_and_close,
    init_model,
    seed_everything,
    training_state,
    write_run_config,
)


def main(argv=None):
    cfg = parse_config(DEFAULTS, argv, prog="finetune_t0.py")
    if cfg["make_demo_data"]:
        from tinylab.t0_demo import write_demo_data
        mixture = write_demo_data(cfg["make_demo_data"], seed=0)
        print(f"wrote {len(mixture['train'])} training and {len(mixture['valid'])} validation sources to "
              f"{cfg['make_demo_data']}/mixture.json")
        return
    cfg = apply_presets(cfg)
    check_config(cfg)
    train_src, valid_src = load_mixture(cfg["mixture"])  # mistakes first, before anything is loaded
    base = base_checkpoint(cfg)
    base_len = base["model_args"]["max_seq_len"]
    if cfg["max_seq_len"] > base_len:
        raise UserError(f"max_seq_len={cfg['max_seq_len']} exceeds the base model's {base_len}")
    cfg["max_seq_len"] = cfg["max_seq_len"] or base_len
    tok = resolve_tokenizer(cfg, base)
    cfg["tokenizer_model"] = os.path.abspath(tok.model_path)  # so resume and eval_rank find it
    if cfg["pretrain_text"]:
        cfg["pretrain_text"] = check_pretrain_text(cfg["pretrain_text"], tok, base["model_args"]["vocab_size"])
    run = Run(cfg)
    encoder = ExampleEncoder(tok, **{k: cfg[k] for k in TOKENIZATION_DEFAULTS})
    data = T0Data(train_src, valid_src, encoder, cfg["max_seq_len"] + 1, log=print if run.master else (lambda *a: None))
    seed_everything(cfg["seed"])  # identical initial weights on every rank
    model, ckpt = init_model(cfg, run, ckpt=base)
    seed_everything(cfg["seed"] + run.dist.rank)  # training randomness (dropout) differs per rank
    world = run.dist.world_size
    stream = data.stream(cfg)
    batches = T0Batches(stream, data.train, cfg["batch_size"], cfg["gradient_accumulation_steps"] // world,
                        run.dist.rank, world, cfg["loss_normalization"], cfg["prefixlm"], run.device,
                        run.param_dtype, cfg["pad_id"], identity=data.identity(cfg))
    evaluator = T0Evaluator(cfg, run, data, encoder, stream)
    fill = data.stream(cfg)
    fill.next_rows(256)
    write_run_config(cfg, run)
    if run.master:
        report = {"sources": data.report, "fill_rate_first_256_rows": fill.fill_rate(), "mixing": cfg["mixing"],
                  "held_out": [g["source"].name for g in data.valid if g["held_out"]]}
        with open(os.path.join(cfg["out_dir"], "data_report.json"), "w") as f:
            json.dump(report, f, indent=1)
        print(f"model: {model.num_params() / 1e6:.2f}M parameters; rows of {cfg['max_seq_len'] + 1} tokens, "
              f"fill rate {fill.fill_rate():.3f} (first 256 rows, mixing={cfg['mixing']})")
    trainer = Trainer(cfg, run, model, batches, evaluator, training_state(cfg, ckpt), best_metric="loss/valid")
    if run.master:
        trainer.logger.log({"iter": trainer.iter_num, "data": report}, kind="data")
    fit_and_close(trainer, run)


if __name__ == "__main__":
    cli_main(main)
