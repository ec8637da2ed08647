#!/usr/bin/env bash
# run.sh — the end-to-end browser test (CTest: browser_chat). Installs what it needs
# (scripts/setup-browser.sh), starts `moestream serve` on a free loopback port with a tiny synth
# model (tokens slowed down so the page is seen mid-generation) and a second one with an API
# key, runs browser_chat.mjs in headless Debian chromium (phone and desktop viewports), stops
# the servers.
# Env (set by tests/CMakeLists.txt): MOESTREAM_BIN, MOESTREAM_SRC, MOESTREAM_TEST_MODELS,
# GGML_BACKEND_PATH, MOESTREAM_ARTIFACTS (where the screenshots go).
set -euo pipefail
src="${MOESTREAM_SRC:?}"
bin="${MOESTREAM_BIN:?}"
models="${MOESTREAM_TEST_MODELS:?}"
art="${MOESTREAM_ARTIFACTS:-$models/../test-artifacts}"
mkdir -p "$models" "$art"

"$src/scripts/setup-browser.sh"

model="$models/tiny-qwen3moe-q4_k-browser.gguf"
if [ ! -f "$model" ]; then
  "$bin" synth --preset tiny --type q4_k -o "$model.tmp.$$" >/dev/null
  mv "$model.tmp.$$" "$model"
fi

work="$(mktemp -d /tmp/moestream-browser-XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# start NAME [flags...]: a server (tokens slowed to 60 ms); prints its URL.
start() {
  local name="$1"; shift
  MOESTREAM_DEBUG_TOKEN_DELAY_MS=60 "$bin" serve -m "$model" --port 0 -v -n 40 "$@" \
    >"$work/$name.out" 2>"$work/$name.err" &
  local pid=$!
  pids+=("$pid")
  local url=""
  for _ in $(seq 1 300); do
    url="$(grep -o 'http://127\.0\.0\.1:[0-9]*/' "$work/$name.out" || true)"
    [ -n "$url" ] && { echo "$url"; return 0; }
    kill -0 "$pid" 2>/dev/null || { cat "$work/$name.err" >&2; echo "server $name exited" >&2; return 1; }
    sleep 0.1
  done
  cat "$work/$name.err" >&2; echo "server $name did not start" >&2; return 1
}
url="$(start open --temp 0.7)"
key_url="$(start keyed --api-key browser-test-key -n 8)"

cd "$src/tests/browser"
status=0
node browser_chat.mjs "$url" "$key_url" browser-test-key "$art" || status=$?
if [ "$status" -ne 0 ]; then
  for n in open keyed; do echo "--- server $n log" >&2; tail -30 "$work/$n.err" >&2; done
fi
exit "$status"
