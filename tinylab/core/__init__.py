"""Run plumbing every program shares: the config machinery (config: Key, Schema, parsing, --help),
the drivers' shared keys and their typed views (run_keys: run folder, wandb, system), the one
error boundary (errors), atomic writes (fileio), the one output guard (outputs), the run folder
(rundir), checkpoints, distributed setup (DDP, FSDP2), metrics.jsonl + wandb (metrics), progress
bars, memory estimates checked before allocation (memory_budget), the CPU allocator setting
(perf). Nothing here imports another tinylab subpackage."""
