#!/usr/bin/env bash
# Nothing lost, nothing hangs: the real binary against the faults of issue 7. Every case
# is bounded by a timeout; a bad input must end with exit 1..125 and one line naming the
# problem; the earlier run's files must be byte-identical afterwards.
# usage: test_cli_safety.sh path/to/tinylm scratch-dir
set -u
tinylm=$1
work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
limit=60  # seconds any one command may take

fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# name, text the one line must contain, command... (exit 1..125, exactly one line, no crash)
expect_one_line_error() {
  local name=$1 want=$2
  shift 2
  local out rc
  out=$(timeout "$limit" "$@" 2>&1)
  rc=$?
  local why=""
  if [ "$rc" -eq 0 ]; then why="exited 0"
  elif [ "$rc" -eq 124 ]; then why="hung (killed after ${limit}s)"
  elif [ "$rc" -gt 125 ]; then why="killed by a signal (exit $rc)"
  elif grep -qE "terminate called|Aborted|Segmentation fault|Exception raised from|frame #[0-9]" <<<"$out"; then why="crash or backtrace"
  elif ! grep -qF -- "$want" <<<"$out"; then why="message lacks '$want'"
  elif [ "$(grep -c . <<<"$out")" -ne 1 ]; then why="$(grep -c . <<<"$out") lines, expected one"
  fi
  if [ -n "$why" ]; then
    fail "$name: $why"
    sed 's/^/     | /' <<<"$out" | head -n 8
  else
    echo "ok   $name: $out"
  fi
}

digest() { (cd "$1" && find . -type f ! -name .tinylm.lock -print0 | sort -z | xargs -0 md5sum); }

quick=(--steps-per-epoch 4 --log-every 100 --eval-batches 1)
timeout "$limit" "$tinylm" train "${quick[@]}" --out-dir earlier > earlier.log 2>&1 || { echo "FAIL setup"; cat earlier.log; exit 1; }
before=$(digest earlier)

# ---- data loss ---------------------------------------------------------------------
expect_one_line_error "out-dir holds another run" "already holds a run" \
  "$tinylm" train "${quick[@]}" --out-dir earlier
[ "$(digest earlier)" = "$before" ] || fail "the earlier run's files changed"

# Two trainers on one directory: the second fails at once and names the first's pid.
timeout "$limit" "$tinylm" train --steps-per-epoch 100000 --log-every 100000 --out-dir busy > busy.log 2>&1 &
busy_job=$!
for _ in $(seq 1 200); do [ -s busy/.tinylm.lock ] && break; sleep 0.05; done
busy=$(tr -d "\n" < busy/.tinylm.lock)
expect_one_line_error "second trainer, same out-dir" "in use by another training process (pid $busy)" \
  "$tinylm" train "${quick[@]}" --out-dir busy
kill -TERM "$busy_job"; wait "$busy_job"
[ "$(grep -c '"type":"train"' busy/metrics.jsonl)" -le 1 ] || fail "two runs wrote into one metrics.jsonl"

# --resume of a copied run directory writes into the copy, never into the original.
cp -r earlier copy
timeout "$limit" "$tinylm" train --resume copy --epochs 4 > copy.log 2>&1 || { fail "resume of a copy"; tail -n 3 copy.log; }
[ -f copy/step-00000016.ckpt ] || fail "the resumed copy has no step-16 checkpoint"
[ "$(digest earlier)" = "$before" ] || fail "resuming a copy changed the original run"
# Resuming from an earlier step into the same directory would overwrite later steps.
expect_one_line_error "resume behind newer checkpoints" "past the step 8 being resumed" \
  "$tinylm" train --resume copy/step-00000008.ckpt --epochs 4
expect_one_line_error "overwrite the resumed run" "--overwrite would delete the run being resumed" \
  "$tinylm" train --resume copy --epochs 5 --overwrite
