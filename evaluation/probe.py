"""Per-layer linear probes: can the six story features be read off a frozen model's hidden states?
(docs/evaluation.md)

    python evaluation/probe.py --checkpoint=out/ckpt.pt --dataset=pretrain-all

Inputs are story-only token sequences (BOS + the story after `Story:`; the instruction header is
removed) of examples of the pretokenized --dataset; train-split examples train the probes, test-split
(shard 0) examples measure them. The target is the 6-way multi-hot vector of the features the
example's `Features:` line names, so use a dataset whose headers are honest (pretrain-all, not an
adversarial one). Each transformer block gets its own bias-free linear head dim -> 6 reading the
mean of that block's output at the last --pool real positions; the loss is the sum over heads of
BCE-with-logits, Adam at a constant learning rate, on pooled states computed once (the model is
frozen). Reported: held-out accuracy (logit > 0) per layer and feature, with the majority-class
baseline in the summary. The heads, pooling, loss and accuracy are tinylab/eval/probes.py's, the same
as train.py's in-loop probes (probes=True), which train on blocks 0..n_layers-2 of a frozen model.
Last stdout line: {"layers": [{"layer", "feature", "acc"}, ...]}.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinylab.core.config import Key
from tinylab.core.errors import cli_main
from tinylab.data.pretokenized import check_dataset, dataset_dir
from tinylab.eval.common import cache_dir_of, emit, layout_vocab, load_for_args
from tinylab.eval.probes import LABEL_NAMES, POOL, check_feature_labels, layers_json, run_probes
from tinylab.schema import EVAL

SCHEMA = EVAL.derive("evaluation/probe.py", sections=[("probes", [
    Key("dataset", None, "pretokenized dataset with honest Features lines (e.g. pretrain-all)", type=str,
        required=True, nonempty=True),
    Key("num_train", 2000, "train-split stories for fitting the probes", range="[1, inf)"),
    Key("num_test", 500, "test-split stories for measuring them", range="[1, inf)"),
    Key("iters", 2000, "Adam steps of the probes", range="[1, inf)"),
    Key("lr", 1e-3, "the probes' learning rate", range="(0, inf)"),
    Key("probe_batch_size", 128, "pooled states per probe step", range="[1, inf)"),
    Key("pool", POOL, "mean over this many last real positions", range="[1, inf)"),
])])


def main(argv=None):
    a = SCHEMA.parse_args(argv, SCHEMA.argparser(__doc__.split("\n\n")[0]))
    model, ckpt, tok = load_for_args(a)
    cache, vocab = cache_dir_of(ckpt, a.data_cache_dir), layout_vocab(ckpt, tok)
    check_dataset(cache, vocab, a.dataset, tok.model_path)
    check_feature_labels(dataset_dir(cache, vocab, a.dataset), "train", tok, f"--dataset={a.dataset}")
    import torch  # not at the top: tinylab loads first, with its Ctrl-C hook (tinylab/core/errors.py)
    torch.manual_seed(a.seed)
    r = run_probes(model, tok, dataset_dir(cache, vocab, a.dataset), a.num_train, a.num_test, a.iters, a.lr,
                   a.probe_batch_size, a.pool, a.seed)
    print(f"probes on {a.dataset}: {r['n_train']} train / {r['n_test']} held-out stories, "
          f"{a.iters} iterations, mean of the last {a.pool} positions")
    print("held-out accuracy   " + " ".join(f"{n[:13]:>13}" for n in LABEL_NAMES))
    for i in range(r["acc"].shape[0]):
        print(f"layer {i:<13} " + " ".join(f"{float(v):13.3f}" for v in r["acc"][i]))
    print("majority baseline   " + " ".join(f"{float(v):13.3f}" for v in r["baseline"]))
    emit(layers_json(r["acc"]), a.out)


if __name__ == "__main__":
    cli_main(main)
