"""tinylab: the library behind the scripts at the repository root (one concern per module).

Start here: train.py -> schema.TRAIN (its keys) -> trainer.Trainer (the one loop) -> model.py.

  configuration    config (Key, Schema, parsing, --help), schema (every program's keys and rules)
  run plumbing     errors (the one error boundary), fileio (atomic writes), rundir (out_dir: lock,
                   refuse / move aside, config.json), checkpoint, distributed, metrics, progress
  training         trainer (run setup and the loop), optim (AdamW, presets, LR schedules),
                   adafactor (the optimizer), growth (staged training's operators),
                   growth_hook (in-run growth: fixed iterations or the slope rule), growth_plan
                   (grow.py --plan: growth points from fitted scaling laws), warmup (batch-size
                   and sequence-length warmup)
  TinyStories      dataset_spec (records, transforms, template), synth_stories (built-in corpus),
                   tinystories_data (download, synthesize, train_vocab, pretokenize),
                   tokenizer, pretokenized (dataset checks, the batch loader), lm_eval (train.py's
                   evaluation: losses, generations, feature score), probes (per-layer feature
                   probes and lenses on a frozen model: in the loop and for evaluation/probe.py)
  T0 finetuning    t0_data (mixtures, encoding, packing, masks), t0_demo (built-in tasks),
                   t0_finetune (finetune_t0.py's data and evaluation), rank_eval
  evaluation       eval_common (models, tokenizers, text data for the tools), perplexity, lambada,
                   feature_judge, probes (above), hub (Hugging Face hub access), run_tables (a run's
                   logged generation tables, scored after the fact); staged-training's
                   interfaces: staged_eval (its model flags), hf_models (any HF causal LM, its
                   Lightning GPT-2 checkpoints), token_files (its uint16 token files),
                   staged_train (eval_wikitext.py train on the one loop)
  interop, tools   interop (llama2.c .bin, HF Llama folders), sweeps (offline wandb sweeps),
                   plotting

model.py stays at the root, where llama2.c users import it from; the package imports it from
there. Nothing here imports an entry script (tests/test_layout.py checks it).
"""
from tinylab.errors import install_interrupt_hook

install_interrupt_hook()  # Ctrl-C while the entry script's imports load: one line, exit 130 (errors.py)
