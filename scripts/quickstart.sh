#!/usr/bin/env bash
# The README's two commands:
#   scripts/quickstart.sh train [tinylm train flags]   set up, build the tool, train the default run
#   scripts/quickstart.sh test [ctest flags]           set up, build everything, run every test
# `train` installs and builds only what training needs (no test tools, no test programs);
# `test` adds the test tools (PyTorch for Python, Chromium, ...) and builds every target.
# With TINYLM_JUNIT=FILE the test results are also written there (JUnit XML, for CI).
# Each phase's time is printed as it ends (downloading and installing packages, configuring,
# building, training or testing), and all of them in one line at the end; with
# TINYLM_TIMINGS=FILE they are also appended there (see scripts/phase.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phase.sh
what=${1:-}
case "$what" in
  train|test) shift ;;
  *) echo "usage: scripts/quickstart.sh train|test [args]" >&2; exit 2 ;;
esac
quickstart_tmp=""
if [ -z "${TINYLM_TIMINGS:-}" ]; then
  quickstart_tmp=$(mktemp)
  TINYLM_TIMINGS=$quickstart_tmp
fi
export TINYLM_TIMINGS
touch "$TINYLM_TIMINGS"  # CI names a file that its legs' phases append to, not yet there
first_line=$(( $(wc -l < "$TINYLM_TIMINGS") + 1 ))
started=$(date +%s%N)
# The closing line: this run's phases, setup with its download and install.
summary() {
  local status=$?
  tail -n "+$first_line" "$TINYLM_TIMINGS" | awk -v what="$what" -v status="$status" \
    -v total=$(( ($(date +%s%N) - started) / 1000000 )) '
    function mmss(ms) { return sprintf("%d:%02d", int(ms / 60000), int(ms / 1000) % 60) }
    { if (!($1 in ms)) order[n++] = $1; ms[$1] += $2 }
    END {
      line = "quickstart " what ":"
      for (i = 0; i < n; i++) {
        p = order[i]
        if (p == "download" || p == "install") continue
        line = line " " p " " mmss(ms[p])
        if (p == "setup" && ("download" in ms || "install" in ms))
          line = line " (download " mmss(ms["download"]) ", install " mmss(ms["install"]) ")"
        line = line ","
      }
      line = line " in all " mmss(total)
      if (status != 0) line = line " (failed, status " status ")"
      print line
    }'
}
trap 'summary; [ -z "$quickstart_tmp" ] || rm -f "$quickstart_tmp"' EXIT

if [ "$what" = train ]; then phase setup scripts/setup.sh; else phase setup scripts/setup.sh --test; fi
configure() { cmake --preset release | sed -n 's/^-- tinylm: /tinylm: /p'; }  # shows the build's summary line
phase configure configure

if [ "$what" = train ]; then
  phase build cmake --build --preset release --target tinylm_cli
  phase train build/release/tinylm train "$@"
  exit
fi
phase build cmake --build --preset release
phase test ctest --preset release ${TINYLM_JUNIT:+--output-junit "$TINYLM_JUNIT"} "$@"
