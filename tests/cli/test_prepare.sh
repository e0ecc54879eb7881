#!/usr/bin/env bash
# tinylm prepare and training on prepared corpora, end to end: byte-level from standard
# input, SentencePiece BPE from a directory; kill -9 and --resume on token files give
# the same losses; eval prints bits per byte; sample takes a text prompt from the
# checkpoint alone; bad input ends with one line and leaves nothing behind.
# Exit 77 (ctest: Skipped) after the byte-level part where SentencePiece cannot load.
# usage: test_prepare.sh path/to/tinylm scratch-dir
set -u
tinylm=$1; work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
expect_error() {  # name, text the message must contain, command...
  local name=$1 want=$2; shift 2
  local out rc why=""
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -eq 0 ]; then why="exited 0"
  elif [ "$rc" -ge 128 ]; then why="killed by a signal (exit $rc)"
  elif grep -qE "terminate called|Aborted|Segmentation fault|Exception raised from|frame #[0-9]" <<<"$out"; then why="crash or backtrace"
  elif ! grep -qF -- "$want" <<<"$out"; then why="message lacks '$want'"
  elif [ "$(grep -c . <<<"$out")" -ne 1 ]; then why="not one line"
  fi
  if [ -n "$why" ]; then fail "$name: $why: $out"; else echo "ok   $name: $out"; fi
}

gpl=/usr/share/common-licenses/GPL-3
[ -f "$gpl" ] || { echo "SKIP: $gpl is missing"; exit 77; }
mkdir -p texts && cp /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/LGPL-2.1 /usr/share/common-licenses/Apache-2.0 texts/
printf 'caf\xe9\n' > latin1.txt
: > empty.txt

# ---- byte-level, from standard input ---------------------------------------------------
"$tinylm" prepare --data - --tokenizer byte --out bytes < "$gpl" > bytes.log 2>&1 || { cat bytes.log; fail "prepare byte"; }
size=$(stat -c %s "$gpl")
python_sum=$(grep -o '"bytes": [0-9]*' bytes/prepare.json | awk '{s += $2} END {print s}')
[ "$python_sum" = "$size" ] || fail "byte prepare: train + val bytes $python_sum != input $size"
"$tinylm" train --model transformer --task tokens --data bytes --vocab-size 256 --seq-len 32 --d-model 32 \
  --n-heads 4 --n-layers 1 --epochs 1 --steps-per-epoch 30 --eval-batches 2 --out-dir bytes-run > bytes-run.log 2>&1 \
  || { tail -3 bytes-run.log; fail "train on byte tokens"; }
"$tinylm" eval bytes-run --batches 2 > bytes-eval.txt 2>&1 || fail "eval byte tokens"
grep -q "bits per byte (.* nats per token, 1.000 bytes of text per token; byte-level" bytes-eval.txt \
  || fail "byte eval: no bits per byte line: $(cat bytes-eval.txt)"

# ---- bad input: one line, non-zero, nothing written --------------------------------------
expect_error "not UTF-8"      "latin1.txt' is not UTF-8 text: line 1, byte offset 3" "$tinylm" prepare --data latin1.txt --tokenizer byte --out o1
[ -e o1 ] && fail "a failed prepare left o1 behind"
expect_error "empty input"    "the input is empty"          "$tinylm" prepare --data empty.txt --tokenizer byte --out o2
expect_error "device file"    "not a regular file"          "$tinylm" prepare --data /dev/null --tokenizer byte --out o3
expect_error "missing file"   "does not exist"              "$tinylm" prepare --data nope.txt --out o4
expect_error "out not empty"  "already holds files"         "$tinylm" prepare --data "$gpl" --tokenizer byte --out bytes
expect_error "bpe from stdin" "standard input cannot give"  "$tinylm" prepare --data - --out o5
expect_error "text as corpus" "is a file, but task tokens reads a directory" \
  "$tinylm" train --task tokens --data "$gpl" --vocab-size 256 --out-dir e1
expect_error "wrong vocab"    "set vocab-size = 256"        "$tinylm" train --task tokens --data bytes --vocab-size 64 --out-dir e2
cp -r bytes cut && truncate -s -3 cut/train.bin
expect_error "truncated"      "cut/train.bin' is truncated" "$tinylm" train --task tokens --data cut --vocab-size 256 --out-dir e3
mkdir -p foreign && cp bytes/train.bin foreign/ && cp "$gpl" foreign/val.bin
expect_error "foreign file"   "is not a tinylm token file"  "$tinylm" train --task tokens --data foreign --vocab-size 256 --out-dir e4
for d in e1 e2 e3 e4; do [ -e "$d" ] && fail "a refused run left $d behind"; done

# ---- SentencePiece BPE -------------------------------------------------------------------
out=$("$tinylm" prepare --data texts --tokenizer bpe --vocab-size 600 --out bpe 2>&1); rc=$?
if [ "$rc" -ne 0 ] && grep -q "SentencePiece is not available\|SentencePiece module" <<<"$out"; then
  echo "$out"
  echo "SKIP: SentencePiece cannot be loaded in this build ($failures failure(s) in the byte-level part)"
  [ "$failures" -eq 0 ] && exit 77 || exit 1
