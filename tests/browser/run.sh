#!/usr/bin/env bash
# run.sh — the end-to-end browser test (CTest: browser_chat). Installs what it needs
# (scripts/setup-browser.sh), starts `moestream serve` on a free loopback port with a tiny synth
# model (tokens slowed down so the page is seen mid-generation), runs browser_chat.mjs in
# headless Debian chromium at a phone-sized viewport, stops the server.
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
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

MOESTREAM_DEBUG_TOKEN_DELAY_MS=60 "$bin" serve -m "$model" --port 0 -n 40 -v \
  >"$work/out" 2>"$work/err" &
server_pid=$!
url=""
for _ in $(seq 1 300); do
  url="$(grep -o 'http://127\.0\.0\.1:[0-9]*/' "$work/out" || true)"
  [ -n "$url" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/err" >&2; echo "server exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { cat "$work/err" >&2; echo "server did not start" >&2; exit 1; }

cd "$src/tests/browser"
status=0
node browser_chat.mjs "$url" "$art" || status=$?
if [ "$status" -ne 0 ]; then echo "--- server log" >&2; tail -50 "$work/err" >&2; fi
exit "$status"
