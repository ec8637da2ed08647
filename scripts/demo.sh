#!/usr/bin/env bash
# demo.sh BUILD_DIR — the main job for a newcomer: stream a small MoE model with moestream,
# print the text it writes and the stats. The model: DEMO_MODEL (the Makefile sets it to the
# trained byte-level qwen3moe in models/, tools/train/README.md); unset or empty: a random-weight
# `moestream synth` model (real qwen3moe graph, text is noise).
# Env knobs (read here): DEMO_MODEL, DEMO_PROMPT, DEMO_TOKENS, DEMO_TEMP (sampling temperature,
# default 0.7: the trained model is early in training and its greedy output loops on a few
# words; 0 = greedy), DEMO_SEED (sampling seed, default 1: the same text every run).
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
temp="${DEMO_TEMP:-0.7}"
seed="${DEMO_SEED:-1}"
echo "== moestream run -m $model --temp $temp --seed $seed (streaming the routed experts; lossless)" >&2
mkdir -p "$build/demo"
"$bin" run -m "$model" -p "${DEMO_PROMPT:-The kernel}" -n "${DEMO_TOKENS:-160}" \
  --temp "$temp" --seed "$seed" --stats-json "$build/demo/stats.json"
echo "stats written to $build/demo/stats.json" >&2
