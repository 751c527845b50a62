"""TinyStories data commands: download, synthesize, train_vocab, pretokenize.

    python tinystories.py download    [--data_cache_dir=data]            # real TinyStories (1.6 GB)
    python tinystories.py synthesize  [--num_shards=10] [--stories_per_shard=4000] [--seed=0]
    python tinystories.py train_vocab --vocab_size=1024 [--vocab_shards=10] [--keep_text] [--force]
    python tinystories.py pretokenize --vocab_size=1024 [--filtering=...] [--mix_match=...]
        [--adversarial_training=...] [--refusal=...] [--instruction_subset=...]
        [--dataset_name=NAME] [--seed=0] [--workers=N] [--tokenizer_model=PATH] [--compat=original]
        (one flag per data transform, tinylab/data/transforms/)

Layout under --data_cache_dir:
    TinyStories_all_data/dataNN.json      raw shards (download or synthesize)
    tok{V}.model, tok{V}.vocab            tokenizer from train_vocab (without one: tokenizers/tok{V}.model,
                                          e.g. the study's released tok8192, which ships)
    tok{V}/{dataset_name}/dataNN.bin      uint16 tokens, BOS before each example, + manifest.json
    llama2/{dataset_name}/                the same for --vocab_size=0 (the Llama 2 tokenizers/tokenizer.model)

Everything written is atomic: files go to a temp name and are renamed, dataset and raw folders
are built in a hidden temp folder and renamed when complete, so an interrupted command never
leaves something that looks finished. Bad input is one `error: ...` line and exit 2, before any
work starts.
"""
import argparse
import contextlib
import io
import sys

from tinylab.core.compat import COMPAT, apply_compat
from tinylab.core.config import ArgParser
from tinylab.core.errors import UserError, cli_main
from tinylab.data.dataset_spec import parse_spec
from tinylab.data.download import DATA_URL, download
from tinylab.data.pretokenize import pretokenize
from tinylab.data.synthesize import synthesize
from tinylab.data.transforms import TRANSFORMS
from tinylab.data.transforms.mix_match_pairs import MIX_MATCH_PAIRS
from tinylab.data.vocab import train_vocab
from tinylab.data.workers import default_workers

STAGE_FLAGS = {  # which options each stage reads; any other option given is a mistake
    "download": {"data_cache_dir", "data_url"},
    "synthesize": {"data_cache_dir", "num_shards", "stories_per_shard", "seed", "workers", "force"},
    "train_vocab": {"data_cache_dir", "vocab_size", "vocab_shards", "keep_text", "seed", "force"},
    "pretokenize": {"data_cache_dir", "vocab_size", "tokenizer_model", *TRANSFORMS.names(), "dataset_name", "seed",
                    "workers", "force", "compat"},
}


def build_parser():
    p = ArgParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=list(STAGE_FLAGS))
    p.add_argument("--data_cache_dir", default="data", help="where raw shards, tokenizers and datasets live")
    p.add_argument("--vocab_size", type=int, default=0,
                   help="tokenizer size; 0 = the Llama 2 tokenizer (shipped: tokenizers/tokenizer.model)")
    p.add_input("--tokenizer_model", default=None, help="explicit tokenizer .model (default: <data_cache_dir>/tok{V}.model, else tokenizers/)")
    for transform in TRANSFORMS:
        p.add_argument(f"--{transform.flag}", default=None, help=transform.help)
    # names the output folder <data_cache_dir>/tok{V}/<name>, which pretokenize guards (outputs.py)
    p.add_output("--dataset_name", default=None, help="output folder name (default: the spec string); an existing "
                 "dataset is moved aside only with --force")
    p.add_argument("--compat", default=COMPAT.default, choices=COMPAT.choices, help="pretokenize: original = the "
                   "study's tinystories.py where docs/originals.md lists a difference (--mix_match_pairs)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (per shard)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--data_url", default=DATA_URL, help="archive URL for download")
    p.add_argument("--vocab_shards", type=int, default=10, help="train_vocab: how many leading raw shards to read")
    p.add_argument("--keep_text", action="store_true", help="train_vocab: keep the training text as tiny.txt")
    p.add_argument("--force", action="store_true", help="train_vocab: replace an existing tokenizer; pretokenize / "
                   "synthesize: move an existing dataset / corpus aside to <folder>.previous-<time>")
    p.add_argument("--num_shards", type=int, default=10, help="synthesize: shards (shard 0 is the test split)")
    p.add_argument("--stories_per_shard", type=int, default=4000, help="synthesize: stories per shard")
    return p


def study_compat(compat, options) -> dict:
    """The transform flags after --compat: with `original`, --mix_match_pairs=original when
    --mix_match is given and --mix_match_pairs is not (the study's one difference here)."""
    parse_spec(**options)  # every flag valid before the rule between two of them
    if options["mix_match_pairs"] is not None and options["mix_match"] is None:
        raise UserError("--mix_match_pairs=original changes how --mix_match relabels: give --mix_match too")
    cfg = {"compat": compat}
    if options["mix_match"] is not None:  # otherwise nothing to change, and no name part for it
        cfg[MIX_MATCH_PAIRS.name] = options["mix_match_pairs"] or MIX_MATCH_PAIRS.default
    cfg = apply_compat(cfg, {MIX_MATCH_PAIRS.name: MIX_MATCH_PAIRS.default}, "study")
    return {**options, "mix_match_pairs": cfg.get(MIX_MATCH_PAIRS.name) or None}


def pretokenize_stage(args):
    notice = io.StringIO()  # compat's notice, once the stage has run: an error stays one line
    with contextlib.redirect_stderr(notice):
        options = study_compat(args.compat, {flag: getattr(args, flag) for flag in TRANSFORMS.names()})
    pretokenize(args.data_cache_dir, args.vocab_size, parse_spec(**options), args.dataset_name, args.seed,
                args.workers, args.tokenizer_model, args.force)
    sys.stderr.write(notice.getvalue())


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    stray = [k for k, v in vars(args).items()
             if k != "stage" and k not in STAGE_FLAGS[args.stage] and v != parser.get_default(k)]
    if stray:
        raise UserError(f"--{stray[0]} does not apply to {args.stage}")
    if args.stage == "download":
        download(args.data_cache_dir, args.data_url)
    elif args.stage == "synthesize":
        synthesize(args.data_cache_dir, args.num_shards, args.stories_per_shard, args.seed,
                   args.workers or default_workers(), args.force)
    elif args.stage == "train_vocab":
        train_vocab(args.data_cache_dir, args.vocab_size, args.vocab_shards, args.seed, args.keep_text, args.force)
    else:
        pretokenize_stage(args)


if __name__ == "__main__":
    cli_main(main)
