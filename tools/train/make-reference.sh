#!/usr/bin/env bash
# make-reference.sh Q8_0.gguf Q4_K_M.gguf — the PyTorch side of tests/gates/trained_model.sh:
# runs tools/train/reference.py on each model over tests/data/trained/val-excerpt.txt and
# writes tests/data/trained/reference.json ({"q8_0": {...}, "q4_k_m": {...}}).
# Needs torch (scripts/setup-train.sh). Env: REF_CTX (128, the training context), REF_PROMPT, REF_N (64).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ $# -eq 2 ] || { echo "usage: make-reference.sh Q8_0.gguf Q4_K_M.gguf" >&2; exit 64; }
out="$repo/tests/data/trained"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
for pair in "q8_0:$1" "q4_k_m:$2"; do
  key="${pair%%:*}"; m="${pair#*:}"
  nice -n 10 "$repo/tools/train/py" "$repo/tools/train/reference.py" -m "$m" -f "$out/val-excerpt.txt" \
    --ctx "${REF_CTX:-128}" --prompt "${REF_PROMPT:-The kernel}" --n-predict "${REF_N:-64}" \
    -o "$tmp/$key.json" > /dev/null
done
python3 -c 'import json,sys; d={k: json.load(open(f"{sys.argv[1]}/{k}.json")) for k in ("q8_0","q4_k_m")}; open(sys.argv[2],"w").write(json.dumps(d, indent=1)+"\n")' \
  "$tmp" "$out/reference.json"
echo "wrote $out/reference.json"
