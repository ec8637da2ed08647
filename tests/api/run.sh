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

model="$models/tiny-qwen3moe-q4_k-api.gguf"
if [ ! -f "$model" ]; then
  "$bin" synth --preset tiny --type q4_k -o "$model.tmp.$$" >/dev/null
  mv "$model.tmp.$$" "$model"
fi

# The same model carrying a Hermes/Qwen3-style chat template (tests/api/templates/), for tools.
tools_model="$models/tiny-qwen3moe-q4_k-api-hermes.gguf"
if [ ! -f "$tools_model" ] || [ "$src/tests/api/templates/hermes-qwen3.jinja" -nt "$tools_model" ]; then
  python3 "$src/tests/tools/gguf_mutate.py" "$model" "$tools_model.tmp.$$" \
    set-file "tokenizer.chat_template=$src/tests/api/templates/hermes-qwen3.jinja"
  mv "$tools_model.tmp.$$" "$tools_model"
fi

work="$(mktemp -d /tmp/moestream-api-XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# start NAME DELAY_MS [flags...]: a server with tokens delayed by DELAY_MS; its output in
# $work/NAME.out, its pid in $work/NAME.pid.
start() {
  local name="$1" delay="$2"; shift 2
  MOESTREAM_DEBUG_TOKEN_DELAY_MS="$delay" "$bin" serve -m "${MODEL:-$model}" --port 0 --lossless -v "$@" \
    >"$work/$name.out" 2>"$work/$name.err" &
  local pid=$!
  pids+=("$pid")
  echo "$pid" >"$work/$name.pid"
}
start fast 0
start slow 20 --queue 16
MODEL="$tools_model" start tools 0 -c 2048
wait_url() {
  local name="$1" url=""
  for _ in $(seq 1 600); do
    url="$(grep -o 'http://127\.0\.0\.1:[0-9]*/' "$work/$name.out" || true)"
    [ -n "$url" ] && { echo "$url"; return 0; }
    kill -0 "$(cat "$work/$name.pid")" 2>/dev/null || { cat "$work/$name.err" >&2; echo "server $name exited" >&2; return 1; }
    sleep 0.1
  done
  echo "server $name did not start" >&2
  return 1
}
fast_url="$(wait_url fast)"
slow_url="$(wait_url slow)"
tools_url="$(wait_url tools)"

cd "$src/tests/api"
status=0
timeout 200 node api_test.mjs "$fast_url" "$slow_url" "$(cat "$work/slow.pid")" "$tools_url" || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- fast server log" >&2; tail -30 "$work/fast.err" >&2
  echo "--- slow server log" >&2; tail -30 "$work/slow.err" >&2
  echo "--- tools server log" >&2; tail -30 "$work/tools.err" >&2
fi
exit "$status"
