#!/usr/bin/env bash
# The README's two commands:
#   scripts/quickstart.sh train [tinylm train flags]   set up, build the tool, train the default run
#   scripts/quickstart.sh test [ctest flags]           set up, build everything, run every test
# `train` installs and builds only what training needs (no test tools, no test programs);
# `test` adds the test tools (PyTorch for Python, Chromium, ...) and builds every target.
# With TINYLM_JUNIT=FILE the test results are also written there (JUnit XML, for CI).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phase.sh
what=${1:-}
case "$what" in
  train|test) shift ;;
  *) echo "usage: scripts/quickstart.sh train|test [args]" >&2; exit 2 ;;
esac

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
