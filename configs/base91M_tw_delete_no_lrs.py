# Deletion fine-tuning of the 91M model ("*_no_lrs": constant LR), as in the study.
# The dataset comes from the command line or the sweep (sweeps/deletion.yaml), e.g.
#   python train.py configs/base91M_tw_delete_no_lrs.py --dataset_name=filter-adv-Twist --learning_rate=1e-4
# out_dir is formatted with the config, so every sweep run gets its own folder.
init_from = "resume_model"
model_dir = "out/base91M"
out_dir = "out/delete/{dataset_name}_lr{learning_rate}"
dataset_name = "filter-Twist"
eval_dataset_names = ["specialise-Twist", "filter-Twist", "filter-adv-Twist"]
vocab_source = "custom"
vocab_size = 8192
max_seq_len = 1024
batch_size = 128
gradient_accumulation_steps = 1
learning_rate = 1e-5
lr_scheduling = False
warmup_iters = 0
max_iters = 4000
eval_interval = 300
eval_iters = 10
checkpoint_interval = 2500
generation_eval_interval_multiplier = 5
finegrained_log_iters = 300
generation_batch_size = 16
compile = True
