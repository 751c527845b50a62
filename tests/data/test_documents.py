"""document_mask / document_positions (tinylab/data/documents.py): the segment ids of windows cut
from concatenated stories, the logits each story gets inside a window (the same as alone), the
batch source train.py uses, and the memory estimate's mask."""
import contextlib

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from tinylab.core import memory_budget
from tinylab.data.documents import DocumentBatches, DocumentOptions
from tinylab.data.pretokenized import BatchLoader
from tinylab.nn.attention import bos_segments, segment_positions
from tinylab.schema import TRAIN

BOS = 1


def test_segment_ids_and_positions_of_hand_written_windows():
    windows = torch.tensor([[1, 5, 6, 1, 7, 8, 9],     # BOS first
                            [5, 6, 1, 7, 1, 8, 9],     # BOS mid-window, twice: the tail before it is a story too
                            [5, 6, 7, 8, 9, 9, 4],     # no BOS: one story, as without the mask
                            [5, 1, 1, 7, 8, 9, 1]])    # an empty story (BOS BOS), a BOS last
    assert bos_segments(windows, BOS).tolist() == [[2, 2, 2, 3, 3, 3, 3],
                                                   [1, 1, 2, 2, 3, 3, 3],
                                                   [1, 1, 1, 1, 1, 1, 1],
                                                   [1, 2, 3, 3, 3, 3, 4]]
    assert segment_positions(bos_segments(windows, BOS)).tolist() == [[0, 1, 2, 0, 1, 2, 3],
                                                                     [0, 1, 0, 1, 0, 1, 2],
                                                                     [0, 1, 2, 3, 4, 5, 6],
                                                                     [0, 0, 0, 1, 2, 3, 0]]
    assert DocumentOptions(False, False).inputs(windows, BOS) == {}
    assert set(DocumentOptions(True, False).inputs(windows, BOS)) == {"segment_ids"}
    both = DocumentOptions(True, True).inputs(windows, BOS)
    assert both["position_ids"].tolist()[1] == [0, 1, 0, 1, 0, 1, 2]


def _alone(model, story):
    return model(torch.tensor([story]), all_logits=True)[0]


@pytest.mark.slow
@pytest.mark.parametrize("positions", [False, True])
@pytest.mark.parametrize("impl", ["sdpa", "dense", "flex"])  # flex: CUDA's block mask, run eagerly here
@pytest.mark.filterwarnings("ignore::UserWarning")  # flex's "eager, no backward" notice on the CPU
def test_each_story_gets_the_logits_it_has_alone(positions, impl):
    model = tiny_model(dtype=torch.float64, max_seq_len=32)
    model.attention_impl = impl
    # gradients recorded as in training (SDPA then gets the additive mask); flex has no CPU backward
    with torch.no_grad() if impl == "flex" else contextlib.nullcontext():
        _check_stories(model, positions)


def _check_stories(model, positions):
    g = torch.Generator().manual_seed(0)
    tail = torch.randint(2, 8192, (3,), generator=g).tolist()  # the end of a story begun before the window
    a = [BOS] + torch.randint(2, 8192, (6,), generator=g).tolist()
    b = [BOS] + torch.randint(2, 8192, (8,), generator=g).tolist()
    window = torch.tensor([tail + a + b])
    extra = DocumentOptions(True, positions).inputs(window, BOS)
    logits = model(window, all_logits=True, **extra)[0]
    # the reference: every story run alone through the plain model (causal, positions from 0)
    reference = torch.cat([_alone(model, s) for s in (tail, a, b)])
    # positions restarted: the same computation; kept: RoPE is relative, so only rounding differs
    assert (logits - reference).abs().max() < (1e-13 if positions else 1e-10)
    plain = model(window, all_logits=True)[0]  # without the mask the later stories see the earlier ones
    assert (plain[len(tail):] - reference[len(tail):]).abs().max() > 1e-3
    # the training loss (the fused head, return_logits=False) is the mean CE of those logits
    targets = torch.randint(2, 8192, window.shape, generator=g)
    model(window, targets, return_logits=False, **extra)
    assert abs(model.last_loss.item() - F.cross_entropy(reference, targets[0]).item()) < 1e-10


