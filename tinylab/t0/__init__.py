"""T0-style multitask finetuning: mixtures, encoding, packing and batches (data), Megatron's indexed
datasets and weighted-split arguments (megatron), the built-in tasks (demo), finetune_t0.py's data
and evaluation (finetune), rank classification (rank_eval)."""
