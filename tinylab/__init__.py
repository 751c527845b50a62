"""tinylab: the library behind the scripts at the repository root, one folder per concern.

Start here: train.py -> schema.TRAIN (its keys) -> training/trainer.py (the one loop) -> model.py.

  schema.py   every program's key set, assembled from the keys each component declares
  core/       config machinery, errors, atomic writes, the output guard, run folders,
              checkpoints, distributed setup, metrics, progress, memory estimates
  training/   the one training loop, optimizers (AdamW, Adafactor), LR schedules, warmups
  data/       TinyStories records and transforms, the built-in corpus, the data stages,
              tokenizers, the pretokenized loader
  growth/     staged training: growth operators, in-run growth, growth planning
  t0/         T0 finetuning: mixtures, sources, encoding, packing, batches, rank evaluation
  eval/       what the evaluation tools compute
  interop/    llama2.c and Hugging Face formats, the HF hub, offline wandb sweeps

Each folder's __init__.py lists its modules. model.py stays at the root, where llama2.c users
import it from; the package imports it from there. Nothing here imports an entry script, and
no module imports a folder above its own in that list (tests/test_layout.py checks both).
"""
import os

from tinylab.core.errors import install_interrupt_hook

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: what ships beside the package

install_interrupt_hook()  # Ctrl-C while the entry script's imports load: one line, exit 130 (errors.py)
