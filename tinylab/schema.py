"""Config keys of every driver (temporary: plain default dicts; the typed schema replaces them)."""
from tinylab.metrics import WANDB_CONFIG_DEFAULTS
from tinylab.optim import ADAFACTOR_CONFIG_DEFAULTS, OPTIMIZER_DEFAULTS
from tinylab.t0_data import TOKENIZATION_DEFAULTS

TRAIN_DEFAULTS = dict(
    # I/O
    out_dir="out",
    model_dir="",  # resume_model: fine-tune from model_dir/ckpt.pt
    init_from="scratch",  # scratch | resume_train (continue out_dir) | resume_model
    eval_interval=2000,
    checkpoint_interval=0,  # 0: checkpoint at every eval_interval
    log_interval=1,
    eval_iters=100,
    eval_batch_size=0,  # micro-batch size of the loss evaluations; 0 = batch_size
    eval_only=False,
    always_save_checkpoint=True,  # False: a periodic checkpoint only when loss/test improved (llama2.c)
    save_best_model=False,  # also keep out_dir/ckpt_best.pt, the best loss/test so far
    seed=1337,
    **WANDB_CONFIG_DEFAULTS,  # wandb_log, wandb_project, wandb_run_name, wandb_entity, wandb_tags, wandb_mode
    # data
    batch_size=128,  # micro-batch size
    max_seq_len=256,
    vocab_source="custom",  # custom: <data_cache_dir>/tok{vocab_size}.model | llama2: the Llama 2 tokenizer
    vocab_size=8192,
    tokenizer_model="",  # path of the Llama 2 tokenizer.model when vocab_source=llama2
    data_cache_dir="data",
    dataset_name="F_none_MM_none_AT_none_RF_none_IS_none",
    eval_dataset_names=[],  # extra datasets whose test shard is evaluated as loss/<name>
    split_shards_pretrain=False,  # 80/20 split of the train shards into pretrain / fine-tune
    pretraining=True,  # with split_shards_pretrain: True = first 80%, False = last 20%
    # model
    dim=288,
    n_layers=6,
    n_heads=6,
    n_kv_heads=6,
    multiple_of=32,
    hidden_dim=0,  # 0: llama2.c's rule from dim and multiple_of
    dropout=0.0,
    tie_embeddings=True,
    # optimizer and schedule
    gradient_accumulation_steps=4,  # global: split across DDP processes
    learning_rate=5e-4,
    lr_scheduling=True,  # False: constant learning_rate (the *_no_lrs fine-tuning configs)
    max_iters=100000,
    weight_decay=1e-1,
    warmup_iters=1000,
    **OPTIMIZER_DEFAULTS,  # optimizer (adamw | adafactor), betas, eps, clipping, min_lr (optim.py)
    **ADAFACTOR_CONFIG_DEFAULTS,  # optimizer=adafactor settings and presets (t0, hf_t5, bloomz_adam)
    # staged training: in-run growth (grow.py; docs/growth.md)
    grow_schedule="",  # e.g. "2000:weights,6000:layers": double width / depth after those iterations
    grow_mode="target",  # target: schedule back to S_pre/c + LR re-warmup | exact: reproduce the small model
    grow_symmetry_breaking="",  # random | split | blockdiag | off; "" = random (target), off (exact)
    grow_c_width=1.776,  # S_target = S_pre / c after width growth
    grow_c_depth=1.412,  # ... after depth growth
    grow_rewarmup_iters=150,  # linear LR re-warmup after target-mode growth
    # generation evaluation
    temperature=1.0,
    top_k=0,  # 0: no top-k filtering
    max_new_tokens=350,
    generation_eval_iters=1,  # prompts per dataset = generation_eval_iters * generation_batch_size
    generation_batch_size=16,
    generation_eval_interval_multiplier=1,  # generations every N evaluations
    finegrained_log_iters=0,  # >0: also evaluate (with generations) often during the first N iters
    finegrained_eval_interval=0,  # 0: finegrained_log_iters // 10
    generation_datasets=[],  # which of "id" and eval_dataset_names get generations; [] = all of them
    feature_eval="",  # a feature (e.g. Twist): judge generations, log gen_feature_score (evaluation/eval_features.py)
    # system
    device="",  # "" = auto: cuda, mps, cpu
    dtype="",  # "" = auto: bfloat16 on CUDA (float16 without bf16), float32 otherwise; float64 allowed
    compile=False,
    peak_flops=0.0,  # device peak FLOP/s for MFU; 0 = known GPUs only (A100, H100, H200 bf16)
)
T0_DEFAULTS = dict(
    # I/O
    out_dir="out/t0",
    model_dir="",  # the pretrained model: model_dir/ckpt.pt
    init_from="resume_model",  # resume_model: finetune model_dir | resume_train: continue out_dir
    eval_interval=200,
    checkpoint_interval=0,  # 0: checkpoint at every eval_interval
    log_interval=10,
    eval_iters=4,  # validation loss on the first eval_iters * batch_size packed rows of each group
    eval_only=False,
    save_best_model=False,  # also keep out_dir/ckpt_best.pt, the best mean validation loss
    seed=1337,
    **WANDB_CONFIG_DEFAULTS,  # wandb_log, wandb_project, wandb_run_name, wandb_entity, wandb_tags, wandb_mode
    # data
    mixture="",  # mixture.json: {"train": [sources], "valid": [sources]} (docs/t0.md)
    make_demo_data="",  # write the built-in multitask set to this folder and exit
    mixing="example",  # example: mix examples by weight, then pack | row: Megatron's blend of packed rows
    tokenizer_model="",  # "" = the tokenizer named by the base checkpoint's config
    **TOKENIZATION_DEFAULTS,  # add_bos, target_space, add_eos, max_input_len, max_target_len, truncation
    pad_id=0,  # id written into padding (masked everywhere, so any id works)
    batch_size=16,  # packed rows per micro-batch
    max_seq_len=0,  # row length L (rows hold L + 1 tokens); 0 = the base model's max_seq_len
    # masks and loss
    prefixlm=False,  # True: input tokens of an example attend to each other both ways
    loss_normalization="token",  # token | example (BLOOMZ --norm-target-loss) | token_microbatch (Megatron)
    # rank-classification evaluation of validation groups with answer_choices
    rank_eval_examples=200,  # per group, a fixed seeded subset; 0 disables
    rank_eval_batch_size=0,  # 0 = batch_size
    # forgetting: the ordinary LM loss on the test shard of a pretokenized pretraining dataset
    pretrain_text="",  # e.g. data/tok8192/pretrain-all: logged as loss/valid/pretrain_text, not in loss/valid
    score_eos=False,  # also score each choice's EOS
    # model (the shape comes from the checkpoint)
    dropout=0.0,  # T0 and BLOOMZ used 0.1
    # optimizer and schedule: constant LR, no warmup, as T0 and BLOOMZ (presets: adafactor_preset)
    gradient_accumulation_steps=1,  # global: split across DDP processes
    learning_rate=1e-4,
    lr_scheduling=False,
    max_iters=1000,
    weight_decay=0.0,
    warmup_iters=0,
    **OPTIMIZER_DEFAULTS,  # optimizer (adamw | adafactor), betas, eps, clipping, min_lr (optim.py)
    **ADAFACTOR_CONFIG_DEFAULTS,  # adafactor_preset: t0 | hf_t5 | bloomz_adam, and adafactor_* settings
    # system
    device="",  # "" = auto: cuda, mps, cpu
    dtype="",  # "" = auto: bfloat16 on CUDA, float32 otherwise; float64 allowed
    compile=False,
    peak_flops=0.0,
)