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

work="$(mktemp -d /tmp/moestream-browser-XXXXXX)"
source "$src/tests/lib/serve.sh"
trap 'serve_stop_all; rm -rf "$work"' EXIT
model="$models/tiny-qwen3moe-q4_k-browser.gguf"
synth_once "$model"

# Two servers (tokens slowed to 60 ms): an open one and one that needs an API key. The open
# one holds a prompt in its prefill while $work/prefill.hold exists (the page test makes and
# removes it: MOESTREAM_DEBUG_PREFILL_HOLD).
MOESTREAM_DEBUG_PREFILL_HOLD="$work/prefill.hold" serve_start open 60 -m "$model" -n 40 --temp 0.7
# The keyed one also keeps a prompt cache and a warm expert set (the page's two extra rows).
serve_start keyed 60 -m "$model" -n 8 --api-key browser-test-key \
  --prompt-cache "$work/pcache" --warm-experts "$work/warm.usage"
url="$(serve_url open)"
key_url="$(serve_url keyed)"

cd "$src/tests/browser"
status=0
node browser_chat.mjs "$url" "$key_url" browser-test-key "$art" "$work/prefill.hold" || status=$?
if [ "$status" -ne 0 ]; then
  for n in open keyed; do echo "--- server $n log" >&2; tail -30 "$work/$n.err" >&2; done
fi
exit "$status"
