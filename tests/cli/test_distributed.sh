#!/usr/bin/env bash
# Data-parallel training through the CLI (c10d Gloo on loopback):
#  - N processes with per-rank batch B/N train what one process with batch B trains: the
#    same weights after 50 steps (1e-5) and the same logged losses, for the reference
#    model (fused paths) and a 2-layer transformer (plain paths); and 2 x accumulation 2
#    equals 1 x batch 4B. Adam divides each gradient by its own scale, so a parameter
#    whose true gradient is 0 or tiny takes steps of about lr from rounding noise alone,
#    differently in any two runs; the cases avoid that: the reference model on copy (on
#    repeat every key is the same token and its query and key projections get no true
#    gradient), the transformer on repeat (on copy it sits 50 steps on the uniform
#    plateau, ln 64, where the gradient is mostly rounding);
#  - a 2-process run killed with kill -9 (one worker) ends within the timeout with an
#    error naming the rank, keeps its checkpoints, and --resume ends bit-identical to an
#    uninterrupted 2-process run (weights, optimizer, every rank's generators, losses);
#    a stopped (SIGSTOP) worker ends the job within the timeout too, named by rank 0
#    (its heartbeat stopped); a 2-process checkpoint
#    resumes in 1 process, with a warning;
#  - bad launch settings end with one line and a non-zero status, within the timeout; a
#    rank that never comes is named by rank 0 within one timeout;
#  - ranks started with different models or settings (width, layers, seed, learning
#    rate, batch size) all end with the same line naming the setting and both values,
#    before the first step (nothing written).
# With TINYLM_TEST_SMALL=1 (a sanitizer build, CI's CUDA leg) the fault runs are shorter
# (80 steps an epoch instead of 200, a checkpoint every 10 instead of 25): the same checks.
# usage: test_distributed.sh TINYLM TINYLM_TESTS WORK_DIR
set -uo pipefail
tinylm="$1"; tests="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

train() {  # train OUT_DIR [flags...]: a quiet 50-step run
  local out="$1"; shift
  "$tinylm" train --out-dir "$out" --epochs 1 --steps-per-epoch 50 --log-every 1 "$@" > "$out.log" 2>&1 ||
    { fail "train $out $*: status $?"; tail -5 "$out.log"; }
}

