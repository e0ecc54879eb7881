#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer (the `asan`
# CMake preset: library, app, tests and the installed-package consumer all instrumented).
# Any report aborts the process that made it, so the test that ran it fails.
# usage: scripts/check-sanitizers.sh [ctest args]     (about 16 min to build on 2 cores, 5 to test)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset asan > /dev/null
cmake --build --preset asan
ctest --preset asan "$@"
