"""train.py with document_mask=True end to end on the built-in corpus: it trains, and its loss
evaluation is the loss of every story of the test windows run alone through the plain model."""
import os

import torch
import torch.nn.functional as F
from conftest import read_metrics, run_main

from tinylab.core import checkpoint as ckpt_lib
from tinylab.data.pretokenized import BatchLoader
from tinylab.data.tokenizer import Tokenizer

VOCAB = 1024


def stories_alone_loss(model, x, y, bos):
    """Mean CE over the windows (B, T), each story (cut at BOS by hand) run alone from position 0."""
    total = 0.0
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        starts = [0] + [t for t, tok in enumerate(row_x) if tok == bos and t > 0] + [len(row_x)]
        for a, b in zip(starts, starts[1:]):
            logits = model(torch.tensor([row_x[a:b]]), all_logits=True)[0]
            total += F.cross_entropy(logits, torch.tensor(row_y[a:b]), reduction="sum").item()
    return total / x.numel()


def test_train_with_document_mask_end_to_end(lab_corpus, tmp_path):
    out = str(tmp_path / "run")
    cfg = dict(data_cache_dir=lab_corpus.cache_dir, vocab_size=VOCAB, out_dir=out, dim=32, n_layers=2, n_heads=4,
               n_kv_heads=2, multiple_of=16, max_seq_len=64, batch_size=4, gradient_accumulation_steps=2,
               learning_rate=3e-3, warmup_iters=2, max_iters=6, eval_interval=6, eval_iters=2, log_interval=1,
               max_new_tokens=0, device="cpu", dtype="float32", dropout=0.0, document_mask=True,
               document_positions=True)
    run_main("train.py", [f"--{k}={v}" for k, v in cfg.items()], check=True)
    rows = read_metrics(out)
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["iter"] for r in train] == list(range(6)) and all(r["loss/train"] > 0 for r in train)
    final = [r for r in rows if r["kind"] == "eval"][-1]
    assert final["iter"] == 6
    ckpt = ckpt_lib.load_checkpoint(out)
    assert ckpt["config"]["document_mask"] is True and ckpt["config"]["document_positions"] is True
    model = ckpt_lib.model_from_checkpoint(ckpt).eval()
    bos = Tokenizer(os.path.join(lab_corpus.cache_dir, f"tok{VOCAB}.model")).bos_id
    test_dir = os.path.join(lab_corpus.cache_dir, f"tok{VOCAB}", ckpt["config"]["dataset_name"])
    windows = BatchLoader(test_dir, "test", 4, 64, seed=ckpt["config"]["seed"])  # the evaluator's windows
    alone, whole = [], []
    with torch.no_grad():
        for _ in range(2):
            x, y = next(windows)
            alone.append(stories_alone_loss(model, x, y, bos))
            model(x, y, return_logits=False)
            whole.append(model.last_loss.item())
    assert abs(final["loss/test"] - sum(alone) / 2) < 1e-5
    assert abs(final["loss/test"] - sum(whole) / 2) > 1e-4  # (without the mask it is another number)
