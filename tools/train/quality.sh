#!/usr/bin/env bash
# quality.sh — the figures of docs/quality.md for the trained model, next to the random-weight
# preset of the same shapes (moestream synth --preset tiny --type q8_0 --seed 1).
#   tools/train/quality.sh [OUTDIR]      (default docs/quality)
# Writes into OUTDIR: price-list.{json,md,png} (tools/train/price_list.py: every lossy knob's
# KL / top-1 / perplexity against its reads avoided), routing-{trained,synth}.json
# (tools/train/routing_stats.py), trace-{trained,synth}.trace (moestream eval --route-trace:
# one decode row per text token) and replay-{trained,synth}.{json,png} (moestream replay: LRU
# hit rate over cache budgets). Needs build/bin/moestream and the training venv
# (scripts/setup-train.sh). Takes ~15 minutes on 2 cores.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-$repo/docs/quality}"
bin="$repo/build/bin/moestream"
py="$repo/tools/train/py"
model="$repo/models/moestream-linuxdoc-4l32e-q8_0.gguf"
text="$repo/tests/data/trained/val-excerpt.txt"
tokens="${QUALITY_TOKENS:-2000}"
# eval --window: every prediction sees at most this many tokens (the model trained on 256-byte
# windows; beyond its training context its perplexity means little). 0 = one context.
window="${QUALITY_WINDOW:-256}"
ctx="$window"; [ "$window" = 0 ] && ctx=$((tokens + 16))
"$repo/scripts/setup-train.sh" > /dev/null  # the gguf package routing_stats.py reads models with
mkdir -p "$out"
synth="$out/synth-tiny-q8_0.gguf"
[ -f "$synth" ] || "$bin" synth --preset tiny --type q8_0 --seed 1 -o "$synth"

echo "== price list ($tokens tokens of $text)"
fallback_type="${QUALITY_FALLBACK_TYPE:-Q2_K}"
fallback="$out/fallback-trained-$fallback_type.gguf"  # the --miss-fallback rows' companion
[ -f "$fallback" ] || "$bin" make-fallback -m "$model" -o "$fallback" --type "$fallback_type"
"$py" "$repo/tools/train/price_list.py" --bin "$bin" -m "$model" -f "$text" -o "$out/price-list" \
  --max-tokens "$tokens" --window "$window" --fallback "$fallback" --fallback-type "$fallback_type"

echo "== routing statistics"
"$py" "$repo/tools/train/routing_stats.py" -m "$model" -f "$text" --json "$out/routing-trained.json"
"$py" "$repo/tools/train/routing_stats.py" -m "$synth" -f "$text" --json "$out/routing-synth.json"

echo "== replay hit-rate curves (LRU, lossless, one decode row per text token)"
budgets="1,2,3,4,6,8,12,16,20,24,28"
for which in trained synth; do
  m="$model"; [ "$which" = synth ] && m="$synth"
  "$bin" eval -m "$m" -f "$text" --max-tokens "$tokens" --window "$window" -c "$ctx" -t 2 \
    --cache-mb 0 --route-trace "$out/trace-$which.trace" --json > "$out/eval-$which.json"
  "$bin" replay "$out/trace-$which.trace" --budgets "$budgets" --policy lru,belady --json \
    > "$out/replay-$which.json"
  "$bin" replay "$out/trace-$which.trace" --budgets "$budgets" --policy lru,belady \
    --plot "$out/replay-$which.png" > /dev/null
done
rm -f "$out"/trace-*.trace "$synth"  # large and reproducible
echo "quality.sh: wrote $out"
# The tables of docs/quality.md come from these files (the prose around them is by hand).
if [ "$out" = "$repo/docs/quality" ]; then
  python3 "$repo/tools/train/quality_tables.py" --doc "$repo/docs/quality.md" --dir "$out"
fi
