#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer (the `asan`
# CMake preset, -O1 -g1: library, app, tests and the installed-package consumer all
# instrumented). Any report aborts the process that made it, so the test that ran it fails.
# usage: scripts/check-sanitizers.sh [ctest args]     (about 8 min to build on 2 cores, 5 to test)
# With TINYLM_JUNIT=FILE the test results are also written there (JUnit XML, for CI).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phase.sh
phase setup scripts/setup.sh
configure() { cmake --preset asan | sed -n 's/^-- tinylm: /tinylm: /p'; }  # shows the build's summary line
phase configure configure
phase build cmake --build --preset asan
phase test ctest --preset asan ${TINYLM_JUNIT:+--output-junit "$TINYLM_JUNIT"} "$@"
