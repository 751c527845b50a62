#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py's docstring; docs/gpu_check.md): every CUDA path once on one
# GPU, no network, on the built-in corpus, one table, under 8 minutes on an H100; exit 1 if a row
# says FAIL. Without CUDA (or with --dry) the same sections run on the CPU with tiny shapes.
#   [CUDA_VISIBLE_DEVICES=N] bash bench/gpu_check.sh [--dry] [--peak_flops=F] [--work_dir=DIR --keep]
set -euo pipefail
cd "$(dirname "$0")/.."
# no network: no wandb server, no Hugging Face hub
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
