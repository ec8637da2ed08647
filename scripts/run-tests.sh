#!/usr/bin/env bash
# run-tests.sh BUILD_DIR — runs every CTest test of a configured, built tree.
# Env knob (read here): JOBS (parallel tests, default nproc), CTEST_ARGS (extra ctest args).
set -euo pipefail
build="${1:-build}"
ctest --test-dir "$build" --output-on-failure -j "${JOBS:-$(nproc)}" ${CTEST_ARGS:-}
