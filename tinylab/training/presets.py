"""Optimizer presets: the settings of a named recipe (T0's Adafactor, HF's T5 Adafactor, BLOOMZ's
Adam), filled into a config by `apply_optimizer_preset` (the drivers' schemas run it between parsing
and validation, so the filled values are checked like typed ones). Chosen by the adafactor_preset
key (tinylab/training/options.py).
"""
import sys

from tinylab.core.errors import UserError

_ADAFACTOR_HF = {"adafactor_clip_threshold": 1.0, "adafactor_decay_rate": -0.8,
                 "adafactor_beta1": 0.0, "adafactor_warmup_init": False,
                 "adafactor_relative_step": False, "adafactor_eps1": 1e-30, "adafactor_eps2": 1e-3}


ADAFACTOR_PRESETS = {
    # T0 (Mesh-TF): constant 1e-3 relative to each tensor's RMS, no warmup, no weight decay, no
    # global grad-norm clipping (update clipping replaces it).
    "t0": {**_ADAFACTOR_HF, "optimizer": "adafactor", "adafactor_scale_parameter": True,
           "learning_rate": 1e-3, "lr_scheduling": False, "warmup_iters": 0,
           "weight_decay": 0.0, "grad_clip": 0.0},
    # HF's T5 finetuning recipe: absolute steps of 1e-3 (about 50x t0's on std-0.02 matrices),
    # reached by the config's linear warmup (warmup_iters is left as configured) and then held
    # constant (min_lr = learning_rate turns the cosine into a constant), no extra clipping.
    "hf_t5": {**_ADAFACTOR_HF, "optimizer": "adafactor", "adafactor_scale_parameter": False,
              "learning_rate": 1e-3, "lr_scheduling": True, "decay_lr": True,
              "weight_decay": 0.0, "grad_clip": 0.0},
}


OPTIMIZER_PRESETS = {
    **ADAFACTOR_PRESETS,
    # BLOOMZ finetuning (tr13-mtf): Adam(0.9, 0.95) eps 1e-8, constant 2e-5, no warmup,
    # weight decay 1e-4 (matrices only), grad-norm clip 1.0.
    "bloomz_adam": {"optimizer": "adamw", "learning_rate": 2e-5, "lr_scheduling": False,
                    "warmup_iters": 0, "weight_decay": 1e-4, "grad_clip": 1.0,
                    "beta1": 0.9, "beta2": 0.95, "adam_eps": 1e-8},
}


def apply_optimizer_preset(cfg, defaults=None):
    """A new config with the preset named by cfg['adafactor_preset'] filled in ("" = no preset).

    Sets exactly the keys of OPTIMIZER_PRESETS[name] (optimizer, learning_rate, lr_scheduling,
    warmup_iters (not hf_t5), decay_lr (hf_t5), weight_decay, grad_clip, the adafactor_* keys or
    AdamW's beta1/beta2/adam_eps) and, for hf_t5, min_lr = learning_rate.
    With `defaults` (the driver's default config), a key whose value differs from its default
    was chosen by the user (config file or --key=value) and is kept, e.g.
    `--adafactor_preset=t0 --learning_rate=3e-4`; `optimizer` must then agree with the preset.
    Without `defaults` the preset overwrites every key it names.
    """
    name = cfg["adafactor_preset"]
    out = dict(cfg)
    if not name:
        return out
    if name not in OPTIMIZER_PRESETS:
        raise UserError(f"unknown adafactor_preset '{name}' (choose from "
                        f"{', '.join(OPTIMIZER_PRESETS)}, or '' for none)")
    preset = OPTIMIZER_PRESETS[name]
    for key, value in preset.items():
        user_set = defaults is not None and key in cfg and key in defaults and cfg[key] != defaults[key]
        if user_set and key == "optimizer" and cfg[key] != value:
            raise UserError(f"adafactor_preset={name} uses optimizer={value}, "
                            f"but optimizer={cfg[key]} was set")
        if not user_set:
            out[key] = value
    if name == "hf_t5":
        out["min_lr"] = out["learning_rate"]
        print("notice: adafactor_preset=hf_t5 takes absolute steps (scale_parameter=False), about 50x larger "
              f"than t0's on std-0.02 matrices; keep a warmup (warmup_iters={out['warmup_iters']})", file=sys.stderr)
    return out
