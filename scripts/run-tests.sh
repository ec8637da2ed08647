#!/usr/bin/env bash
# run-tests.sh BUILD_DIR — runs every CTest test of a configured, built tree, but the ones the
# ASan+UBSan build runs in full (scripts/sanitize.sh asan, part of `make test`): the model-file
# corruption matrices (ModelFiles.CorruptionMatrix*, every truncation and bit flip of the model
# files through llama.cpp; about 90 s of CPU), whose assertions are the same there and where a
# memory error is caught as well. MOESTREAM_TEST_ALL=1 (env, read here) runs them here too.
# Env knobs (read here): JOBS (parallel tests, default nproc), CTEST_ARGS (extra ctest args).
set -euo pipefail
build="${1:-build}"
exclude=()
[ "${MOESTREAM_TEST_ALL:-0}" = 1 ] || exclude=(-E '^ModelFiles\.CorruptionMatrix')
ctest --test-dir "$build" --output-on-failure -j "${JOBS:-$(nproc)}" "${exclude[@]}" ${CTEST_ARGS:-}
