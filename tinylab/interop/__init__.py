"""Other tools' formats and services: llama2.c .bin and HF Llama folders (formats), the Hugging Face
hub (hub), wandb sweep files run offline (sweeps)."""
