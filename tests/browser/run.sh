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

work="$(mktemp -d /tmp/moestream-browser-XXXXXX)"
source "$src/tests/lib/serve.sh"
trap 'serve_stop_all; rm -rf "$work"' EXIT
model="$models/tiny-qwen3moe-q4_k-browser.gguf"
synth_once "$model"

serve_start server 60 -m "$model" -n 40
url="$(serve_url server)"

cd "$src/tests/browser"
status=0
node browser_chat.mjs "$url" "$art" || status=$?
if [ "$status" -ne 0 ]; then echo "--- server log" >&2; tail -50 "$work/server.err" >&2; fi
exit "$status"
