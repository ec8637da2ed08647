#!/usr/bin/env bash
# demo.sh BUILD_DIR — the main job for a newcomer: stream a small MoE model with moestream,
# print the text it writes and the stats. The model: DEMO_MODEL (the Makefile sets it to the
# trained byte-level qwen3moe in models/, tools/train/README.md); unset or empty: a random-weight
# `moestream synth` model (real qwen3moe graph, text is noise).
# Then the point of moestream in seconds: the same prompt with the cache holding every expert
# and with a budget of about a quarter of the expert bank, side by side (identical text, cache
# hit rate, flash MiB read per token, tok/s), and what that means for a 30B model on a phone.
# Env knobs (read here): DEMO_MODEL, DEMO_PROMPT, DEMO_TOKENS, DEMO_TEMP (sampling temperature,
# default 0.7: the trained model is early in training and its greedy output loops on a few
# words; 0 = greedy), DEMO_SEED (sampling seed, default 1: the same text every run),
# DEMO_FLASH_GBS (the phone's flash read rate for the last line, default 1.5 GB/s).
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
inspect="$("$bin" inspect -m "$model")"
echo "$inspect"
echo >&2
temp="${DEMO_TEMP:-0.7}"
seed="${DEMO_SEED:-1}"
prompt="${DEMO_PROMPT:-The kernel}"
tokens="${DEMO_TOKENS:-160}"
dir="$build/demo"
mkdir -p "$dir"
echo "== moestream run -m $model --temp $temp --seed $seed (streaming the routed experts; lossless)" >&2
"$bin" run -m "$model" -p "$prompt" -n "$tokens" --temp "$temp" --seed "$seed" \
  --stats-json "$dir/stats.json" | tee "$dir/text-all.txt"
echo "stats written to $dir/stats.json" >&2

# A quarter of the expert bank, but never below the cache rule (inspect prints both).
bank_mib="$(awk '/^expert bytes/ {print $3}' <<<"$inspect")"
rule_mib="$(sed -n 's/^cache rule.*>= \([0-9]*\) MiB.*/\1/p' <<<"$inspect")"
quarter="$(python3 -c "import math,sys; print(max(math.ceil(float(sys.argv[1]) / 4), int(sys.argv[2] or 0)))" \
  "$bank_mib" "${rule_mib:-0}")"
echo >&2
echo "== the same prompt with --cache-mb $quarter: about a quarter of the $bank_mib MiB of experts" >&2
"$bin" run -m "$model" -p "$prompt" -n "$tokens" --temp "$temp" --seed "$seed" --cache-mb "$quarter" \
  --stats-json "$dir/stats-quarter.json" > "$dir/text-quarter.txt" 2> "$dir/run-quarter.err" \
  || { cat "$dir/run-quarter.err" >&2; exit 1; }

python3 - "$dir/stats.json" "$dir/stats-quarter.json" "$dir/text-all.txt" "$dir/text-quarter.txt" \
  "$quarter" "$bank_mib" "${DEMO_FLASH_GBS:-1.5}" <<'EOF'
import json, sys
a, q = (json.load(open(p)) for p in sys.argv[1:3])
same = open(sys.argv[3], "rb").read() == open(sys.argv[4], "rb").read()
quarter, bank, gbs = sys.argv[5], float(sys.argv[6]), float(sys.argv[7])
def mib_per_token(s):
    return s["flash_bytes_read"] / 2**20 / max(1, s["n_generated"])
rows = [("cache budget", "every expert (%d MiB)" % round(a["cache_budget_bytes"] / 2**20),
         "%s MiB (~1/4 of %.1f)" % (quarter, bank)),
        ("cache hit", "%.1f %%" % a["cache_hit_pct"], "%.1f %%" % q["cache_hit_pct"]),
        ("flash read / token", "%.2f MiB" % mib_per_token(a), "%.2f MiB" % mib_per_token(q)),
        ("decode", "%.1f tok/s" % a["decode_tok_s"], "%.1f tok/s" % q["decode_tok_s"]),
        ("peak RSS", "%.1f MiB" % (a["peak_rss_bytes"] / 2**20), "%.1f MiB" % (q["peak_rss_bytes"] / 2**20))]
print()
print("%-20s %-26s %s" % ("", "all experts cached", "a quarter of them"))
for r in rows:
    print("%-20s %-26s %s" % r)
print("%-20s %s" % ("text", "identical, %d tokens (lossless: the cache changes speed, not output)" % a["n_generated"]
                     if same else "DIFFERENT: this is a bug, please report it"))
h = q["cache_hit_pct"] / 100
# Qwen3-30B-A3B at Q4_K_M routes about 1 GB of expert weights per token (`moestream inspect`
# on it: working set; docs/cache.md).
print("\nFor Qwen3-30B-A3B (~1 GB of routed experts per token, `inspect`'s working set), a phone "
      "reading %.1f GB/s from flash decodes at most %.1f tok/s with no cache (inspect's decode "
      "bound); with a quarter of its experts cached, if that cache hit as often as here (%.0f %%), "
      "at most %.1f tok/s (%.2f GB read per token)." % (gbs, gbs, 100 * h, gbs / max(1e-9, 1 - h), 1 - h))
sys.exit(0 if same else 1)
EOF
