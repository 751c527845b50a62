"""T0-style multitask finetuning, one concern per module: the mixture file (mixture), the kinds of
sources, one module each in a registry (sources/), tokenisation (encode), the train / evaluation
overlap check (overlap), packing rows (packing), model batches and loss weights (batches),
finetune_t0.py's keys and typed options (options), Megatron's indexed datasets and weighted-split
arguments (megatron), the built-in tasks (demo), finetune_t0.py's data and evaluation (finetune),
rank classification (rank_eval)."""
