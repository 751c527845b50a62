"""allenai/staged-training's gpt_pretrain.py flags in train.py, with the original's meaning
(docs/growth.md, "Running staged-training's commands").

    python train.py --save_dir runs --save_prefix small --gpu_count 1 --batch_size 4 --grad_accum 32 \\
        --lr 0.002 --warmup_steps 3000 --train_steps 250000 --val_every 50 --val_batches 50 --seqlen 1024 \\
        --log_rate 10 --num_workers 4 --random --dim=768 --n_layers=12 --n_heads=8

Each flag is a key of its own, spelt and written as the original's argparse flags are (`--flag
VALUE`, bare booleans); `translate` maps the ones given onto this project's keys before the config
is validated, and train.py prints `notice(cfg)`, the translation, once on stderr. A flag's keys override a config file; the
same key given on the command line with another value is refused. The flags stay in the config
(config.json), which marks the run as a staged-training run (schema.train_family). Flags whose name
is one of our keys (`--batch_size`, `--seed`, `--lr`, `--grad_clip`) mean the same in both
spellings and are those keys (`--batch_size 8` = `--batch_size=8`); `--weight_decay VALUE`,
`--warmup_bsz VALUE` and `--warmup_seq VALUE` are refused, as they would mean something else. What cannot apply here
is `REFUSED`: one line saying why and what to use instead. The restart flags are restart.py's.
"""
import os

from tinylab.core.config import COUNT, Key
from tinylab.core.errors import UserError
from tinylab.training.restart import RESTART_KEYS

DEFAULT_SAVE_DIR, DEFAULT_SAVE_PREFIX = "runs/", "test"  # gpt_pretrain.py:1285-1286
DOUBLED = {"weights": ".doubled_weights", "layers": ".doubled_layer"}  # gpt_pretrain.py:1386, 1450 (= grow.py's)


