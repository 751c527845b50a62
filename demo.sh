#!/usr/bin/env bash
# The README Quickstart's main job, end to end on the built-in procedural corpus (no download):
# synthesize raw shards -> train a 512-piece tokenizer -> pretokenize -> train a tiny model on the
# CPU -> sample a story for an instruction header. Extra arguments go to train.py, e.g.
#   bash demo.sh --max_iters=100
# DEMO_SHARDS / DEMO_STORIES shrink the corpus and DEMO_SAMPLE_TOKENS the sampled story (the test
# of this script uses small ones).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
DATA=${DATA:-data/demo}
OUT=${OUT:-out/demo}

$PY tinystories.py synthesize --data_cache_dir="$DATA" --num_shards="${DEMO_SHARDS:-8}" --stories_per_shard="${DEMO_STORIES:-3000}"
# a re-run keeps the corpus (synthesize: the same one is already there), the tokenizer it made the
# first time (train_vocab never replaces one without --force) ...
[ -f "$DATA/tok512.model" ] || $PY tinystories.py train_vocab --data_cache_dir="$DATA" --vocab_size=512
# ... and the dataset it built (pretokenize never replaces one without --force)
[ -f "$DATA/tok512/F_none_MM_none_AT_none_RF_none_IS_none/manifest.json" ] || \
    $PY tinystories.py pretokenize --data_cache_dir="$DATA" --vocab_size=512
# --overwrite=True: a re-run moves the previous demo run aside to $OUT.previous-<time> (never deletes it)
$PY train.py configs/tiny_demo.py --data_cache_dir="$DATA" --out_dir="$OUT" --overwrite=True "$@"
echo
echo "=== a story sampled from $OUT/ckpt.pt ==="
$PY sample.py --checkpoint="$OUT/ckpt.pt" --temperature=0.8 --top_k=40 --max_new_tokens="${DEMO_SAMPLE_TOKENS:-220}" \
    --start='Words: fix, lamp, plain\nFeatures: Dialogue, Twist\nStory:'
