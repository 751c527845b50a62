"""compat=original for staged training: the growth operators as allenai/staged-training's
gpt_pretrain.py writes them (width: block-diagonal weights, Adam moments m/2, v/4 on the diagonal
blocks only, the final LayerNorm's unscaled; depth *_id: plain weight copies, identity patterns in
the old positions' moments), and grow.py / train.py reaching them through compat=original.

The references re-implement the original's code (gpt_pretrain.py:91-162, 225-249 for width;
264-318, 1390-1448 for depth) on this model's parameter names, with the GPT-2 name each maps to:
c_attn q/k/v -> wq/wk/wv, attn c_proj -> wo, c_fc -> w1/w3, mlp c_proj -> w2, ln_1/ln_2 ->
attention_norm/ffn_norm, ln_f -> norm, wte -> tok_embeddings (tied head)."""
import copy
import re

import pytest
import torch
from conftest import records, run_main, tiny_model

import train
from tinylab.core.checkpoint import load_checkpoint, model_args_dict
from tinylab.growth.options import GrowthOptions
from tinylab.growth.state import grow_checkpoint
from tinylab.schema import GROW, TRAIN
from tinylab.training.optim import build_optimizer, optimizer_param_names
from tinylab.training.options import OptimizerOptions

VOCAB, T = 53, 16
CFG = dict(TRAIN.defaults(), learning_rate=1e-2, warmup_iters=0, max_iters=50, optimizer="adamw", dropout=0.0)


def trained(seed=0, steps=3, n_layers=2):
    """A tied tiny model in float64 after a few AdamW steps, as the checkpoint dict train.py writes."""
    m = tiny_model(seed=seed, dtype=torch.float64, n_layers=n_layers, n_kv_heads=1, vocab_size=VOCAB,
                   max_seq_len=T, tie_embeddings=True).train()
    opt = build_optimizer(m, OptimizerOptions.from_config(CFG))
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        x, y = torch.randint(0, VOCAB, (4, T), generator=g), torch.randint(0, VOCAB, (4, T), generator=g)
        m(x, y)
        m.last_loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"model": m.state_dict(), "model_args": model_args_dict(m), "iter_num": steps, "config": dict(CFG),
            "optimizer": copy.deepcopy(opt.state_dict()), "optimizer_name": "adamw",
            "param_names": optimizer_param_names(opt), "param_overrides": None, "lr_rewarmup": None}


def states_by_name(ck):
    return {n: ck["optimizer"]["state"][i] for i, n in enumerate(ck["param_names"]) if i in ck["optimizer"]["state"]}


# ---------------------------------------------------------------------- the original's width code, re-implemented

def double_matrix_weight(x, is_grad, is_avg_sq):  # gpt_pretrain.py:119-131
    y = x.new_zeros(*[2 * i for i in x.shape])
    y[:x.shape[0], :x.shape[1]] = x.detach().clone()
    y[-x.shape[0]:, -x.shape[1]:] = x.detach().clone()
    if is_grad:
        y /= 2.0 if not is_avg_sq else 4.0
    return y


def double_bias(x, is_grad, is_avg_sq):  # gpt_pretrain.py:134-146
    y = x.new_zeros(2 * x.shape[0])
    y[:x.shape[0]] = x.detach().clone()
    y[-x.shape[0]:] = x.detach().clone()
    if is_grad:
        y /= 2.0 if not is_avg_sq else 4.0
    return y


def double_embedding(x, is_grad, is_avg_sq):  # gpt_pretrain.py:149-161
    y = x.new_zeros(x.shape[0], 2 * x.shape[1])
    y[:, :x.shape[1]] = x.detach().clone()
    y[:, -x.shape[1]:] = x.detach().clone()
    if is_grad:
        y /= 2.0 if not is_avg_sq else 4.0
    return y


def double_param(name, x, is_grad, is_avg_sq):  # the dispatch, gpt_pretrain.py:225-249, on our names
    if name == "tok_embeddings.weight":  # wte
        return double_embedding(x, is_grad, is_avg_sq)
    if name.endswith(("wq.weight", "wk.weight", "wv.weight", "wo.weight", "w1.weight", "w2.weight", "w3.weight")):
        return double_matrix_weight(x, is_grad, is_avg_sq)
    if name == "norm.weight":  # ln_f: double_bias(is_grad=False), then the weight halved
        y = double_bias(x, is_grad=False, is_avg_sq=False)
        return y if is_grad else y / 2.0
    assert name.endswith(("attention_norm.weight", "ffn_norm.weight")), name  # ln_1, ln_2
    return double_bias(x, is_grad, is_avg_sq)


