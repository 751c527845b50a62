"""export_bin=True: a llama2.c model file (v0, for run.c) beside every checkpoint a run writes, as
the study's train.py did: ckpt.pt -> model.bin, ckpt_best.pt -> model_best.bin, each written
atomically. The drivers install it as one of the Trainer's save hooks:

    if cfg["export_bin"]:
        trainer.save_hooks["export_bin"] = write_bin_beside
"""
import os

from tinylab.interop.llama2c import export_bin


def bin_name(ckpt_name: str) -> str:
    """The file beside a checkpoint: ckpt.pt -> model.bin, ckpt_best.pt -> model_best.bin."""
    return "model" + ckpt_name[len("ckpt"):-len(".pt")] + ".bin"


def write_bin_beside(ckpt_path: str, model):
    """A Trainer save hook: `model` (the whole model, also under FSDP) as llama2.c v0 beside the
    checkpoint just written at `ckpt_path`."""
    folder, name = os.path.split(ckpt_path)
    export_bin(model, os.path.join(folder, bin_name(name)), 0)
