#!/usr/bin/env bash
# The README's two commands:
#   scripts/quickstart.sh train [tinylm train flags]   set up, build, train the default run
#   scripts/quickstart.sh test                         set up, build, run every test
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
case "$what" in
  train|test) shift ;;
  *) echo "usage: scripts/quickstart.sh train|test [args]" >&2; exit 2 ;;
esac

scripts/setup.sh
cmake --preset release > /dev/null
cmake --build --preset release

if [ "$what" = train ]; then
  exec build/release/tinylm train "$@"
fi
ctest --preset release "$@"
