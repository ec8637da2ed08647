#!/usr/bin/env bash
# run.sh — the server's API against the official openai npm SDK (CTest: api_openai). Installs
# what it needs (scripts/setup-api-tests.sh), starts two `moestream serve` processes on free
# loopback ports with the tiny synth model (one at full speed for the API checks, one with
# slowed tokens for the cancellation, load and SIGTERM checks), runs api_test.mjs, stops them.
# Env (set by tests/CMakeLists.txt): MOESTREAM_BIN, MOESTREAM_SRC, MOESTREAM_TEST_MODELS,
# GGML_BACKEND_PATH.
set -euo pipefail
src="${MOESTREAM_SRC:?}"
bin="${MOESTREAM_BIN:?}"
models="${MOESTREAM_TEST_MODELS:?}"
mkdir -p "$models"

"$src/scripts/setup-api-tests.sh"

work="$(mktemp -d /tmp/moestream-api-XXXXXX)"
source "$src/tests/lib/serve.sh"
trap 'serve_stop_all; rm -rf "$work"' EXIT
model="$models/tiny-qwen3moe-q4_k-api.gguf"
synth_once "$model"

serve_start fast 0 -m "$model" --lossless
serve_start slow 20 -m "$model" --lossless --queue 16
fast_url="$(serve_url fast)"
slow_url="$(serve_url slow)"

cd "$src/tests/api"
status=0
timeout 120 node api_test.mjs "$fast_url" "$slow_url" "$(cat "$work/slow.pid")" || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- fast server log" >&2; tail -30 "$work/fast.err" >&2
  echo "--- slow server log" >&2; tail -30 "$work/slow.err" >&2
fi
exit "$status"
