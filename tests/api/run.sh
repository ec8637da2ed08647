#!/usr/bin/env bash
# run.sh — the server's API against the official openai npm SDK (CTest: api_openai). Installs
# what it needs (scripts/setup-api-tests.sh), starts three `moestream serve` processes on free
# loopback ports with the tiny synth model (one at full speed for the API checks, one with
# slowed tokens for the cancellation, load and SIGTERM checks, one whose model carries a
# Hermes/Qwen3-style chat template for the tool checks), runs api_test.mjs, stops them.
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

# The same model carrying a Hermes/Qwen3-style chat template (tests/api/templates/), for tools.
tools_model="$models/tiny-qwen3moe-q4_k-api-hermes.gguf"
if [ ! -f "$tools_model" ] || [ "$src/tests/api/templates/hermes-qwen3.jinja" -nt "$tools_model" ]; then
  python3 "$src/tests/tools/gguf_mutate.py" "$model" "$tools_model.tmp.$$" \
    set-file "tokenizer.chat_template=$src/tests/api/templates/hermes-qwen3.jinja"
  mv "$tools_model.tmp.$$" "$tools_model"
fi

serve_start fast 0 -m "$model" --lossless
serve_start slow 20 -m "$model" --lossless --queue 16
serve_start tools 0 -m "$tools_model" --lossless -c 2048
fast_url="$(serve_url fast)"
slow_url="$(serve_url slow)"
tools_url="$(serve_url tools)"

cd "$src/tests/api"
status=0
timeout 200 node api_test.mjs "$fast_url" "$slow_url" "$(cat "$work/slow.pid")" "$tools_url" || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- fast server log" >&2; tail -30 "$work/fast.err" >&2
  echo "--- slow server log" >&2; tail -30 "$work/slow.err" >&2
  echo "--- tools server log" >&2; tail -30 "$work/tools.err" >&2
fi
exit "$status"
