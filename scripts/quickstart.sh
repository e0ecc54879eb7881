#!/usr/bin/env bash
# The README's two commands:
#   scripts/quickstart.sh train [tinylm train flags]   set up, build, train the default run
#   scripts/quickstart.sh test [ctest flags]           set up, build, run every test
# With TINYLM_JUNIT=FILE the test results are also written there (JUnit XML, for CI).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phase.sh
what=${1:-}
case "$what" in
  train|test) shift ;;
  *) echo "usage: scripts/quickstart.sh train|test [args]" >&2; exit 2 ;;
esac

phase setup scripts/setup.sh
configure() { cmake --preset release | sed -n 's/^-- tinylm: /tinylm: /p'; }  # shows the build's summary line
phase configure configure
phase build cmake --build --preset release

if [ "$what" = train ]; then
  exec build/release/tinylm train "$@"
fi
phase test ctest --preset release ${TINYLM_JUNIT:+--output-junit "$TINYLM_JUNIT"} "$@"