# --overwrite replaces an earlier run on purpose.
cp -r earlier replaced
timeout "$limit" "$tinylm" train "${quick[@]}" --seed 7 --out-dir replaced --overwrite > /dev/null 2>&1 || fail "--overwrite failed"
[ "$(grep -c '"type":"train"' replaced/metrics.jsonl)" -eq 1 ] || fail "--overwrite kept the old metrics"

# Divergence: no checkpoint that is written holds NaN, and the error says what is good.
out=$(timeout "$limit" "$tinylm" train --lr 1e300 --epochs 1 --steps-per-epoch 20 --save-every 1 --out-dir diverged 2>&1)
rc=$?
[ "$rc" -ge 1 ] && [ "$rc" -le 125 ] || fail "lr 1e300: exit $rc"
grep -qE "holds NaN or infinite values|the loss became" <<<"$out" || fail "lr 1e300: no divergence message"
for ck in diverged/*.ckpt; do
  [ -e "$ck" ] || continue
  timeout "$limit" "$tinylm" eval "$ck" --batches 1 > /dev/null 2>&1 || fail "lr 1e300 left an unusable checkpoint $ck"
done
expect_one_line_error "weight-decay inf" "weight-decay must be a finite number" \
  "$tinylm" train --optimizer adamw --weight-decay inf --out-dir never

# A partial checkpoint left by kill -9 is removed when the run is resumed.
cp -r earlier killed
echo "half" > killed/step-00000016.ckpt.tmp.99999
timeout "$limit" "$tinylm" train --resume killed --epochs 4 > killed.log 2>&1 || fail "resume after a partial file"
ls killed | grep -q '\.tmp\.' && fail "a partial checkpoint is still there: $(ls killed)"

# ---- hangs and kills ------------------------------------------------------------------
expect_one_line_error "batch-size 1e9"     "batch-size 1000000000 needs about" "$tinylm" train --batch-size 1e9 --out-dir never
expect_one_line_error "seq-len 1e9"        "seq-len 1000000000 needs about" "$tinylm" train --seq-len 1e9 --out-dir never
expect_one_line_error "context-length 1e9" "context-length 1000000000 needs about" "$tinylm" train --model transformer --context-length 1e9 --out-dir never
expect_one_line_error "n-layers 1e9"       "n-layers 1000000000 needs about" "$tinylm" train --model transformer --n-layers 1e9 --out-dir never
expect_one_line_error "eval batch-size 1e9" "batch-size 1000000000 needs about" "$tinylm" eval earlier --batch-size 1e9
expect_one_line_error "train threads 100000" "threads 100000 is more than" "$tinylm" train --threads 100000 --out-dir never
expect_one_line_error "eval threads 100000"  "threads 100000 is more than" "$tinylm" eval earlier --threads 100000
mkfifo fifo.ckpt
expect_one_line_error "FIFO as checkpoint"  "is a FIFO (named pipe), not a regular file" "$tinylm" eval fifo.ckpt
expect_one_line_error "FIFO as config"      "is a FIFO (named pipe), not a regular file" "$tinylm" train --config fifo.ckpt
expect_one_line_error "/dev/zero as data"   "is a character device, not a regular file" \
  "$tinylm" train --task text --vocab-size 256 --data /dev/zero --out-dir never
[ -e never ] && fail "a refused run created its out-dir"

# ---- accepted bad input -----------------------------------------------------------------
expect_one_line_error "top-k -1"            "--top-k must be >= 0" "$tinylm" sample earlier --prompt 1 --top-k -1
expect_one_line_error "eval threads -1"     "--threads must be >= 0" "$tinylm" eval earlier --threads -1
mkdir -p adir
expect_one_line_error "config is a directory" "is a directory, not a regular file" "$tinylm" train --config adir
expect_one_line_error "epochs x steps overflow" "overflows the step counter" \
  "$tinylm" train --epochs 4611686018427387904 --steps-per-epoch 4
printf '"a\\nb\\u001b[31m" = 1\n' > control.toml
expect_one_line_error "control characters in a key" "unknown key 'a\\x0Ab\\x1B[31m'" "$tinylm" train --config control.toml
out=$(timeout "$limit" "$tinylm" sample earlier --prompt 5 --temperature 1e-300 --max-new-tokens 4 2>&1)
[ $? -eq 0 ] && grep -qE '^5( [0-9]+){4}$' <<<"$out" || { fail "temperature 1e-300: $out"; }

# ---- out-dir problems: the first and only line ------------------------------------------
echo x > afile
expect_one_line_error "out-dir is a file"   "exists and is not a directory" "$tinylm" train --out-dir afile
expect_one_line_error "out-dir under a file" "cannot create out-dir" "$tinylm" train --out-dir afile/sub
expect_one_line_error "out-dir name too long" "File name too long" "$tinylm" train --out-dir "$(printf 'x%.0s' $(seq 1 300))"
# A read-only file system: a tmpfs mounted read-only (needs root; said when not possible).
mkdir -p ro
if mount -t tmpfs -o ro tmpfs ro 2> /dev/null; then
  expect_one_line_error "out-dir on a read-only fs" "cannot create out-dir 'ro/run': Read-only file system" \
    "$tinylm" train --out-dir ro/run
  umount ro
else
  echo "NOT RUN out-dir on a read-only fs: cannot mount a tmpfs here (not root)"
fi
expect_one_line_error "out-dir under /proc" "cannot create out-dir '/proc/tinylm-test'" "$tinylm" train --out-dir /proc/tinylm-test

# Generated bytes and a terminal: a byte-level model's output holds its prompt, so a prompt
# with escape sequences stands for a crafted checkpoint's. On a terminal (script(1) gives
# sample one) they are shown as \xNN, newlines kept; a pipe, or --raw, gets the bytes.
for i in $(seq 1 40); do echo "the quick brown fox jumps over the lazy dog $i"; done > fox.txt
if timeout "$limit" "$tinylm" train --task text --vocab-size 256 --data fox.txt --seq-len 16 --epochs 1 \
     --steps-per-epoch 2 --out-dir textrun > textrun.log 2>&1; then
  prompt=$'red \e[31m\e]0;pwned\a two\nlines'
  timeout "$limit" "$tinylm" sample textrun --prompt "$prompt" --max-new-tokens 0 > piped.out 2> piped.err
  cmp -s piped.out <(printf '%s\n' "$prompt") || fail "sample to a pipe changed the bytes: $(od -c piped.out | head -3)"
  if command -v script > /dev/null; then
    # script(1) runs the command with $SHELL, which may be a POSIX sh: the command reads
    # the binary and the prompt from the environment rather than from quoting.
    TINYLM_BIN=$tinylm PROMPT=$prompt timeout "$limit" script -qec \
      '"$TINYLM_BIN" sample textrun --prompt "$PROMPT" --max-new-tokens 0 2> /dev/null' /dev/null > tty.out 2>&1
    grep -q $'\e' tty.out && fail "sample wrote an escape byte to a terminal: $(od -c tty.out | head -3)"
    grep -qF 'red \x1B[31m\x1B]0;pwned\x07 two' tty.out || fail "sample on a terminal: $(cat -v tty.out)"
    grep -q '^lines' tty.out || fail "sample on a terminal lost its newline: $(cat -v tty.out)"
    TINYLM_BIN=$tinylm PROMPT=$prompt timeout "$limit" script -qec \
      '"$TINYLM_BIN" sample textrun --prompt "$PROMPT" --max-new-tokens 0 --raw 2> /dev/null' /dev/null > raw.out 2>&1
    grep -q $'\e\\[31m' raw.out || fail "sample --raw on a terminal escaped the bytes: $(cat -v raw.out)"
  else
    echo "NOT RUN sample on a terminal: no script(1) here"
  fi
else
  cat textrun.log
  fail "training a byte-level model for the sample case"
fi

[ "$(digest earlier)" = "$before" ] || fail "the earlier run's files changed"
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
