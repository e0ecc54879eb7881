#!/usr/bin/env bash
# tinylm export -> nanoGPT: a model trained by tinylm (exact GELU), exported, loads into
# nanoGPT's GPT (tests/python/nanogpt_parity.py) with strict=True and gives the same
# logits within 1e-5. Needs Debian's python3-torch (exit 77 = skipped where absent).
# usage: test_nanogpt.sh TINYLM TINYLM_TESTS SOURCE_DIR WORK_DIR
set -u
tinylm=$1 tests=$2 src=$3 work=$4
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "SKIPPED: python3-torch is not installed"; exit 77; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
"$tinylm" train --model transformer --activation gelu --n-layers 2 --d-model 32 --n-heads 4 \
  --task copy --epochs 1 --steps-per-epoch 40 --out-dir run > train.log 2>&1 || { tail -3 train.log; exit 1; }
"$tinylm" export run --out model.pt > export.log 2>&1 || { cat export.log; exit 1; }
TINYLM_EXPORT_CKPT=run TINYLM_LOGITS_OUT=logits.pt "$tests" "[nanogpt-logits]" > logits.log 2>&1 ||
  { cat logits.log; exit 1; }
/usr/bin/python3 "$src/tests/python/nanogpt_parity.py" model.pt logits.pt || exit 1
# The default MLP (tanh GELU) exports with a note.
"$tinylm" train --model transformer --task copy --epochs 1 --steps-per-epoch 5 --out-dir tanh > /dev/null 2>&1 || exit 1
"$tinylm" export tanh --out tanh.pt > tanh.log 2>&1 || { cat tanh.log; exit 1; }
grep -q "note: its MLP uses tanh-approximated GELU" tanh.log || { echo "FAIL: no note for tanh GELU"; cat tanh.log; exit 1; }
echo "ok   the default (tanh GELU) model exports with a note"
