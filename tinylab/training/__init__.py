"""The one training loop (trainer) and what it steps: AdamW, presets and LR schedules (optim),
Adafactor (adafactor), batch-size and sequence-length warmup (warmup)."""
