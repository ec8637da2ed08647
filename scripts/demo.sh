#!/usr/bin/env bash
# demo.sh BUILD_DIR — the main job for a newcomer: make a small MoE model (deterministic
# random weights, real qwen3moe graph), stream it with moestream and print the stats.
# Env knobs (read here): DEMO_MODEL (use this GGUF instead), DEMO_PROMPT, DEMO_TOKENS.
set -euo pipefail
build="${1:-build}"
bin="$build/bin/moestream"
model="${DEMO_MODEL:-}"
if [ -z "$model" ]; then
  mkdir -p "$build/demo"
  model="$build/demo/tiny-qwen3moe-q4_k.gguf"
  [ -f "$model" ] || "$bin" synth --preset tiny --arch qwen3moe --type q4_k --seed 1 -o "$model"
fi
echo "== moestream inspect -m $model" >&2
"$bin" inspect -m "$model"
echo >&2
echo "== moestream run -m $model (streaming the routed experts; lossless)" >&2
"$bin" run -m "$model" -p "${DEMO_PROMPT:-The quick brown fox}" -n "${DEMO_TOKENS:-48}" \
  --stats-json "$build/demo/stats.json"
echo "stats written to $build/demo/stats.json" >&2