same_run() {  # same_run NAME A B: same final weights and the same per-step losses
  local name="$1" a="$2" b="$3"
  if TINYLM_COMPARE_A="$a/step-00000050.ckpt" TINYLM_COMPARE_B="$b/step-00000050.ckpt" \
       "$tests" "[compare-checkpoints]" > "$name.compare" 2>&1; then
    echo "ok   $name: $(grep 'largest weight difference' "$name.compare")"
  else
    fail "$name: weights differ"; grep -E "largest|FAILED|error" "$name.compare"
  fi
  python3 - "$a/metrics.jsonl" "$b/metrics.jsonl" "$name" <<'PY' || failures=$((failures + 1))
import json, sys
def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"type":"train"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(x - y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
ok = worst <= 1e-5
print(("ok  " if ok else "FAIL") + f" {sys.argv[3]}: {len(a)} logged losses, largest difference {worst:.3g}")
sys.exit(0 if ok else 1)
PY
}

# ---- equivalence ------------------------------------------------------------------
train tiny1 --task copy --batch-size 16
train tiny2 --task copy --batch-size 8 --nproc 2
same_run "reference model, fused paths: 2 x 8 vs 1 x 16" tiny1 tiny2
grep -q "global batch 16 = 8 x 2 processes x 1 accumulation" tiny2.log ||
  fail "the log does not state the global batch"

deep=(--task repeat --model transformer --n-layers 2 --d-model 32 --n-heads 4 --optimizer adamw
      --weight-decay 0.1 --no-fused-attention --no-fused-optimizer)
train deep1 "${deep[@]}" --batch-size 16
train deep2 "${deep[@]}" --batch-size 8 --nproc 2
same_run "2-layer transformer, plain paths: 2 x 8 vs 1 x 16" deep1 deep2

train accum1 --task copy --batch-size 16
train accum2 --task copy --batch-size 4 --grad-accum 2 --nproc 2
same_run "2 processes x accumulation 2 x 4 vs 1 x 16" accum1 accum2

# ---- faults and resume ---------------------------------------------------------------
# Dropout on: each rank draws its own masks, so the checkpoint must hold every rank's
# generator for the resumed run to be identical.
epoch=200 save=25                      # steps an epoch; a checkpoint every `save` steps
[ -n "${TINYLM_TEST_SMALL:-}" ] && { epoch=80; save=10; }
ckpt() { printf '%s/step-%08d.ckpt' "$1" "$2"; }  # ckpt RUN STEP
dargs=(--model transformer --d-model 32 --n-heads 4 --n-layers 2 --dropout 0.1
       --optimizer adamw --weight-decay 0.1 --lr-schedule cosine --warmup-steps 20
       --epochs 2 --steps-per-epoch $epoch --save-every $save --log-every 1 --eval-every 100
       --eval-batches 2 --batch-size 8 --nproc 2 --dist-timeout 10)
worker_pid() {  # worker_pid LAUNCHER_PID RANK
  local p
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return; }
  done
}
start_and_hit() {  # start_and_hit OUT SIGNAL: start a run, send SIGNAL to rank 1 half an epoch in
  "$tinylm" train "${dargs[@]}" --out-dir "$1" > "$1.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 1200); do [ -f "$(ckpt "$1" $((epoch / 2)))" ] && break; sleep 0.05; done
  local w; w=$(worker_pid "$launcher" 1)
  [ -n "$w" ] || { fail "$1: no rank-1 worker found"; return 1; }
  # The workers met through a file (FileStore), not a TCP store: nothing answers on the
  # port they were given.
  local port store
  port=$(tr '\0' '\n' < "/proc/$w/environ" | sed -n 's/^MASTER_PORT=//p')
  store=$(tr '\0' '\n' < "/proc/$w/environ" | sed -n 's/^TINYLM_STORE_FILE=//p')
  if [ -z "$store" ]; then fail "$1: the workers were given no store file"
  elif /usr/bin/python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2)" "$port" 2> /dev/null; then
    fail "$1: something listens on the job's port $port"
  else echo "ok   $1: the workers meet through $store; nothing listens on port $port"; fi
  kill "-$2" "$w"
  hit_at=$SECONDS
}
losses() { grep '"type":"train"' "$1" | sed 's/,"tokens_per_s".*//'; }

"$tinylm" train "${dargs[@]}" --out-dir dfull > dfull.log 2>&1 || fail "uninterrupted 2-process run: status $?"
if start_and_hit dkill KILL; then
  wait "$launcher"; rc=$?; took=$((SECONDS - hit_at))
  [ "$rc" -ne 0 ] || fail "kill -9 of rank 1: the job exited 0"
  [ "$took" -le 20 ] || fail "kill -9 of rank 1: the job took $took s to stop (timeout 10 s)"
  grep -q "^error: worker rank 1 was killed by signal 9" dkill.log || fail "kill -9: the launcher did not name rank 1"
  grep -q "^error: rank 0 of 2: the .* failed .*the last good checkpoint is dkill/step-" dkill.log ||
    fail "kill -9: rank 0 did not stop with one line naming the last checkpoint"
  [ -f "$(ckpt dkill $((2 * epoch)))" ] && fail "kill -9: the run finished before it was killed"
  echo "ok   kill -9 of rank 1: stopped in $took s, status $rc:"; grep '^error' dkill.log | sed 's/^/       /'
  for ck in dkill/step-*.ckpt; do
    "$tinylm" eval "$ck" --batches 1 > /dev/null 2>&1 || fail "checkpoint $ck does not load after kill -9"
  done
  "$tinylm" train --resume dkill --nproc 2 --dist-timeout 10 > dresumed.log 2>&1 ||
    { tail -3 dresumed.log; fail "resume of the killed 2-process run failed"; }
  grep -q "resumed from" dresumed.log || fail "the resumed run did not say where it resumed from"
  if TINYLM_COMPARE_A="$(ckpt dfull $((2 * epoch)))" TINYLM_COMPARE_B="$(ckpt dkill $((2 * epoch)))" \
       TINYLM_COMPARE_TOLERANCE=0 "$tests" "[compare-checkpoints]" > dkill.compare 2>&1; then
    echo "ok   kill -9 + --resume: bit-identical to the uninterrupted 2-process run ($(grep -c '^  ' dkill.compare) tensors, optimizer and generators)"
  else
    fail "kill -9 + --resume: the checkpoints differ"; grep -E "largest|FAILED|with expansion" -A2 dkill.compare | head
  fi
  losses dfull/metrics.jsonl > dfull.txt; losses dkill/metrics.jsonl > dkill.txt
  [ "$(wc -l < dfull.txt)" -eq $((2 * epoch)) ] ||
    fail "uninterrupted run logged $(wc -l < dfull.txt) steps, expected $((2 * epoch))"
  diff -q dfull.txt dkill.txt > /dev/null || fail "kill -9 + --resume: the logged losses differ"
