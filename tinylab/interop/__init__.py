"""Other tools' formats and services: llama2.c .bin files (llama2c), HF Llama folders and
safetensors (hf), the Hugging Face hub (hub), wandb sweep files (sweep_file) run offline (sweeps)."""