def world_size() -> int:
    """The number of processes torchrun started (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _checkpoint(path):
    return os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path


# flag -> (Key, what it sets: fn(value, world) -> {our key: value}, or a notice when it sets nothing)
def _flag(name, default, help, sets, **kw):
    nargs = 0 if isinstance(default, bool) else 1
    return Key(name, default, help, nargs=nargs, **kw), sets


_FLAGS = [
    _flag("train_steps", None, "optimizer steps of the run and of the linear schedule (-> max_iters)",
          lambda v, w: {"max_iters": v}, type=int, range="[0, inf)"),
    _flag("grad_accum", None, "micro-batches per optimizer step in each process (-> gradient_accumulation_steps "
          "= grad_accum x processes)", lambda v, w: {"gradient_accumulation_steps": v * w}, type=int, range=COUNT),
    _flag("seqlen", None, "tokens per training sequence (-> max_seq_len)", lambda v, w: {"max_seq_len": v},
          type=int, range=COUNT),
    _flag("warmup_steps", None, "optimizer steps of linear LR warmup, then linear decay to 0 at train_steps "
          "(-> warmup_iters, lr_schedule=linear)", lambda v, w: {"warmup_iters": v}, type=int, range="[0, inf)"),
    _flag("val_every", None, "optimizer steps between validations (-> eval_interval)",
          lambda v, w: {"eval_interval": v}, type=int, range=COUNT),
    _flag("val_batches", None, "validation batches per process (-> eval_iters = val_batches x processes)",
          lambda v, w: {"eval_iters": v * w}, type=int, range=COUNT),
    _flag("log_rate", None, "log every this many optimizer steps (-> log_interval)",
          lambda v, w: {"log_interval": v}, type=int, range=COUNT),
    _flag("save_dir", None, "the run folder is save_dir/save_prefix (-> out_dir; default runs/)",
          lambda v, w: {}, type=str, nonempty=True),
    _flag("save_prefix", None, "the run folder is save_dir/save_prefix (-> out_dir; default test)",
          lambda v, w: {}, type=str, nonempty=True, output="run", output_path=False),  # (out_dir's guard)
    _flag("resume", None, "continue this checkpoint (a file, or a folder holding ckpt.pt): weights, optimizer, "
          "schedule position (-> init_from=resume_train, resume_ckpt)",
          lambda v, w: {"init_from": "resume_train", "resume_ckpt": _checkpoint(v)}, type=str, nonempty=True,
          input=True),
    _flag("resume_model_only", None, "start from this checkpoint's weights alone (-> init_from=resume_model, "
          "model_dir)", lambda v, w: {"init_from": "resume_model", "model_dir": v}, type=str, nonempty=True,
          input=True),
    _flag("doubling", None, "with --resume X: write X.doubled_weights / X.doubled_layer (grow.py) and exit; when it "
          "exists, train from it", lambda v, w: f"grow --resume's checkpoint into <ckpt>{DOUBLED[v]} (grow.py) "
          "and exit, or train from it when it exists", type=str, choices=("weights", "layers")),
    _flag("doubling_layers", None, "--doubling layers: alternate_id | append_id | alternate_copy | append_copy "
          "(grow.py's)", lambda v, w: "how grow.py places the copies", type=str,
          choices=("alternate_id", "append_id", "alternate_copy", "append_copy")),
    _flag("layers", None, "transformer blocks (-> n_layers)", lambda v, w: {"n_layers": v}, type=int, range=COUNT),
    _flag("fp16", False, "mixed precision in float16 with a loss scaler (-> dtype=float16)",
          lambda v, w: {"dtype": "float16"}),
    _flag("adam_epsilon", None, "AdamW epsilon (-> adam_eps)", lambda v, w: {"adam_eps": v}, type=float,
          range="(0, inf)"),
    _flag("adam_beta1", None, "AdamW beta1 (-> beta1)", lambda v, w: {"beta1": v}, type=float, range="[0, 1)"),
    _flag("adam_beta2", None, "AdamW beta2 (-> beta2)", lambda v, w: {"beta2": v}, type=float, range="[0, 1)"),
    _flag("gpu_count", None, "processes per node the run expects (-1 = every visible GPU): checked against "
          "torchrun's world size", lambda v, w: f"checked against the {w} process(es) of this run", type=int,
          range="[-1, inf)"),
    _flag("node_count", None, "nodes the run expects (checked with gpu_count against the world size)",
          lambda v, w: "checked with --gpu_count", type=int, range=COUNT),
    _flag("num_workers", None, "data-loader worker processes: no effect here (the memory-mapped loader reads in the "
          "training process and fetches the next batch while the device works)",
          lambda v, w: "no effect (the memory-mapped loader has no workers)", type=int, range="[0, inf)"),
    _flag("random", False, "a randomly initialised model (the original's default loads pretrained GPT-2): here "
          "init_from=scratch, the default", lambda v, w: "a new model (init_from=scratch, the default)"),
    _flag("disable_checkpointing", False, "no effect, as in the original (its use is commented out)",
          lambda v, w: "no effect (as in gpt_pretrain.py)"),
]
STAGED_FLAG_KEYS = [key for key, _ in _FLAGS] + RESTART_KEYS
_SETS = {key.name: sets for key, sets in _FLAGS}

_PREPROCESSING = ("gpt_pretrain.py's C4 preprocessing: here data is pretokenized by `python tinystories.py "
                  "pretokenize` into --data_cache_dir; choose it with --dataset_name=NAME")
REFUSED = {
    "model": "gpt_pretrain.py's model is a Hugging Face GPT-2 (pretrained unless --random); this project trains its "
             "own Llama-style model from scratch: give its shape with --dim=/--n_layers=/--n_heads= or a config file, "
             "or start from one of ours with --resume_model_only DIR",
    "size": "the GPT2_* sizes are GPT-2 shapes; give this model's shape instead: GPT2_base = --dim=768 --n_layers=12 "
            "--n_heads=8, GPT2_large = --dim=1536 --n_layers=24 --n_heads=16 (div2/div4_width: dim and heads / 2 or "
            "/ 4; div2/div4_depth: n_layers / 2 or / 4), or a config file (configs/)",
    "tokenizer": "the GPT-2 BPE tokenizer is not used here: datasets are pretokenized with a sentencepiece model "
                 "(--vocab_size=, --tokenizer_model=, --dataset_name=)",
    "tpu_core_count": "TPUs are not supported: train on CUDA, MPS or the CPU (--device=)",
    "weight_decay": "gpt_pretrain.py never passes --weight_decay to AdamW (its decay is 0); this project's "
                    "--weight_decay=X is decoupled decay on the matrices: write --weight_decay=0 for the original's",
    **{flag: f"gpt_pretrain.py counts --{flag} in the tokens of each process; this project's --{flag}=N counts "
             f"the tokens of all processes (the same in one process): write --{flag}=N x processes"
       for flag in ("warmup_bsz", "warmup_seq")},
    **{flag: _PREPROCESSING for flag in ("input_dir", "output_dir", "data_type", "add_sep_after_doc",
                                         "train_dev_split", "shard_size", "num_preprocessing_workers")},
}


def given(cfg) -> list:
    """The staged-training flags the config sets (a flag left out is None / False / 0)."""
    return [k.name for k in STAGED_FLAG_KEYS
            if k.name in cfg and cfg[k.name] is not None and cfg[k.name] is not False and cfg[k.name] != k.default]


def _spelt(name, value):
    return f"--{name}" if value is True else f"--{name} {value}"


def _targets(cfg, w):
    """[(flag as written, {key: value} or a notice)] of the flags given, in the table's order."""
    out = []
    for name in given(cfg):
        sets = _SETS[name](cfg[name], w) if name in _SETS else f"{name}={cfg[name]} (restarts the resumed run)"
        out.append((_spelt(name, cfg[name]), sets))
    if cfg.get("save_dir") is not None or cfg.get("save_prefix") is not None:
        folder = os.path.join(cfg["save_dir"] or DEFAULT_SAVE_DIR, cfg["save_prefix"] or DEFAULT_SAVE_PREFIX)
        flags = " ".join(_spelt(n, cfg[n]) for n in ("save_dir", "save_prefix") if cfg[n] is not None)
        out = [(f, s) for f, s in out if not f.startswith(("--save_dir", "--save_prefix"))] + [(flags, {"out_dir": folder})]
    if cfg.get("train_steps") is not None or cfg.get("warmup_steps") is not None:
        # get_linear_schedule_with_warmup: linear warmup, then a straight line to 0 at train_steps
        out.append(("(the original's schedule)", {"lr_schedule": "linear", "min_lr": 0.0, "lr_decay_iters": 0}))
    return out