fi
[ "$rc" -eq 0 ] || { echo "$out"; fail "prepare bpe"; }
grep -q "SentencePiece, 600 pieces" <<<"$out" || fail "prepare bpe: no tokenizer line: $out"
[ -f bpe/tokenizer.model ] || fail "no tokenizer.model"
"$tinylm" prepare --data texts --vocab-size 700 --out bpe700 > /dev/null 2>&1 && cp bpe700/tokenizer.model bigger.model || fail "prepare bpe700"
expect_error "vocab too large" "is too large for this corpus: SentencePiece can make at most" \
  "$tinylm" prepare --data "$gpl" --vocab-size 60000 --out o6
[ -e o6 ] && fail "a failed prepare left o6 behind"
mkdir -p mixed && cp bpe/train.bin mixed/ && cp bytes/val.bin mixed/ && cp bpe/tokenizer.model mixed/
expect_error "mixed corpora"  "were not prepared together"  "$tinylm" train --task tokens --data mixed --vocab-size 600 --out-dir e5

args=(--model transformer --task tokens --data bpe --vocab-size 600 --seq-len 32 --d-model 32 --n-heads 4
      --n-layers 2 --activation gelu --dropout 0.1 --optimizer adamw --lr-schedule cosine --warmup-steps 10 --epochs 2
      --steps-per-epoch 200 --save-every 20 --log-every 1 --eval-every 100 --eval-batches 2 --device cpu)
"$tinylm" train "${args[@]}" --out-dir full > full.log 2>&1 || { tail -3 full.log; fail "bpe run"; }
"$tinylm" train "${args[@]}" --out-dir killed > killed.log 2>&1 &
pid=$!
for _ in $(seq 1 1200); do [ -f killed/step-00000100.ckpt ] && break; sleep 0.05; done
kill -9 "$pid"; wait "$pid"; rc=$?
[ "$rc" -eq 137 ] || fail "the bpe run was not killed mid-way (exit $rc)"
"$tinylm" train --resume killed > resumed.log 2>&1 || { tail -3 resumed.log; fail "resume on token files"; }
losses() { grep '"type":"train"' "$1" | sed 's/,"tokens_per_s".*//'; }
losses full/metrics.jsonl > full.txt; losses killed/metrics.jsonl > resumed.txt
if [ "$(wc -l < full.txt)" -eq 400 ] && diff -q full.txt resumed.txt > /dev/null; then
  echo "ok   kill -9 + resume on token files: 400 per-step losses identical"
else
  fail "losses after resume differ ($(wc -l < full.txt) / $(wc -l < resumed.txt) lines)"
fi

"$tinylm" eval full --batches 4 > eval.txt 2>&1 || fail "eval bpe"
grep -q "bits per byte (.* nats per token, .* bytes of text per token; SentencePiece, 600 pieces)" eval.txt \
  || fail "bpe eval: no bits per byte line: $(cat eval.txt)"
mv bpe bpe.moved  # sampling needs nothing but the checkpoint
"$tinylm" sample full --prompt "This License" --max-new-tokens 12 --seed 1 > sample.txt 2>&1 || fail "sample: $(cat sample.txt)"
head -c 12 sample.txt | grep -q "^This License" || fail "sample does not start with its prompt: $(cat sample.txt)"
[ "$(wc -c < sample.txt)" -gt 20 ] || fail "sample printed too little: $(cat sample.txt)"
echo "ok   sample without the corpus: $(head -n 2 sample.txt | tr '\n' ' ')"
expect_error "eval, corpus moved" "give its path if it moved) (--data PATH)" "$tinylm" eval full --batches 1
"$tinylm" eval full --batches 1 --data bpe.moved > /dev/null 2>&1 || fail "eval --data moved corpus"
# nanoGPT round trip: the export carries no tokenizer; import attaches one
"$tinylm" export full --out model.pt > export.log 2>&1 || fail "export: $(cat export.log)"
"$tinylm" import model.pt --out imported.ckpt --tokenizer bpe.moved/tokenizer.model > import.log 2>&1 || fail "import: $(cat import.log)"
"$tinylm" sample imported.ckpt --prompt "This License" --max-new-tokens 12 --seed 1 > imported.txt 2>&1 || fail "sample imported: $(cat imported.txt)"
cmp -s sample.txt imported.txt && echo "ok   export, import --tokenizer: the same sample" || fail "imported sample differs: $(cat imported.txt)"
expect_error "import, wrong tokenizer" "more than the model's vocabulary" \
  "$tinylm" import model.pt --out imported2.ckpt --tokenizer bigger.model
expect_error "eval, other corpus" "was trained with another tokenizer than the data" "$tinylm" eval full --batches 1 --data bytes

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
