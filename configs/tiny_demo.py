# A tiny model that trains on the built-in procedural corpus on a laptop CPU in a few minutes
# (the README Quickstart). Data: python tinystories.py synthesize / train_vocab / pretokenize.
out_dir = "out/demo"
data_cache_dir = "data/demo"
vocab_source = "custom"
vocab_size = 512
dim = 128
n_layers = 4
n_heads = 4
n_kv_heads = 2
multiple_of = 32
max_seq_len = 256
batch_size = 16
gradient_accumulation_steps = 2
learning_rate = 2e-3
max_iters = 600
warmup_iters = 50
min_lr = 2e-4
weight_decay = 0.1
eval_interval = 200
eval_iters = 10
log_interval = 20
max_new_tokens = 200
generation_batch_size = 4
device = "cpu"
dtype = "float32"
compile = False
