# T0-style multitask finetuning of a study-sized base model (configs/base8M.py, base30M.py) on a
# P3-style mixture, with T0's optimizer (Adafactor, constant 1e-3 relative steps, no warmup).
#   python finetune_t0.py configs/t0_small.py --model_dir=out/base8M --mixture=data/t0/mixture.json
out_dir = "out/t0_small"
max_seq_len = 0  # rows as long as the base model's context (256 for the study's models)
batch_size = 64  # packed rows per micro-batch
gradient_accumulation_steps = 4
max_iters = 3000
eval_interval = 250
eval_iters = 10
log_interval = 10
rank_eval_examples = 500
adafactor_preset = "t0"
dropout = 0.1  # as T0 and BLOOMZ
loss_normalization = "token"
compile = True  # GPU; set --compile=False on CPU