fi
# Another number of processes: the 2-process run goes on in 1 process, with a warning.
if "$tinylm" train --resume dfull --epochs 3 > dshrink.log 2>&1 && [ -f "$(ckpt dfull $((3 * epoch)))" ]; then
  grep -q "was trained by 2 process(es), this run has 1: training goes on with a global batch of 8 rows" dshrink.log ||
    fail "resume in 1 process: no warning naming both world sizes"
  echo "ok   a 2-process checkpoint resumed in 1 process: trained on to step $((3 * epoch))"
else
  fail "resuming a 2-process checkpoint in 1 process failed"; tail -3 dshrink.log
fi
if start_and_hit dhang STOP; then
  wait "$launcher"; rc=$?; took=$((SECONDS - hit_at))
  [ "$rc" -ne 0 ] || fail "stopped rank 1: the job exited 0"
  [ "$took" -le 35 ] || fail "stopped rank 1: the job took $took s to stop (timeout 10 s)"
  grep -q "^error: rank 0 of 2: the .* failed (.*): rank 1 has given no sign of life for [0-9]* s (stopped, hung or dead" dhang.log ||
    fail "stopped rank 1: rank 0 did not name rank 1 in one line"
  echo "ok   rank 1 stopped (SIGSTOP): the job ended in $took s, status $rc:"; grep '^error' dhang.log | sed 's/^/       /'
fi
pgrep -f "out-dir dhang" > /dev/null && { fail "workers of the hung job are still running"; pkill -9 -f "out-dir dhang"; }

# ---- bad launches: one line, non-zero, within the timeout --------------------------
refused() {  # refused NAME EXPECTED [env...] -- args...
  local name="$1" expected="$2"; shift 2
  local start=$SECONDS out status
  out="$(env "$@" 2>&1)"; status=$?
  local took=$((SECONDS - start))
  if [ "$status" -eq 0 ]; then fail "$name: exited 0"; return; fi
  if ! grep -qF -- "$expected" <<<"$out"; then fail "$name: no '$expected' in: $out"; return; fi
  if [ "$(grep -c . <<<"$out")" -ne 1 ]; then fail "$name: not one line: $out"; return; fi
  if [ "$took" -gt 30 ]; then fail "$name: took $took s"; return; fi
  echo "ok   $name ($took s): $out"
}
refused "WORLD_SIZE=0" "WORLD_SIZE=0 must be >= 1" \
  WORLD_SIZE=0 RANK=0 "$tinylm" train --out-dir bad1
refused "RANK >= WORLD_SIZE" "RANK=2 must be in [0, WORLD_SIZE=2)" \
  WORLD_SIZE=2 RANK=2 "$tinylm" train --out-dir bad2
