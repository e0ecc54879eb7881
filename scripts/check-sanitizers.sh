#!/usr/bin/env bash
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer: the `asan` CMake
# preset, one clang build at -O1 -g1 (library, app, tests and the installed-package
# consumer all instrumented) that also holds the libFuzzer targets scripts/fuzz.sh runs.
# Any report aborts the process that made it, so the test that ran it fails.
# `ctest --preset asan` runs every test but those labelled `unsanitized` (the benchmark
# smoke runs, the browser, the consumer project: see tests/CMakeLists.txt), and the
# scripts that cross processes run at the sizes they choose for a sanitizer build.
# usage: scripts/check-sanitizers.sh [ctest args]
# With TINYLM_JUNIT=FILE the test results are also written there (JUnit XML, for CI).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/phase.sh
phase setup scripts/setup.sh --test --fuzz
configure() { cmake --preset asan | sed -n 's/^-- tinylm: /tinylm: /p'; }  # shows the build's summary line
phase configure configure
phase build cmake --build --preset asan
phase test ctest --preset asan ${TINYLM_JUNIT:+--output-junit "$TINYLM_JUNIT"} "$@"
