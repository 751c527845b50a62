# The docs/t0.md demo: finetune the tiny CPU model of configs/tiny_demo.py (bash demo.sh) on the
# built-in multitask set (python finetune_t0.py --make_demo_data=data/t0_demo), ~5 minutes on 2 CPU cores.
out_dir = "out/t0_demo"
model_dir = "out/demo"
mixture = "data/t0_demo/mixture.json"
batch_size = 8
gradient_accumulation_steps = 2
learning_rate = 1e-3
max_iters = 300
eval_interval = 100
eval_iters = 4
log_interval = 20
rank_eval_examples = 200
device = "cpu"
dtype = "float32"