refused "--nproc with WORLD_SIZE" "--nproc and a WORLD_SIZE environment variable" \
  WORLD_SIZE=2 RANK=0 "$tinylm" train --nproc 2 --out-dir bad3
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
refused "unreachable store" "could not join the job at 127.0.0.1:$port within 3 s" \
  WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" "$tinylm" train --dist-timeout 3 --out-dir bad4
if ! command -v nvidia-smi > /dev/null; then  # no GPU: NCCL is refused before any worker starts
  if "$tinylm" --version | grep -q "data-parallel: gloo, nccl"; then
    refused "--dist-backend nccl on a CPU model (this build has NCCL)" \
      "the nccl backend moves CUDA tensors, but this rank trains on cpu" \
      "$tinylm" train --nproc 2 --dist-backend nccl --out-dir bad6
  else
    refused "--dist-backend nccl without NCCL" "the nccl backend is not in this build" \
      "$tinylm" train --nproc 2 --dist-backend nccl --out-dir bad6
  fi
fi
refused "--dist-backend mpi" "--dist-backend must be auto, gloo or nccl, got 'mpi'" \
  "$tinylm" train --nproc 2 --dist-backend mpi --out-dir bad7
refused "--nproc 0" "--nproc must be >= 1, got 0" "$tinylm" train --nproc 0 --out-dir bad5
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
refused "a rank that never comes" "rank 1 of 2 never joined the job at 127.0.0.1:$port within 3 s" \
  WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" "$tinylm" train --dist-timeout 3 --out-dir bad8

# ---- ranks started with different settings: every rank ends with the same line ------
disagree() {  # disagree NAME EXPECTED "RANK-0 FLAGS" "RANK-1 FLAGS"
  local name=$1 expected=$2 p0 p1 s0 s1 port start
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  start=$SECONDS
  # shellcheck disable=SC2086
  WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$tinylm" train $3 --epochs 1 --steps-per-epoch 4 \
    --dist-timeout 20 --out-dir "disagree-$name" > "disagree-$name-0.log" 2>&1 & p0=$!
  # shellcheck disable=SC2086
  WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$tinylm" train $4 --epochs 1 --steps-per-epoch 4 \
    --dist-timeout 20 --out-dir "disagree-$name" > "disagree-$name-1.log" 2>&1 & p1=$!
  wait $p0; s0=$?; wait $p1; s1=$?
  for r in 0 1; do
    local log="disagree-$name-$r.log" status=$s0
    [ $r = 1 ] && status=$s1
    if [ "$status" -eq 0 ] || [ "$status" -gt 125 ]; then fail "$name: rank $r ended with status $status"; cat "$log"; continue; fi
    if ! grep -qF -- "$expected" "$log" || [ "$(grep -c '^error:' "$log")" -ne 1 ] || grep -q "terminate\|Exception raised" "$log"; then
      fail "$name: rank $r: $(tail -2 "$log")"; continue
    fi
  done
  [ -e "disagree-$name/step-00000004.ckpt" ] && fail "$name: a checkpoint was written"
  echo "ok   $name ($((SECONDS - start)) s): $(grep '^error:' "disagree-$name-1.log")"
}
disagree "model width" "the ranks of this job disagree on the model: rank 0 has transformer v1" \
  "--model transformer --d-model 32" "--model transformer --d-model 64"
disagree "layers" "disagree on the model" "--model transformer --n-layers 1" "--model transformer --n-layers 2"
disagree "seed" "disagree on seed: rank 0 has 1, rank 1 has 2" "--seed 1" "--seed 2"
disagree "learning rate" "disagree on the optimizer: rank 0 has adam lr=0.005" "--lr 0.005" "--lr 0.01"
disagree "batch size" "disagree on batch-size: rank 0 has 8, rank 1 has 16" "--batch-size 8" "--batch-size 16"

if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all distributed checks passed"
