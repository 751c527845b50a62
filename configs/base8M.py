# 8M-parameter pretraining model of the fine-tuning study (llama2.c's 15M shape with vocab 8192).
# python train.py configs/base8M.py --out_dir=out/base8M
out_dir = "out/base8M"
vocab_source = "custom"
vocab_size = 8192
dim = 288
n_layers = 6
n_heads = 6
n_kv_heads = 6
multiple_of = 32
max_seq_len = 256
batch_size = 512
gradient_accumulation_steps = 1
learning_rate = 5e-4
max_iters = 100000
warmup_iters = 1000
min_lr = 0.0
eval_interval = 2000
eval_iters = 100
compile = True  # GPU; set --compile=False on CPU
