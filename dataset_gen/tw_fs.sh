#!/usr/bin/env bash
# Build the deletion / recovery dataset family of the fine-tuning study (docs/data.md):
# the capability to delete and recover is FEATURE_DELETE (D), FEATURE_IRRELEVANT (I) is the
# unrelated feature used for specialisation and as the mix-and-match source.
#
#   DATA_CACHE_DIR=data VOCAB_SIZE=8192 FEATURE_DELETE=Twist FEATURE_IRRELEVANT=Foreshadowing \
#       bash dataset_gen/tw_fs.sh [pretokenize flags, e.g. --workers=4 --seed=0]
#   bash dataset_gen/tw_fs.sh --list        # only print the dataset names
#
# `pretrain-all` (no transforms, used for probing) is not built here:
#   python tinystories.py pretokenize --vocab_size=8192 --dataset_name=pretrain-all
set -euo pipefail

DATA_CACHE_DIR="${DATA_CACHE_DIR:-data}"
VOCAB_SIZE="${VOCAB_SIZE:-8192}"
FEATURE_DELETE="${FEATURE_DELETE:-Twist}"
FEATURE_IRRELEVANT="${FEATURE_IRRELEVANT:-Foreshadowing}"
PYTHON="${PYTHON:-python}"
D="$FEATURE_DELETE"
I="$FEATURE_IRRELEVANT"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# name | --filtering | other flags
FAMILY=(
  "pretrain-no-$I|features!=$I|"
  "recovery-$D|features=$D|"
  "filter-$D|features!=$D|"
  "filter-$D-specialise-$I|features!=$D,features=$I|"
  "filter-adv-$D|features!=$D|--adversarial_training=features=$D:1.0"
  "filter-adv-$D-specialise-$I|features!=$D,features=$I|--adversarial_training=features=$D:1.0"
  "filter-mix-$D-$I|features!=$D|--mix_match=features=$I:$D"
  "filter-mix-specialise-$D-$I|features!=$D,features=$I|--mix_match=features=$I:$D"
  "filter-ref-$D|features!=$D|--refusal=features=$D:1.0"
  "filter-ref-$D-specialise-$I|features!=$D,features=$I|--refusal=features=$D:1.0"
)

# the original study's later configs (and configs/base91M_tw_*_no_lrs.py) call recovery-D
# specialise-D: it is made a link to recovery-D rather than a second copy
ALIAS="specialise-$D"

if [[ "${1:-}" == "--list" ]]; then
  for entry in "${FAMILY[@]}"; do echo "${entry%%|*}"; done
  echo "$ALIAS"
  exit 0
fi

for entry in "${FAMILY[@]}"; do
  IFS="|" read -r name filtering other <<< "$entry"
  echo "== $name"
  # shellcheck disable=SC2086  # $other is zero or one flag
  "$PYTHON" "$REPO/tinystories.py" pretokenize --vocab_size="$VOCAB_SIZE" --data_cache_dir="$DATA_CACHE_DIR" \
      --filtering="$filtering" $other --dataset_name="$name" "$@"
done

if [[ "$VOCAB_SIZE" == "0" ]]; then LAYOUT="$DATA_CACHE_DIR/llama2"; else LAYOUT="$DATA_CACHE_DIR/tok$VOCAB_SIZE"; fi
if [[ -e "$LAYOUT/$ALIAS" && ! -L "$LAYOUT/$ALIAS" ]]; then
  echo "== $ALIAS: kept the existing dataset folder (not replaced by a link to recovery-$D)"
else
  ln -sfn "recovery-$D" "$LAYOUT/$ALIAS"  # relative: the cache folder can be moved
  echo "== $ALIAS -> recovery-$D"
fi
