#!/usr/bin/env bash
# The fortunes run end to end: installs Debian's `fortunes` package (English text,
# 2.6 MB), prepares it once into data/fortunes (a 2048-piece SentencePiece BPE model and
# token files), trains configs/fortunes.toml, evaluates the best checkpoint (nats per
# token and bits per byte) and samples from it.
#   scripts/fortunes.sh [tinylm train flags, e.g. --out-dir runs/fortunes-2]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --fortunes
cmake --preset release > /dev/null
cmake --build --preset release
tinylm=build/release/tinylm
if [ ! -f data/fortunes/prepare.json ]; then
  $tinylm prepare --data /usr/share/games/fortunes --tokenizer bpe --vocab-size 2048 --out data/fortunes
fi
$tinylm train --config configs/fortunes.toml "$@"
out=$($tinylm train --config configs/fortunes.toml "$@" --print-config | sed -n 's/^out-dir = "\(.*\)"$/\1/p')
$tinylm eval "$out/best.ckpt" --batches 100
for prompt in "The" "A computer" "Love is"; do
  echo "--- $prompt"
  $tinylm sample "$out/best.ckpt" --prompt "$prompt" --max-new-tokens 60 --temperature 0.8 --top-k 40 --seed 1
done
