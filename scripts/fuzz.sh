#!/usr/bin/env bash
# The fuzz targets (fuzz/: checkpoint, torch_file, upgrade, token_file, config,
# http_request, http_connection, sentencepiece), built in the sanitizer build (the `asan` preset: clang, ASan + UBSan,
# libFuzzer's coverage in the library; the `fuzz` build preset builds only the targets;
# where scripts/check-sanitizers.sh ran first there is nothing left to build). Each target
# first runs every file in fuzz/regressions/TARGET once (inputs that once crashed it: they
# must stay fixed), then fuzzes for SECONDS from its seed corpus (fuzz/corpus/TARGET), as
# many targets at once as there are cores (each libFuzzer process runs on one). A crash, a
# sanitizer report, a leak, a timeout or running out of memory fails, the input saved in
# build/fuzz/findings/ (copy it to fuzz/regressions/TARGET/ once fixed). New inputs the
# fuzzer finds go to build/fuzz/corpus/TARGET, never into the repository.
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (default: 30 s for each target)
# A longer campaign: TINYLM_FUZZ_SEED=0 scripts/fuzz.sh 3600 checkpoint (an hour, a random
# seed), or run a target by hand with -jobs=N; see docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phase.sh
seconds=${1:-30}
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz: SECONDS must be a whole number, got '$seconds'" >&2; exit 2; }
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(checkpoint torch_file upgrade token_file config http_request http_connection sentencepiece)

phase setup scripts/setup.sh --fuzz
configure() { cmake --preset asan | sed -n 's/^-- tinylm: /tinylm: /p'; }
phase configure configure
phase build cmake --build --preset fuzz

run_target() {
  local name=$1 exe=build/asan/fuzz/fuzz_$1
  [ -x "$exe" ] || { echo "fuzz: $exe was not built (SentencePiece missing?)" >&2; return 1; }
  local work=build/fuzz/corpus/$name findings=build/fuzz/findings
  mkdir -p "$work" "$findings"
  # A fixed seed by default (the same inputs on the same build: CI's runs are repeatable);
  # TINYLM_FUZZ_SEED=0 takes a random one, for campaigns.
  local options=(-rss_limit_mb=4096 -timeout=20 -malloc_limit_mb=4096 "-seed=${TINYLM_FUZZ_SEED:-1}"
                 "-artifact_prefix=$findings/$name-")
  local regressions=(fuzz/regressions/"$name"/*)
  if [ -e "${regressions[0]}" ]; then
    "$exe" "${options[@]}" "${regressions[@]}" > "build/fuzz/$name-regressions.log" 2>&1 ||
      { tail -30 "build/fuzz/$name-regressions.log"; echo "fuzz: $name: a regression file fails again" >&2; return 1; }
    echo "fuzz: $name: ${#regressions[@]} regression file(s) pass"
  fi
  local seeds=(fuzz/corpus/"$name")
  [ "$name" = checkpoint ] && seeds+=(tests/fixtures)
  if [ "$name" = upgrade ]; then  # the format-1 fixtures (libFuzzer takes folders only)
    seeds=(build/fuzz/seeds/upgrade)
    mkdir -p "${seeds[0]}" && cp tests/fixtures/v1-*.ckpt "${seeds[0]}/"
  fi
  [ "$name" = config ] && seeds+=(configs)
  if ! "$exe" "${options[@]}" -max_total_time="$seconds" -print_final_stats=1 "$work" "${seeds[@]}" \
      > "build/fuzz/$name.log" 2>&1; then
    tail -40 "build/fuzz/$name.log"
    echo "fuzz: $name: a finding (saved in $findings; the log is build/fuzz/$name.log)" >&2
    return 1
  fi
  echo "fuzz: $name: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "build/fuzz/$name.log" | grep -o '[0-9]*$') inputs in ${seconds} s, no finding"
}
# The targets side by side, one per core; each prints its lines when it ends.
mkdir -p build/fuzz
failed=()
fuzz_all() {
  local jobs pids=() names=()
  jobs=$(nproc)
  wait_one() {  # waits for the oldest running target
    local rc=0
    wait "${pids[0]}" || rc=$?
    cat "build/fuzz/${names[0]}.out"
    [ "$rc" = 0 ] || failed+=("${names[0]}")
    pids=("${pids[@]:1}") names=("${names[@]:1}")
  }
  for t in "${targets[@]}"; do
    [ ${#pids[@]} -lt "$jobs" ] || wait_one
    run_target "$t" > "build/fuzz/$t.out" 2>&1 &
    pids+=($!) names+=("$t")
  done
  while [ ${#pids[@]} -gt 0 ]; do wait_one; done
  [ ${#failed[@]} -eq 0 ]
}
phase fuzz fuzz_all || { echo "fuzz: findings in ${failed[*]}" >&2; exit 1; }
