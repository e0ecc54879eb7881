#!/usr/bin/env bash
# kill -9 in the middle of training, then --resume: the per-step losses of the resumed
# run equal the uninterrupted run's exactly (CPU). SIGTERM saves and exits cleanly.
# usage: test_kill_resume.sh path/to/tinylm scratch-dir
set -u
tinylm=$1
work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

args=(--model transformer --d-model 32 --n-heads 4 --n-layers 2 --dropout 0.1
      --optimizer adamw --weight-decay 0.1 --lr-schedule cosine --warmup-steps 20
      --epochs 2 --steps-per-epoch 300 --save-every 25 --log-every 1 --eval-every 150
      --eval-batches 2 --device cpu)

"$tinylm" train "${args[@]}" --out-dir full > full.log 2>&1 || fail "uninterrupted run failed"

"$tinylm" train "${args[@]}" --out-dir killed > killed.log 2>&1 &
pid=$!
for _ in $(seq 1 1200); do [ -f killed/step-00000100.ckpt ] && break; sleep 0.05; done
kill -9 "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 137 ] || fail "the run was not killed mid-way (exit $rc)"
[ -f killed/step-00000600.ckpt ] && fail "the run finished before it was killed"
for ck in killed/step-*.ckpt; do
  "$tinylm" eval "$ck" --batches 1 > /dev/null 2>&1 || fail "checkpoint $ck does not load after kill -9"
done
echo "killed at: $(ls killed | grep -c 'step-') checkpoint(s) kept, newest $(ls killed/step-*.ckpt | tail -n 1)"

"$tinylm" train --resume killed > resumed.log 2>&1 || { cat resumed.log; fail "resume failed"; }
grep -q "resumed from" resumed.log || fail "resume did not say where it resumed from"

losses() { grep '"type":"train"' "$1" | sed 's/,"tokens_per_s".*//'; }
losses full/metrics.jsonl > full.txt
losses killed/metrics.jsonl > resumed.txt
[ "$(wc -l < full.txt)" -eq 600 ] || fail "uninterrupted run logged $(wc -l < full.txt) steps, expected 600"
if ! diff -q full.txt resumed.txt > /dev/null; then
  diff full.txt resumed.txt | head -n 6
  fail "losses after resume differ from the uninterrupted run"
fi
echo "ok: 600 per-step losses identical; final $(tail -n 1 resumed.txt)"

# SIGTERM: saves a checkpoint of the current step and exits with 130.
"$tinylm" train "${args[@]}" --out-dir term > term.log 2>&1 &
pid=$!
for _ in $(seq 1 1200); do [ -f term/step-00000050.ckpt ] && break; sleep 0.05; done
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 130 ] || { cat term.log | tail -n 5; fail "SIGTERM: exit $rc, expected 130"; }
grep -q "stopped by signal" term.log || fail "SIGTERM: no message"
newest=$(ls term/step-*.ckpt | tail -n 1)
step=$(grep -o 'stopped by signal at step [0-9]*' term.log | grep -o '[0-9]*$')
[ "$newest" = "$(printf 'term/step-%08d.ckpt' "$step")" ] || fail "SIGTERM: newest checkpoint $newest is not step $step"
"$tinylm" train --resume term > term-resumed.log 2>&1 || fail "resume after SIGTERM failed"
losses term/metrics.jsonl > term.txt
diff -q full.txt term.txt > /dev/null || fail "losses after SIGTERM + resume differ"
echo "ok: SIGTERM at step $step saved $newest; resumed run identical"
