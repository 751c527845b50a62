"""Training: the run's setup (setup: device and process group, the model, the state to restore,
the run folder), the one training loop (trainer) and its typed options and keys (options), the
optimizers and LR schedules it steps (optim, adafactor, presets), batch-size and sequence-length
warmup (warmup), the gradient-noise estimate (noise), and the model.bin save hook (export_hook)."""