def test_width_original_equals_the_original_code():
    ck = trained()
    g = grow_checkpoint(ck, GrowthOptions("weights", symmetry_breaking="blockdiag", width_moments="original"), CFG)
    old_states, new_states = states_by_name(ck), states_by_name(g)
    assert set(new_states) == set(old_states) - {"output.weight"}  # tied: one tensor
    for name, W in ck["model"].items():
        if name == "output.weight":
            continue
        assert torch.equal(g["model"][name], double_param(name, W, False, False)), name
        st, new = old_states[name], new_states[name]
        assert torch.equal(new["exp_avg"], double_param(name, st["exp_avg"], True, False)), name
        assert torch.equal(new["exp_avg_sq"], double_param(name, st["exp_avg_sq"], True, True)), name
        assert torch.equal(new["step"], st["step"])
    # ours (the default) scales the off-diagonal blocks' moments too: the one difference
    ours = states_by_name(grow_checkpoint(ck, GrowthOptions("weights", symmetry_breaking="blockdiag"), CFG))
    m = old_states["layers.0.feed_forward.w1.weight"]["exp_avg"]
    r, c = m.shape
    assert torch.equal(ours["layers.0.feed_forward.w1.weight"]["exp_avg"][:r, c:], m / 2)
    assert torch.count_nonzero(new_states["layers.0.feed_forward.w1.weight"]["exp_avg"][:r, c:]) == 0


# ---------------------------------------------------------------------- the original's depth code, re-implemented

def deep_param(x, is_identical):  # deep_matrix_weight / deep_bias, gpt_pretrain.py:280-304 (our names end in .weight)
    if is_identical:
        y = torch.zeros_like(x)
        if len(y.shape) > 1:
            y.fill_diagonal_(1)
        return y
    return x.detach().clone()


def original_deepen(ck, variant):
    """gpt_pretrain.py:1390-1448 on our names (prefix 'layers'): (weights, moments by name)."""
    prefix, n = "layers", ck["model_args"]["n_layers"]
    map_positions, copy_positions = {}, {}
    for key in ck["model"]:
        if key.startswith(prefix + "."):
            layer_idx = re.findall(r"[-\d]+", key)[0]
            origin_idx = prefix + "." + str(int(layer_idx))
            if "alternate" in variant:
                insert_idx = prefix + "." + str(int(layer_idx) * 2 + 1)
                origin_key = key.replace(origin_idx, prefix + "." + str(int(layer_idx) * 2))
            else:
                insert_idx = prefix + "." + str(n + int(layer_idx))
                origin_key = key
            insert_key = key.replace(origin_idx, insert_idx)
            map_positions[key] = [(origin_key, False), (insert_key, False)]
            copy_positions[insert_key] = (key, False)
            copy_positions[origin_key] = (key, True)
    is_identical = "id" in variant
    weights = {}
    for key, w in ck["model"].items():
        for new_key, flag in map_positions.get(key, [(key, False)]):
            weights[new_key] = deep_param(w, flag and is_identical)
    old, moments = states_by_name(ck), {}
    for name in weights:
        if name == "output.weight":
            continue
        src, flag = copy_positions.get(name, (name, False))
        st = copy.deepcopy(old[src])
        st["exp_avg"] = deep_param(old[src]["exp_avg"], flag and is_identical)
        st["exp_avg_sq"] = deep_param(old[src]["exp_avg_sq"], flag and is_identical)
        moments[name] = st
    return weights, moments


@pytest.mark.parametrize("variant,placement", [("alternate_id", "interleave"), ("append_id", "append")])
def test_depth_id_original_equals_the_original_code(variant, placement):
    ck = trained(n_layers=2)
    g = grow_checkpoint(ck, GrowthOptions("layers", placement=placement, depth_id="original"), CFG)
    weights, moments = original_deepen(ck, variant)
    assert set(g["model"]) == set(weights)
    for name, w in weights.items():
        assert torch.equal(g["model"][name], w), name
    new = states_by_name(g)
    assert set(new) == set(moments)
    for name, st in moments.items():
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(new[name][k], st[k]), (name, k)
    # the old position of layer 0 carries the identity pattern, its copy the moments
    old_pos = "layers.0.attention.wo.weight"
    assert torch.equal(new[old_pos]["exp_avg_sq"], torch.eye(*new[old_pos]["exp_avg_sq"].shape, dtype=torch.float64))
    # ours (the default) zeroes the copies' output projections instead, and gives them fresh moments
    ours = grow_checkpoint(ck, GrowthOptions("layers", placement=placement), CFG)
    copy_pos = "layers.1.attention.wo.weight" if placement == "interleave" else "layers.2.attention.wo.weight"
    assert torch.count_nonzero(ours["model"][copy_pos]) == 0 and copy_pos not in states_by_name(ours)


