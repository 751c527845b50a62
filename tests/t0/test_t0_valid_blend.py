"""valid_groups=blended: a validation group scored as Megatron-DeepSpeed scores it, against its
code path re-implemented here (t0loading): each source's rows by _build_index_mappings /
_build_sample_idx over epochs (decoder_packed_mtf_dataset.py:409-497, over our seeded shuffles:
numpy default_rng instead of RandomState(seed), a documented difference), blended by
BlendableDataset (helpers.cpp build_blending_indices), read by a validation iterator that is built
once and continues (training.py:1212), and evaluate()'s loss: the sum of the micro-batch losses
over eval_iters x num_microbatches, divided by that count (training.py:1038-1077); each
micro-batch's loss the token mean of its target labels (or with --norm-target-loss the mean over
its target sequences), computed here by running every example alone through the model."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from tinylab.t0.encode import Examples
from tinylab.t0.finetune import T0Evaluator
from tinylab.t0.valid_blend import eval_position

ROW, SEED, PAD = 33, 4, 0  # rows of seq_length + 1 tokens; pad never occurs in the ids


def make_examples(name, n, rng, too_long=()):
    ex = Examples(name, stats={"examples": n})
    for i in range(n):
        n_in, n_tgt = int(rng.integers(2, 12)), int(rng.integers(1, 8))
        if i in too_long:
            n_in = ROW + 5
        ex.ids.append(rng.integers(1, 8192, size=n_in + n_tgt).astype(np.int32))
        ex.n_input.append(n_in)
    return ex


def megatron_source_rows(sizes, s, n_rows):
    """_build_index_mappings' loop: epochs of shuffled documents appended until more than n_rows
    rows exist; _build_sample_idx carries the open row (row_offset, old_sample_start) across
    epochs, closes a row when the next example would pass seq_length, skips longer ones."""
    shuffle, samples, row_offset, old_start, epoch = [], [], 0, 0, 0
    while len(samples) <= n_rows:
        document_ids = np.random.default_rng([SEED, 11, s, epoch]).permutation(len(sizes)).tolist()
        shuffle += document_ids
        row_length, start, epoch_offset = row_offset, old_start, epoch * len(document_ids)
        for end, doc in enumerate(document_ids):
            end = epoch_offset + end
            tok_len = sizes[doc]
            row_length = row_length + tok_len
            if row_length > ROW:
                if end > start:
                    samples.append((start, end))
                start, row_length = end, tok_len
                if tok_len > ROW:
                    start, row_length = end + 1, 0
                    continue
        row_offset, old_start = row_length, start
        epoch += 1
    return [shuffle[a:b] for a, b in samples]


def megatron_blend(weights, size):
    w = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    taken, out = np.zeros(len(w), dtype=np.int64), []
    for i in range(size):
        d = int(np.argmax(w * max(i, 1.0) - taken))
        out.append((d, int(taken[d])))
        taken[d] += 1
    return out


def example_losses(model, ids, n_in):
    """(sum of target CE, target labels) of one example run alone (causal)."""
    ids = torch.as_tensor(ids.astype(np.int64))
    with torch.no_grad():
        logits = model(ids[None, :-1], all_logits=True)[0].double()
    ce = F.cross_entropy(logits, ids[1:], reduction="none")[n_in - 1:]
    return ce.sum().item(), len(ce)


def megatron_evaluate(model, sources, weights, eval_iters, micro, num_microbatches, consumed, norm_target_loss):
    """evaluate(): eval_iters global batches of num_microbatches micro-batches read from the
    iterator at `consumed` rows; the mean of the micro-batch losses."""
    per_source = [megatron_source_rows([len(x) for x in ex.ids], s, 10_000) for s, ex in enumerate(sources)]
    n = eval_iters * num_microbatches * micro
    blend = megatron_blend(weights, consumed + n)[consumed:]
    rows = [[(d, doc) for doc in per_source[d][k]] for d, k in blend]
    total = 0.0
    for mb in range(eval_iters * num_microbatches):
        parts = [example_losses(model, sources[d].ids[i], sources[d].n_input[i])
                 for row in rows[mb * micro:(mb + 1) * micro] for d, i in row]
        if norm_target_loss:  # each target sequence weighs 1, divided by the number of sequences
            total += sum(s / c for s, c in parts) / len(parts)
        else:
            total += sum(s for s, _ in parts) / sum(c for _, c in parts)
    return total / (eval_iters * num_microbatches)


@pytest.mark.slow
@pytest.mark.parametrize("normalization", ["token", "example"])
def test_blended_group_loss_is_megatrons(normalization):
    rng = np.random.default_rng(0)
    sources = [make_examples("a", 12, rng, too_long=(3,)), make_examples("b", 20, rng, too_long=(0, 7))]
    weights, micro, gas, E, interval = [1.0, 3.0], 2, 2, 2, 5
    cfg = dict(max_seq_len=ROW - 1, eval_iters=E * gas, batch_size=micro, seed=SEED, pad_id=PAD, rank_eval_examples=0,
               rank_eval_batch_size=0, score_eos=False, valid_groups="blended", too_long_examples="close_row",
               loss_normalization=normalization, prefixlm=False, eval_interval=interval, pretrain_text="",
               max_iters=17, eval_only=False)
    group = {"name": "mix", "dataset": "mix", "held_out": False, "weights": weights,
             "members": [{"source": None, "rows": [], "examples": ex} for ex in sources]}
    data = SimpleNamespace(valid=[group], test=[])
    evaluator = T0Evaluator(cfg, SimpleNamespace(device="cpu"), data, None, SimpleNamespace(rows=0))
    model = tiny_model(max_seq_len=ROW)
    rows_per_eval = E * gas * micro
    for k, it in enumerate([5, 10, 15, 17]):  # Megatron's evaluations at 5, 10, 15 and at the end of training
        assert eval_position(it, interval) == k
        want = megatron_evaluate(model, sources, weights, E, micro, gas, k * rows_per_eval, normalization == "example")
        assert evaluator(model, it, False)["loss/valid/mix"] == pytest.approx(want, rel=1e-5)
    # the evaluation at iteration 0 (Megatron makes none) reads the first evaluation's rows
    first = megatron_evaluate(model, sources, weights, E, micro, gas, 0, normalization == "example")
    assert evaluator(model, 0, False)["loss/valid/mix"] == pytest.approx(first, rel=1e-5)
    # a resumed run's fresh evaluator reads the rows the uninterrupted run read
    again = T0Evaluator(cfg, SimpleNamespace(device="cpu"), data, None, SimpleNamespace(rows=0))
    assert again(model, 15, False)["loss/valid/mix"] == pytest.approx(
        megatron_evaluate(model, sources, weights, E, micro, gas, 2 * rows_per_eval, normalization == "example"), rel=1e-5)
    # per_source (the default) is another number: the weighted mean of each source's own rows
    other = T0Evaluator(dict(cfg, valid_groups="per_source"), SimpleNamespace(device="cpu"), data, None,
                        SimpleNamespace(rows=0))
    assert other(model, 5, False)["loss/valid/mix"] != pytest.approx(first, rel=1e-3)


def test_eval_position():
    assert [eval_position(it, 6) for it in (0, 1, 6, 7, 12, 13, 18)] == [0, 0, 0, 1, 1, 2, 2]


@pytest.mark.slow
def test_compat_original_run(t0_setup, tmp_path):
    """finetune_t0.py --compat=original trains and evaluates with every t0 difference switched on."""
    from conftest import read_metrics, run_main, t0_args
    mixture, base = t0_setup
    proc = run_main("finetune_t0.py", t0_args(mixture, base, str(tmp_path / "out"), max_iters=4, eval_interval=2,
                                              eval_iters=2, compat="original"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "valid_groups='blended'" in proc.stderr and "too_long_examples='close_row'" in proc.stderr
    evals = [m for m in read_metrics(str(tmp_path / "out")) if "loss/valid" in m]
    assert [m["iter"] for m in evals] == [0, 2, 4] and all(np.isfinite(m["loss/valid"]) for m in evals)
