#!/usr/bin/env bash
# ONNX export against tinylm's logits: tinylm writes models of each kind and option with
# the logits it gives and its greedy tokens ("[onnx-export]"); tests/python/onnx_export.py
# runs ONNX's checker and evaluates each graph, the KV-cache graphs a token at a time (and
# runs ONNX Runtime where Debian packages it: Debian 13). Then through the command line:
# a trained run of each kind exported with --kv-cache generates greedily what
# `tinylm sample --greedy` prints, past the context, in Python (the graph evaluated node by
# node, and ONNX Runtime) and in ONNX Runtime's C++ API (ORT_GENERATE: tests/onnx/
# ort_generate.cpp, built where Debian packages libonnxruntime-dev; "none" elsewhere).
# Needs Debian's python3-onnx and python3-torch (exit 77 = skipped where absent).
# usage: test_onnx_export.sh TINYLM_TESTS TINYLM ORT_GENERATE SOURCE_DIR WORK_DIR
set -u
tests=$1 tinylm=$2 ort=$3 src=$4 work=$5
fail() { echo "FAIL: $*"; exit 1; }
debian=$(. /etc/os-release 2>/dev/null; echo "${VERSION_ID:-0}" | cut -d. -f1)
if [ "$ort" = none ] && [ "${debian:-0}" -ge 13 ]; then
  fail "ONNX Runtime's C++ API was not found when this build was configured, and Debian $debian packages it: \
run scripts/setup.sh --test (libonnxruntime-dev), then configure again"
fi
for module in onnx torch; do
  /usr/bin/python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('$module') is None)" 2>/dev/null ||
    { echo "SKIPPED: python3-$module is not installed (scripts/setup.sh installs it)"; exit 77; }
done
rm -rf "$work" && mkdir -p "$work/graphs" && cd "$work" || exit 1
TINYLM_ONNX_DIR="$work/graphs" "$tests" "[onnx-export]" > write.log 2>&1 || { cat write.log; exit 1; }
/usr/bin/python3 "$src/tests/python/onnx_export.py" "$work/graphs" || exit 1
if [ "$ort" != none ]; then  # the same logits through ONNX Runtime's C++ API
  worst=0 graphs=0
  for model in graphs/*.onnx; do
    stem=${model%.onnx} stem=${stem%.kv}
    for T in 16 5; do
      diff=$("$ort" --logits "$model" "$stem.3x$T.ids" "$stem.3x$T.logits" 3 "$T" 2> ort-logits.err) ||
        fail "$model, T=$T: ONNX Runtime's C++ API differs from tinylm by ${diff:-?} (allowed 1e-5) $(grep -v '^Schema error\|^$' ort-logits.err | tail -2)"
      worst=$(/usr/bin/python3 -c "print(max($worst, $diff))")
    done
    graphs=$((graphs + 1))
  done
  echo "ok   ONNX Runtime's C++ API: $graphs graphs give tinylm's logits (largest relative difference $worst)"
fi

train() {  # NAME FLAGS...: a copy-task run of that kind, trained enough that its greedy text varies
  local name=$1; shift
  "$tinylm" train --task copy --epochs 1 --steps-per-epoch 150 --out-dir "$name" "$@" > "$name.txt" 2>&1 ||
    fail "$name: train: $(tail -2 "$name.txt")"
}
train tiny --model tiny
train llama --model transformer --positions rotary --norm rms-norm --activation swiglu --n-kv-heads 2 \
  --d-model 32 --n-heads 4 --n-layers 2
for name in tiny llama; do
  "$tinylm" export "$name/best.ckpt" --format onnx --kv-cache --out "$name.kv.onnx" > "$name-export.txt" 2>&1 ||
    fail "$name: export --kv-cache: $(tail -2 "$name-export.txt")"
  grep -qF "with the KV cache" "$name-export.txt" || fail "$name: export --kv-cache: $(cat "$name-export.txt")"
  # 30 tokens after the prompt: past the context (12), where both read the last 12 afresh.
  want=$("$tinylm" sample "$name/best.ckpt" --prompt "5 1 4 2" --greedy --max-new-tokens 30 2>&1) ||
    fail "$name: sample: $want"
  /usr/bin/python3 "$src/tests/python/onnx_export.py" --generate "$name.kv.onnx" "5 1 4 2" 30 > "$name-onnx.txt" ||
    fail "$name: ONNX generation: $(tail -2 "$name-onnx.txt")"
  [ -n "$want" ] || fail "$name: sample printed nothing"
  while IFS= read -r line; do
    [ "${line#*: }" = "$want" ] || fail "$name: ${line%%: *} generates '${line#*: }', tinylm sample --greedy '$want'"
    echo "ok   $name: ${line%%: *} through the KV-cache graph generates tinylm sample --greedy's 30 tokens"
  done < "$name-onnx.txt"
  [ -s "$name-onnx.txt" ] || fail "$name: no runtime generated"
  if [ "$ort" != none ]; then
    # (Debian 13's libonnxruntime prints "Schema error: ... already registered" lines on
    # stderr as it loads: ONNX's operator schemas registered twice, harmless.)
    got=$("$ort" "$name.kv.onnx" "5 1 4 2" 30 2> "$name-ort.err") ||
      fail "$name: ONNX Runtime's C++ API: $got $(grep -v '^Schema error\|^$' "$name-ort.err" | tail -3)"
    [ "$got" = "$want" ] || fail "$name: ONNX Runtime's C++ API generates '$got', tinylm sample --greedy '$want'"
    echo "ok   $name: ONNX Runtime's C++ API through the KV-cache graph generates tinylm sample --greedy's 30 tokens"
  fi
done
# The flag is for ONNX alone.
out=$("$tinylm" export tiny/best.ckpt --kv-cache --out tiny.pt 2>&1) && fail "--kv-cache with --format pytorch exited 0"
grep -qF -- "--kv-cache is for --format onnx" <<<"$out" || fail "--kv-cache with --format pytorch: $out"
[ -e tiny.pt ] && fail "a refused export wrote tiny.pt"
[ "$ort" = none ] && echo "note: ONNX Runtime's C++ API is not packaged on Debian ${debian:-?}: its generation was not run"
echo "ok   ONNX export: graphs checked, and generation through the KV cache is tinylm's"
