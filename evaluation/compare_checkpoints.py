"""Where did fine-tuning change the model? Relative weight change per tensor and linear CKA of the
hidden states per layer between two or more checkpoints of one shape (docs/evaluation.md).

    python evaluation/compare_checkpoints.py out/dr/runs/pretrain out/dr/runs/delete out/dr/runs/recover
    python evaluation/compare_checkpoints.py A.pt B.pt --prompts=prompts.txt --out=cmp.json --plot=cmp.png

Checkpoints are ckpt.pt files, their run folders, or Hugging Face Llama folders. Each pair (by
default each consecutive pair and each checkpoint against the first; --pairs=0:1,0:3 chooses)
gets, for every tensor of model.py (attention wq/wk/wv/wo, feed_forward w1/w2/w3, the norms, the
embedding), ||W_b - W_a|| / ||W_a||, and for the embedding output and every block's output the
linear CKA (Kornblith et al. 2019) over all real tokens of the same prompts: --num_prompts test
examples of a pretokenized --dataset of the first checkpoint's data cache (seeded choice; the
dataset it was trained on by default), or the lines of --prompts FILE, encoded with the first
checkpoint's tokenizer (BOS first) and cut to the smallest max_seq_len.
Printed: a table per pair; --plot=PNG draws the heat maps. Last stdout line (and --out):
{"checkpoints": [{"label", "path", "iter_num"}], "prompts": {"source", "n"}, "shape", "tokens",
 "pairs": [{"a", "b", "a_index", "b_index", "whole_model", "weights": [{"param", "row", "module",
 "rel_change"}], "cka": [{"state", "cka"}]}]}.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinylab.core.errors import UserError, cli_main
from tinylab.eval import compare
from tinylab.eval.common import cache_dir_of, emit, is_hf_dir, layout_vocab, load_model, model_tokenizer, read_rows
from tinylab.schema import COMPARE


def default_label(path: str) -> str:
    """out/runs/delete or out/runs/delete/ckpt.pt -> delete; out/x/step100.pt -> step100."""
    path = os.path.normpath(path)
    if os.path.basename(path) == "ckpt.pt":
        path = os.path.dirname(path)
    name = os.path.basename(os.path.abspath(path))
    return name[:-3] if name.endswith(".pt") else name


def labels_for(paths, given):
    if given and len(given) != len(paths):
        raise UserError(f"--labels names {len(given)} checkpoints, but {len(paths)} are compared")
    labels = given or [default_label(p) for p in paths]
    return labels if len(set(labels)) == len(labels) else [os.path.normpath(p) for p in paths]


def prompt_sequences(a, ckpt, tok, max_len):
    """(token id lists, a description of where they came from)."""
    if a.prompts:
        texts = [t.rstrip("\n") for t in read_rows(a.prompts)]
        texts = [t for t in texts if t.strip()][:a.num_prompts]
        if not texts:
            raise UserError(f"--prompts={a.prompts} holds no prompt (no non-empty line)")
        return [ids[:max_len] for ids in tok.encode_batch(texts, bos=True)], f"file {a.prompts}"
    from tinylab.data.pretokenized import check_dataset, dataset_dir
    from tinylab.eval.probes import story_examples
    name = a.dataset or ckpt.get("config", {}).get("dataset_name")
    if not name:
        raise UserError(f"{a.checkpoints[0]} names no training dataset; pass --dataset=NAME or --prompts=FILE")
    cache, vocab = cache_dir_of(ckpt, a.data_cache_dir), layout_vocab(ckpt, tok)
    check_dataset(cache, vocab, name, tok.model_path)
    examples = story_examples(dataset_dir(cache, vocab, name), "test", a.num_prompts, a.seed, tok, max_len,
                              header=not a.story_only)
    if not examples:
        raise UserError(f"the test split of {dataset_dir(cache, vocab, name)} has no examples")
    what = "stories" if a.story_only else "examples"
    return [ids for ids, _ in examples], f"{len(examples)} test {what} of {name} (seed {a.seed})"


def main(argv=None):
    parser = COMPARE.argparser(__doc__.split("\n\n")[0])
    parser.add_input("checkpoints", nargs="*", metavar="CHECKPOINT",
                        help="two or more: ckpt.pt files, run folders or Hugging Face Llama folders")
    a = COMPARE.parse_args(argv, parser)
    paths = a.checkpoints
    if len(paths) < 2:
        raise UserError(f"compare needs at least two checkpoints, got {len(paths)} "
                        f"(python {COMPARE.prog} A B [C ...])")
    pairs = compare.parse_pairs(a.pairs, len(paths))
    labels = labels_for(paths, a.labels)
    # every check before the work: the outputs (the guard, when the flags were parsed), then every
    # input exists, then the shapes
    if a.out and a.plot and os.path.abspath(a.out) == os.path.abspath(a.plot):
        raise UserError(f"--out and --plot name the same file {a.out}")
    for p in paths:
        if not (is_hf_dir(p) or os.path.isfile(p) or os.path.isfile(os.path.join(p, "ckpt.pt"))):
            raise UserError(f"checkpoint not found: {p}" + (" (a folder without ckpt.pt)" if os.path.isdir(p) else ""))
    loaded = [load_model(p, a.device, a.dtype) for p in paths]
    models = [m for m, _ in loaded]
    compare.check_same_shape(models, paths)
    ckpt0 = loaded[0][1]
    tok = model_tokenizer(ckpt0, models[0], paths[0], a.tokenizer_model, a.data_cache_dir)
    max_len = min(m.params.max_seq_len for m in models)
    sequences, source = prompt_sequences(a, ckpt0, tok, max_len)

    result = compare.compare(models, labels, sequences, pairs, a.batch_size)
    n_layers, tied = models[0].params.n_layers, models[0].params.tie_embeddings
    result = {"checkpoints": [{"label": label, "path": p, "iter_num": ck.get("iter_num")}
                              for label, p, (_, ck) in zip(labels, paths, loaded)],
              "prompts": {"source": source, "n": len(sequences)}, **result}
    print(f"{len(paths)} checkpoints ({result['shape']}); prompts: {source}, {result['tokens']} tokens")
    print(compare.format_table(result, n_layers, tied))
    if a.plot:
        compare.plot(result, n_layers, tied, a.plot)
        print(f"wrote {a.plot}")
    emit(result, a.out)


if __name__ == "__main__":
    cli_main(main)
