#!/usr/bin/env bash
# Layers point down: the core library (nn, data, train, interop, generate, report,
# threads, internal) never sees the run layer (tinylm/config.h, tinylm/run.h: RunConfig,
# TOML settings, the flags' names) or the command line (CLI11), and the CMake target
# `tinylm` compiles none of the run layer's sources (they are `tinylm_run`'s); the core's
# tests (tests/nn, tests/data, tests/train, tests/internal) build their fixtures from core
# types too, never from the run layer (its tests are at the top of tests/); a source
# file over 400 lines says at its top why it is that long; no header holds a dated
# measurement (figures live in docs/, so that a new one recompiles nothing).
# usage: test_layers.sh SOURCE_DIR
set -uo pipefail
src="$1"
cd "$src" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
core=$(ls src/nn/*.cpp src/nn/*.h src/nn/cpu/*.cpp src/nn/cpu/*.h src/data/*.cpp src/data/sentencepiece/*.cpp \
          src/data/sentencepiece/*.h src/train/*.cpp src/train/*.h src/interop/*.cpp src/interop/*.h \
          src/internal/*.cpp src/internal/*.h src/onnx.cpp src/generate.cpp src/batch_decoder.cpp src/report.cpp src/threads.cpp src/interop.cpp src/log.cpp \
          include/tinylm/nn/*.h include/tinylm/data/*.h include/tinylm/train/*.h include/tinylm/generate.h include/tinylm/batch_decoder.h \
          include/tinylm/interop.h include/tinylm/onnx.h include/tinylm/report.h include/tinylm/threads.h include/tinylm/log.h \
          include/tinylm/version.h include/tinylm/spec.h src/spec.cpp 2>/dev/null)
# no_run_layer WHAT PATTERN ADVICE FILE...: no file includes what PATTERN matches or
# names RunConfig; sets `checked` to the number of files looked at.
no_run_layer() {
  local what=$1 pattern=$2 advice=$3 f
  shift 3
  checked=0
  for f in "$@"; do
    checked=$((checked + 1))
    grep -nE "$pattern" "$f" && fail "$f ($what) includes the run layer or the command line (above)$advice"
    grep -nw 'RunConfig' "$f" && fail "$f ($what) names RunConfig (above)$advice"
  done
}
no_run_layer core '#include *[<"](tinylm/(config|run|tinylm)\.h|CLI/)' "" $core
n=$checked
[ "$n" -gt 40 ] || fail "only $n core files found: the list of core directories is out of date"
# The core's tests build from the core's types: neither run-layer header, no RunConfig.
core_tests=$(ls tests/nn/*.cpp tests/nn/*.h tests/data/*.cpp tests/data/*.h tests/train/*.cpp tests/train/*.h \
                tests/internal/*.cpp tests/internal/*.h 2>/dev/null)
no_run_layer "a core test" '#include *[<"]([^">]*/)?tinylm/(config|run)\.h[>"]' \
  ": build the run from core types (tests/train/core_runs.h); the run layer's tests are at the top of tests/" \
  $core_tests
t=$checked
[ "$t" -gt 25 ] || fail "only $t core test files found: the list of core test directories is out of date"
# The core's umbrella header brings in the core alone.
grep -nE '#include *<tinylm/(config|run)\.h>' include/tinylm/tinylm.h &&
  fail "include/tinylm/tinylm.h (the core's umbrella) includes the run layer (above)"
# tinylm serve's HTTP layer is a library of its own without LibTorch (the target
# tinylm_http): it includes neither LibTorch nor tinylm's headers.
http_layer="apps/serve/http.h apps/serve/http.cpp"
for f in $http_layer; do
  [ -f "$f" ] || fail "$f is missing: the HTTP layer's files moved (update this test)"
  grep -nE '#include *[<"](torch|c10|ATen|tinylm)/' "$f" && fail "$f (the HTTP layer, no LibTorch) includes LibTorch or tinylm (above)"
  grep -nE 'TORCH_CHECK|c10::' "$f" && fail "$f (the HTTP layer, no LibTorch) uses LibTorch (above): throw a std::exception"
done
# The sources of add_library(tinylm ...): up to its closing parenthesis.
sources=$(awk '/^add_library\(tinylm$/ { inside = 1; next } inside && /^\)/ { exit } inside' CMakeLists.txt)
[ -n "$sources" ] || fail "CMakeLists.txt: no add_library(tinylm ...) source list found"
for s in src/config.cpp src/run.cpp src/run_memory.cpp; do
  grep -qx " *$s" <<< "$sources" && fail "the core target tinylm compiles $s (the run layer's)"
done
# Files stay readable: one over 400 lines says why at its top.
long=0
for f in $(find src apps include -name '*.cpp' -o -name '*.h' -o -name '*.inc' | sort); do
  [ "$(wc -l < "$f")" -le 400 ] && continue
  long=$((long + 1))
  head -12 "$f" | grep -q "Over 400 lines on purpose" ||
    fail "$f has $(wc -l < "$f") lines and no 'Over 400 lines on purpose: ...' at its top"
done
# Headers are included by many sources: a figure with a date in one is retyped, and
# changing it recompiles them all.
dated=0
for f in $(find src include apps -name '*.h' -o -name '*.inc' | sort); do
  if grep -nE '\b20[0-9]{2}-[01][0-9]\b' "$f"; then
    fail "$f holds a dated figure (above): put it in docs/performance.md and say there what it measured"
    dated=$((dated + 1))
  fi
done
if [ "$failures" -eq 0 ]; then
  echo "ok: no header or .inc file holds a dated figure"
  echo "ok: $long source file(s) over 400 lines, each saying why at its top"
  echo "ok: $n core files include neither tinylm/config.h, tinylm/run.h, tinylm/tinylm.h nor CLI11, and name no RunConfig; the tinylm target compiles no run-layer source"
  echo "ok: the HTTP layer ($http_layer) includes and uses no LibTorch"
  echo "ok: $t core test files (tests/nn, tests/data, tests/train, tests/internal) include neither tinylm/config.h nor tinylm/run.h, and name no RunConfig"
fi
exit $((failures > 0))
