# 91M-parameter model: the paper's model. The study's README pretrained it with
#   --batch_size=256 --dropout=0.1 --gradient_accumulation_steps=2 --learning_rate=1e-4 --max_seq_len=512
out_dir = "out/base91M"
vocab_source = "custom"
vocab_size = 8192
dim = 768
n_layers = 12
n_heads = 12
n_kv_heads = 12
multiple_of = 64
max_seq_len = 256
batch_size = 128
gradient_accumulation_steps = 4
learning_rate = 5e-4
max_iters = 100000
warmup_iters = 1000
min_lr = 0.0
eval_interval = 2000
eval_iters = 100
compile = True
