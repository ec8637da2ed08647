#!/usr/bin/env bash
# run.sh — the exact commands that made models/moestream-linuxdoc-* (see tools/train/README.md).
#   tools/train/run.sh corpus         build the corpus (train/val split) into $WORK/corpus
#   tools/train/run.sh train [ARGS]   start or resume the training run in $WORK/run, in the
#                                     background, nice 19, PID in /tmp/moestream-train.pid
#   tools/train/run.sh export         checkpoint -> F32 GGUF -> Q8_0 + Q4_K_M into models/,
#                                     then the PyTorch reference for tests/gates/trained_model.sh
# Env: WORK (default /var/tmp/moestream-train), TRAIN_BUDGET_MIN (total training minutes over
# which the LR decays; default 53), TRAIN_MAX_MIN (stop this invocation after; default = budget).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="${WORK:-/var/tmp/moestream-train}"
py="$repo/tools/train/py"
name=moestream-linuxdoc-4l32e
case "${1:-}" in
  corpus)
    "$repo/scripts/setup-train.sh"
    nice -n 19 "$py" "$repo/tools/train/corpus.py" --out "$work/corpus" ;;
  train)
    shift
    mkdir -p "$work/run"
    rm -f /tmp/moestream-train.pid
    budget="${TRAIN_BUDGET_MIN:-53}"
    # one thread by default: on this shared 2-core machine two threads spend a third to a half of
    # their CPU waiting for each other at OpenMP/OpenBLAS barriers (measured 270 vs 150 tokens per
    # CPU-second at batch 4 x 128); on an otherwise idle machine two threads still finish sooner
    # (batch 16 x 256: ~590 vs ~410 tokens/s)
    threads="${TRAIN_THREADS:-1}"
    OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads nohup nice -n 19 "$py" "$repo/tools/train/train.py" --data "$work/corpus" --run "$work/run" \
      --batch 4 --ctx 128 --lr 3e-3 --warmup 10 --max-steps 100000 --budget-minutes "$budget" \
      --max-minutes "${TRAIN_MAX_MIN:-$budget}" --eval-every 25 --val-windows 16 --log-every 5 \
      --ckpt-minutes 5 --aux-coef 0.01 --seed 1 --threads "$threads" --pid-file /tmp/moestream-train.pid "$@" \
      >> "$work/run/stdout.log" 2>&1 &
    for _ in $(seq 60); do [ -s /tmp/moestream-train.pid ] && break; sleep 1; done
    echo "training: pid $(cat /tmp/moestream-train.pid), log $work/run/train.log.jsonl" ;;
  export)
    "$py" "$repo/tools/train/export.py" --ckpt "$work/run/ckpt.pt" -o "$work/$name-f32.gguf"
    mkdir -p "$repo/models"
    "$repo/scripts/llama-tool" llama-quantize "$work/$name-f32.gguf" "$repo/models/$name-q8_0.gguf" Q8_0 > "$work/quantize-q8_0.log" 2>&1
    "$repo/scripts/llama-tool" llama-quantize "$work/$name-f32.gguf" "$repo/models/$name-q4_k_m.gguf" Q4_K_M > "$work/quantize-q4_k_m.log" 2>&1
    cp "$work/run/train.log.jsonl" "$repo/models/$name.train.log.jsonl"
    "$repo/tools/train/make-reference.sh" "$repo/models/$name-q8_0.gguf" "$repo/models/$name-q4_k_m.gguf" ;;
  *) echo "usage: run.sh corpus|train|export" >&2; exit 64 ;;
esac