def test_a_story_alone_is_unchanged():
    model = tiny_model(dtype=torch.float64)
    story = torch.tensor([[BOS, 9, 10, 11, 12]])
    extra = DocumentOptions(True, True).inputs(story, BOS)
    assert (model(story, all_logits=True, **extra) - model(story, all_logits=True)).abs().max() < 1e-13


def test_document_batches_are_the_loaders_windows_with_their_ids(tiny_corpus):
    loader = BatchLoader(tiny_corpus.dataset_dir, "train", 4, 64, seed=3)
    batches = DocumentBatches(BatchLoader(tiny_corpus.dataset_dir, "train", 4, 64, seed=3), BOS, DocumentOptions(True, True))
    for _ in range(3):
        x, y = next(loader)
        batch = next(batches)
        assert set(batch) == {"tokens", "targets", "segment_ids", "position_ids"}
        assert torch.equal(batch["tokens"], x) and torch.equal(batch["targets"], y)
        assert torch.equal(batch["segment_ids"], 1 + (x == BOS).long().cumsum(1))
    assert (batch["segment_ids"] > 1).any()  # the corpus's windows do hold several stories
    # the position is the loader's: a resumed source continues where this one is
    resumed = DocumentBatches(BatchLoader(tiny_corpus.dataset_dir, "train", 4, 64, seed=3), BOS, DocumentOptions(True))
    resumed.load_state_dict(batches.state_dict())
    assert batches.state_dict() == loader.state_dict()
    assert torch.equal(next(resumed)["tokens"], next(loader)[0])


def _estimate(argv, device_type="cpu"):
    cfg = TRAIN.parse(argv)
    load = memory_budget.TrainingLoad.from_config(cfg)
    impl = memory_budget.resolve("auto", device_type)
    packed_mask = load.document_arrays > 0 and memory_budget.ATTENTION.get(impl).dense_packed_mask
    est = memory_budget.training_estimate(cfg, memory_budget.Shape.from_config(cfg), packed_mask=packed_mask)
    return {t.name: t.bytes for t in est.terms}


def test_memory_estimate_counts_the_dense_mask_and_the_ids():
    base = ["--batch_size=8", "--max_seq_len=128", "--dim=32", "--n_layers=2", "--n_heads=4", "--n_kv_heads=2", "--eval_batch_size=8"]
    off, mask = _estimate(base), _estimate(base + ["--document_mask=True"])
    both = _estimate(base + ["--document_mask=True", "--document_positions=True"])
    assert "document attention mask" not in off
    assert mask["document attention mask"] == 8 * 128 * 128 * (4 + 1)  # fp32 additive + the bool mask
    assert mask["batch buffers"] - off["batch buffers"] == 8 * 128 * 8  # int64 segment ids
    assert both["batch buffers"] - off["batch buffers"] == 2 * 8 * 128 * 8  # and position ids
    assert "document attention mask" not in _estimate(base + ["--document_mask=True"], "cuda")  # flex: block mask


def test_memory_check_refuses_a_mask_that_does_not_fit(monkeypatch):
    from types import SimpleNamespace
    run = SimpleNamespace(device_type="cpu", device="cpu", dtype="float32", fsdp=False,
                          dist=SimpleNamespace(enabled=False, world_size=1))
    argv = ["--batch_size=16", "--max_seq_len=2048", "--dim=32", "--n_layers=2", "--n_heads=4", "--n_kv_heads=2", "--vocab_size=512"]
    without = sum(_estimate(argv).values())
    mask = 16 * 2048 * 2048 * 5
    available = without + mask // 2
    monkeypatch.setattr(memory_budget, "available_memory", lambda d: (available, "this machine has little"))
    cfg = TRAIN.parse(argv)
    memory_budget.check_training(cfg, run, memory_budget.Shape.from_config(cfg))  # fits without the mask
    cfg = TRAIN.parse(argv + ["--document_mask=True"])
    with pytest.raises(memory_budget.UserError, match="document attention mask 320.0 MiB"):
        memory_budget.check_training(cfg, run, memory_budget.Shape.from_config(cfg))
