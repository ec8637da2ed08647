#!/usr/bin/env bash
# run.sh — the server's API against the official openai npm SDK (CTest: api_openai). Installs
# what it needs (scripts/setup-api-tests.sh), starts three `moestream serve` processes on free
# loopback ports with the tiny synth model (one at full speed for the API checks, one with
# slowed tokens for the cancellation, load and SIGTERM checks, two whose models carry a
# Hermes/Qwen3-style and a gpt-oss harmony-style chat template for the tool checks, one per
# real vendor template of the tool round trips: Command-R7B's always, eleven more when
# ../shared/templates is present), runs api_test.mjs, stops them.
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

# The same model carrying a chat template with tool syntax (tests/api/templates/): NAME.jinja
# -> tiny-qwen3moe-q4_k-api-NAME.gguf.
with_template() {
  with_template_file "$1" "$src/tests/api/templates/$2.jinja"
}
with_template_file() {
  local out="$models/tiny-qwen3moe-q4_k-api-$1.gguf" tmpl="$2"
  if [ ! -f "$out" ] || [ "$tmpl" -nt "$out" ]; then
    "${MOESTREAM_PYTHON:-/usr/bin/python3}" "$src/tests/tools/gguf_mutate.py" "$model" "$out.tmp.$$" \
      set-file "tokenizer.chat_template=$tmpl"
    mv "$out.tmp.$$" "$out"
  fi
  echo "$out"
}
tools_model="$(with_template hermes hermes-qwen3)"
harmony_model="$(with_template harmony harmony)"

serve_start fast 0 -m "$model" --lossless
serve_start slow 20 -m "$model" --lossless --queue 16
serve_start tools 0 -m "$tools_model" --lossless -c 2048
serve_start harmony 0 -m "$harmony_model" --lossless -c 2048
# Real vendor templates (../shared/templates) for the families parsed between markers: one
# server each; skipped with the reason when that folder is absent.
real="$src/../shared/templates"
real_urls=""
if [ -d "$real" ]; then
  real_fams=""
  for pair in glm:GLM-4.6 deepseek:deepseek-ai-DeepSeek-V3.1 dsml:deepseek-ai-DeepSeek-V4 \
              kimi:moonshotai-Kimi-K2 seed:ByteDance-Seed-OSS minimax:MiniMax-M2 \
              mistral:Mistral-Small-3.2-24B-Instruct-2506 granite:ibm-granite-granite-4.0 \
              functionary:meetkai-functionary-medium-v3.1 xml:Qwen3-Coder lfm2:LFM2-8B-A1B; do
    fam="${pair%%:*}"
    m="$(with_template_file "real-$fam" "$real/${pair#*:}.jinja")"
    serve_start "$fam" 0 -m "$m" --lossless -c 8192  # (long vendor system prompts: a token a byte)
    real_fams+=" $fam"
  done
  for fam in $real_fams; do real_urls+="$fam=$(serve_url "$fam"),"; done
else
  echo "skip: real-template tool round trips: $real is absent" >&2
fi
# Command-R7B's real tool-use template is in tests/api/templates (../shared has none).
serve_start commandr 0 -m "$(with_template commandr CohereForAI-c4ai-command-r7b-12-2024-tool_use)" \
  --lossless -c 8192
real_urls+="commandr=$(serve_url commandr),"
fast_url="$(serve_url fast)"
slow_url="$(serve_url slow)"
tools_url="$(serve_url tools)"
harmony_url="$(serve_url harmony)"

# pydantic's own schemas of ordinary models (Debian's python3-pydantic, setup-api-tests.sh).
/usr/bin/python3 "$src/tests/api/pydantic_models.py" > "$work/pydantic.json"
export MOESTREAM_PYDANTIC_MODELS="$work/pydantic.json"

cd "$src/tests/api"
status=0
timeout 200 node api_test.mjs "$fast_url" "$slow_url" "$(cat "$work/slow.pid")" "$tools_url" "$harmony_url" "$real_urls" || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- fast server log" >&2; tail -30 "$work/fast.err" >&2
  echo "--- slow server log" >&2; tail -30 "$work/slow.err" >&2
  echo "--- tools server log" >&2; tail -30 "$work/tools.err" >&2
  echo "--- harmony server log" >&2; tail -30 "$work/harmony.err" >&2
fi
exit "$status"
