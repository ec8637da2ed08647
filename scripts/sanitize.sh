#!/usr/bin/env bash
# sanitize.sh asan|tsan — configure, build and run the sanitizer test builds
# (docs/reliability.md, "Sanitizer builds"). Each has its own build directory and builds only
# the library, the CLI (the tests make their models with `moestream synth`) and the unit tests
# that exercise moestream's own code:
#   asan  build-asan  ASan + UBSan: GGUF index / corruption matrices (index and model files
#                     through llama.cpp), split sets / NextN layers / large alignment and the
#                     weight binder, residency cache, I/O lanes,
#                     I/O faults (end to end through llama.cpp), route traces, replay, policies
#   tsan  build-tsan  TSan: the I/O lanes and the cache (RealModelBytesThroughIoLanes)
# plus tests/sanitizer/canary.cpp: planted bugs the sanitizer must report (negative controls).
# Env knobs (read here): JOBS (compile/test jobs, default nproc), ASAN_BUILD_DIR,
# TSAN_BUILD_DIR, CTEST_ARGS (extra ctest args).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
kind="${1:?usage: sanitize.sh asan|tsan}"
jobs="${JOBS:-$(nproc)}"
case "$kind" in
  asan)
    dir="${ASAN_BUILD_DIR:-build-asan}"
    san="address,undefined"
    tests="test_gguf_index;test_model_files;test_split_models;test_weight_binder;test_input_files;test_residency_cache;test_io_lanes;test_io_lanes_concurrency;test_io_faults;test_dense_read;test_route_trace;test_replay;test_policy_drop_cold;test_page_layout;test_page_pool;test_route_stats;test_eval_metrics"
    targets="all"  # = the library, the CLI (without serve and chat), the canary and the tests above
    # LeakSanitizer on: every test and every CLI run they spawn must free what it allocated.
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
    ;;
  tsan)
    dir="${TSAN_BUILD_DIR:-build-tsan}"
    san="thread"
    tests="test_io_lanes;test_io_lanes_concurrency;test_residency_cache"
    targets="sanitizer_tests"  # the tests above and the canary, no CLI: these tests make no models with it
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
    ;;
  *) echo "sanitize.sh: unknown build '$kind' (asan or tsan)" >&2; exit 64 ;;
esac

scripts/setup-deps.sh
# Configured every time (seconds when cached), so an existing build dir picks up a changed
# test list. No server and no `moestream chat` in these CLIs (no test here uses them). -O1 -g1:
# sanitizer builds compile about twice as fast as -O2 -g and reports keep function names and
# line numbers (the CI time budget, docs/reliability.md).
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DMOESTREAM_SANITIZE="$san" \
  -DMOESTREAM_UNIT_TESTS_ONLY="$tests" -DMOESTREAM_SERVE_AND_CHAT=OFF >/dev/null
t0=$(date +%s)
# One target: several --target names are built one after the other, a single target's
# dependencies side by side ("all", or tests/CMakeLists.txt's sanitizer_tests).
cmake --build "$dir" -j "$jobs" --target "$targets"
t1=$(date +%s)
ctest --test-dir "$dir" --output-on-failure -j "$jobs" ${CTEST_ARGS:-}
t2=$(date +%s)
echo "sanitize.sh $kind: build $((t1 - t0)) s, tests $((t2 - t1)) s" >&2