def translate(cfg, sources) -> dict:
    """A new config with the staged-training flags given mapped onto our keys. A key a flag sets
    overrides a config file's value; the same key set on the command line to another value is
    refused. The schedule's shape (linear decay to 0) is set only where the user set none. `notice(cfg)` says what was done, once the config has passed its checks."""
    names = given(cfg)
    if not names:
        return dict(cfg)
    keys = {k.name: k for k in STAGED_FLAG_KEYS}
    for name in names:  # the flags' own values first, so that a bad one is named as written
        keys[name].validate(cfg[name], sources.get(name, f"--{name}"))
    if cfg.get("resume") is not None and cfg.get("resume_model_only") is not None:
        raise UserError("--resume and --resume_model_only both say where the run starts: give one")
    out = dict(cfg)
    for flag, sets in _targets(cfg, world_size()):
        for key, value in ({} if isinstance(sets, str) else sets).items():
            source = sources.get(key, "")
            if flag.startswith("("):  # implied by the flags: the user's own choice wins
                out[key] = cfg[key] if key in sources else value
            elif source.startswith("--") and cfg[key] != value:
                raise UserError(f"{flag} means {key}={value!r}, but {source}={cfg[key]!r} is given too: give one")
            else:
                out[key] = value
    doubled = doubled_checkpoint(cfg)
    if doubled is not None and os.path.exists(doubled):  # gpt_pretrain.py:1355-1361: train from the grown file
        out["resume_ckpt"] = doubled
    return out


def notice(cfg):
    """The translation of a translated config, as one line (None without staged-training flags)."""
    if not given(cfg):
        return None
    said = []
    for flag, sets in _targets(cfg, world_size()):
        if isinstance(sets, str):
            said.append(f"{flag} -> {sets}")
        else:  # (only an implied key can differ: a clash is refused)
            said.append(f"{flag} -> " + ", ".join(f"{k}={v}" if cfg[k] == v else
                                                  f"{k}={cfg[k]} (kept as set; the original's is {v})"
                                                  for k, v in sets.items()))
    doubled = doubled_checkpoint(cfg)
    if doubled is not None and cfg["resume_ckpt"] == doubled:
        said.append(f"{doubled} exists -> resume_ckpt={doubled} (gpt_pretrain.py trains from it)")
    return "notice: staged-training flags: " + ", ".join(said)


def doubled_checkpoint(cfg):
    """The file --doubling writes beside --resume's checkpoint (None without --doubling)."""
    if cfg.get("doubling") is None or cfg.get("resume") is None:
        return None
    return _checkpoint(cfg["resume"]) + DOUBLED[cfg["doubling"]]


def expected_processes(cfg):
    """The world size the flags ask for (gpu_count x node_count), or None when gpu_count is not given."""
    gpus = cfg.get("gpu_count")
    if gpus is None:
        return None
    if gpus == -1:  # PTL's gpus=-1: every GPU this process can see (CUDA_VISIBLE_DEVICES)
        import torch
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            raise UserError("--gpu_count -1 asks for every visible GPU, and this machine has none: give --gpu_count 1 "
                            "to train in one process (on the CPU)")
    return max(gpus, 1) * (cfg.get("node_count") or 1)  # gpus=0 is PTL's CPU run: one process


def check_staged_flags(cfg):
    """The flags' rules beyond their ranges (train.py): the process count, --doubling's inputs, fp16."""
    want, w = expected_processes(cfg), world_size()
    if want is not None and want != w:
        how = "torchrun --nproc_per_node=N train.py ..." if want > 1 else "python train.py ... (without torchrun)"
        raise UserError(f"--gpu_count {cfg['gpu_count']}{' --node_count ' + str(cfg['node_count']) if cfg.get('node_count') else ''} "
                        f"expects {want} process(es), but this run has {w}: start it with {how}")
    if cfg.get("doubling_layers") is not None and cfg.get("doubling") != "layers":
        raise UserError(f"--doubling_layers {cfg['doubling_layers']} chooses how --doubling layers places the copies: "
                        f"give --doubling layers")
    for flag in ("resume", "resume_model_only"):
        path = cfg.get(flag)
        if path is not None and not os.path.isfile(_checkpoint(path)):
            raise UserError(f"--{flag} {path}: no such checkpoint (a ckpt.pt file, or a folder holding one)")
    if cfg.get("doubling") is not None and cfg.get("resume") is None:
        raise UserError(f"--doubling {cfg['doubling']} grows the checkpoint --resume names: give --resume CHECKPOINT")
    if cfg.get("doubling") == "layers" and cfg.get("doubling_layers") is None:
        raise UserError("--doubling layers needs --doubling_layers (alternate_id | append_id | alternate_copy | "
                        "append_copy); gpt_pretrain.py fails without it too")