# ---------------------------------------------------------------------- through the programs

def test_grow_cli_compat_original(tmp_path):
    ck = trained()
    src = str(tmp_path / "ckpt.pt")
    torch.save(ck, src)
    proc = run_main("grow.py", ["--doubling", "layers", "--doubling_layers", "alternate_id", "--resume", src,
                                "--compat=original", "--out_dir", str(tmp_path / "deep")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "compat=original (allenai/staged-training): " in proc.stderr and "depth_id='original'" in proc.stderr
    assert "plain layer copies: the function is NOT preserved" in proc.stdout
    g = load_checkpoint(str(tmp_path / "deep" / "ckpt.pt"))
    weights, moments = original_deepen(ck, "alternate_id")
    assert all(torch.equal(g["model"][n], w) for n, w in weights.items())
    assert all(torch.equal(states_by_name(g)[n]["exp_avg"], st["exp_avg"]) for n, st in moments.items())
    # width: block-diagonal weights and the original's moments, loss preserved
    proc = run_main("grow.py", ["--doubling", "weights", "--resume", src, "--compat=original",
                                "--out_dir", str(tmp_path / "wide")])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "symmetry_breaking='blockdiag'" in proc.stderr and "width_moments='original'" in proc.stderr
    w = load_checkpoint(str(tmp_path / "wide" / "ckpt.pt"))
    name = "layers.0.attention.wq.weight"
    assert torch.equal(w["model"][name], double_param(name, ck["model"][name], False, False))
    st = states_by_name(ck)[name]
    assert torch.equal(states_by_name(w)[name]["exp_avg_sq"], double_param(name, st["exp_avg_sq"], True, True))
    change = float(proc.stdout.split("(change ")[1].split(")")[0])
    assert abs(change) < 1e-6, proc.stdout


def test_compat_original_sets_the_staged_keys_of_each_program():
    cfg = GROW.prepare(dict(GROW.defaults(), compat="original", symmetry_breaking="off"))  # a key the user set wins
    assert (cfg["symmetry_breaking"], cfg["width_moments"], cfg["depth_id"]) == ("off", "original", "original")
    assert GROW.prepare(dict(GROW.defaults(), compat="original", plan=True)) == dict(GROW.defaults(), compat="original",
                                                                                      plan=True)
    from tinylab.core.compat import apply_compat
    d = TRAIN.defaults()
    out = apply_compat(dict(d, compat="original"), d, "staged", quiet=True)
    assert {k: out[k] for k in ("adam_bias_correction", "beta1", "beta2", "adam_eps", "weight_decay",
                                "grow_symmetry_breaking", "grow_width_moments", "grow_depth_id")} == dict(
        adam_bias_correction=False, beta1=0.9, beta2=0.98, adam_eps=1e-6, weight_decay=0.0,
        grow_symmetry_breaking="blockdiag", grow_width_moments="original", grow_depth_id="original")


@pytest.mark.slow
def test_in_run_growth_with_the_original_operators(tiny_corpus, tmp_path):
    run = str(tmp_path / "run")
    cfg = dict(data_cache_dir=tiny_corpus.cache_dir, vocab_size=tiny_corpus.vocab_size,
               dataset_name=tiny_corpus.dataset_name, out_dir=run, dim=16, n_layers=1, n_heads=2, n_kv_heads=1,
               multiple_of=16, max_seq_len=32, batch_size=4, gradient_accumulation_steps=1, learning_rate=3e-3,
               warmup_iters=2, max_iters=10, eval_interval=100, eval_iters=1, log_interval=1, max_new_tokens=0,
               device="cpu", dtype="float64", grow_schedule="3:weights,6:layers", grow_symmetry_breaking="blockdiag",
               grow_width_moments="original", grow_depth_id="original", adam_bias_correction=False, weight_decay=0.0)
    train.main([f"--{k}={v}" for k, v in cfg.items()])
    growth = records(run, "growth")
    assert [(r["iter"], r["doubling"]) for r in growth] == [(3, "weights"), (6, "layers")]
    assert abs(growth[0]["delta_loss"]) < 1e-10  # block-diagonal width doubling preserves the function
    assert abs(growth[1]["delta_loss"]) > 1e-4  # the original's *_id: plain copies, the block runs twice
    assert load_checkpoint(run)["model_args"]["n_layers"] == 2
