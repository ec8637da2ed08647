#!/usr/bin/env bash
# fuzz.sh smoke|long [SECONDS] — the libFuzzer targets (docs/reliability.md, "Fuzzing").
#   smoke        `make test`: every regression input (tests/fuzz/regressions/<target>/) once,
#                then each target for ${FUZZ_SMOKE_SECONDS:-10} s from the seed corpus
#   long [S]     each target for S seconds (default 900), one after the other, at nice 19;
#                the corpus grows in build-fuzz/corpus/<target>, logs in build-fuzz/logs/
# Targets: fuzz_gguf_index (load_model_index: GGUF header, metadata, tensor table, expert
# map) and fuzz_route_trace (parse_route_trace). Seeds are made once per build dir from synth
# models (`moestream synth`, cut after the tensor table by fuzz_seed_gguf) and from traces
# recorded by `moestream run --route-trace`. A crash leaves its input in build-fuzz/crashes/.
# Env knobs (read here): MOESTREAM_BIN (CLI for the seeds, default build/bin/moestream),
# FUZZ_BUILD_DIR (default build-fuzz), FUZZ_SMOKE_SECONDS, JOBS (compile jobs),
# FUZZ_RSS_MB (libFuzzer -rss_limit_mb, default 1024).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
mode="${1:?usage: fuzz.sh smoke|long [SECONDS]}"
dir="${FUZZ_BUILD_DIR:-build-fuzz}"
cli="${MOESTREAM_BIN:-$repo/build/bin/moestream}"
rss="${FUZZ_RSS_MB:-1024}"
targets=(fuzz_gguf_index fuzz_route_trace)

scripts/setup-deps.sh
scripts/setup-fuzz.sh
if [ ! -f "$dir/CMakeCache.txt" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMOESTREAM_FUZZ=ON >/dev/null
fi
cmake --build "$dir" -j "${JOBS:-$(nproc)}" >/dev/null
bin="$dir/bin"

# ---- seeds -----------------------------------------------------------------------------------
seeds="$dir/seeds"
if [ ! -f "$seeds/.done-v5" ]; then  # made again when the seed set grows
  [ -x "$cli" ] || { echo "fuzz.sh: $cli missing (make build first)" >&2; exit 1; }
  rm -rf "$seeds" && mkdir -p "$seeds/fuzz_gguf_index" "$seeds/fuzz_route_trace"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  for spec in "qwen3moe q8_0 32" "olmoe q4_k 4096" "glm4moe f16 32" "qwen3moe f32 64" "glm4moe q4_k 4096"; do
    read -r arch type align <<<"$spec"
    m="$tmp/$arch-$type-$align.gguf"
    "$cli" synth --preset tiny --arch "$arch" --type "$type" --alignment "$align" -o "$m" >/dev/null
    "$bin/fuzz_seed_gguf" "$m" "$seeds/fuzz_gguf_index/$arch-$type-a$align"
    # Route traces: cache on (hits), cache off, drop-cold (dropped slots, weights),
    # substitution with router scores (the scores blocks).
    if [ "$type" = q8_0 ] || [ "$type" = q4_k ]; then
      "$cli" run -m "$m" -p "Fuzz seeds" -n 3 -t 1 -c 64 --cache-mb 4 --force-cache \
        --route-trace "$seeds/fuzz_route_trace/$arch-$type-cache" >/dev/null 2>&1
      "$cli" run -m "$m" -p "Fuzz seeds" -n 3 -t 1 -c 64 --cache-mb 0 \
        --route-trace "$seeds/fuzz_route_trace/$arch-$type-off" >/dev/null 2>&1
      "$cli" run -m "$m" -p "Fuzz seeds" -n 3 -t 1 -c 64 --cache-mb 2 --force-cache \
        --drop-cold-experts 0.5 --route-trace "$seeds/fuzz_route_trace/$arch-$type-drop" >/dev/null 2>&1
      "$cli" run -m "$m" -p "Fuzz seeds" -n 3 -t 1 -c 64 --cache-mb 2 --force-cache \
        --substitute-experts 1 --route-trace-scores \
        --route-trace "$seeds/fuzz_route_trace/$arch-$type-scores" >/dev/null 2>&1
    fi
    # The v4 and v5 slot flags: substituted slots, slots computed from the low-bit copy.
    if [ "$arch-$type" = qwen3moe-q8_0 ]; then
      "$cli" run -m "$m" -p "Fuzz seeds" -n 3 -t 1 -c 64 --cache-mb 4 --force-cache \
        --substitute-experts 0.5 --route-trace "$seeds/fuzz_route_trace/$arch-$type-subst" >/dev/null 2>&1
      "$cli" make-fallback -m "$m" -o "$tmp/fallback.gguf" -t 1 >/dev/null 2>&1 &&
        "$cli" run -m "$m" -p "Fuzz seeds" -n 3 -t 1 -c 64 --cache-mb 0 --miss-fallback "$tmp/fallback.gguf" \
          --fallback-threshold 1 --route-trace "$seeds/fuzz_route_trace/$arch-$type-fallback" >/dev/null 2>&1
      rm -f "$tmp/fallback.gguf"
    fi
    rm -f "$m"
  done
  touch "$seeds/.done-v5"
fi

mkdir -p "$dir/crashes" "$dir/logs"
run_target() {  # run_target TARGET SECONDS [nice]
  local t="$1" secs="$2" corpus="$dir/corpus/$1"
  mkdir -p "$corpus"
  local -a pre=()
  [ "${3:-}" = nice ] && pre=(nice -n 19)
  local log="$dir/logs/$t-$mode.log"
  if ! "${pre[@]}" "$bin/$t" -max_total_time="$secs" -rss_limit_mb="$rss" -timeout=10 \
       -print_final_stats=1 -artifact_prefix="$dir/crashes/$t-" \
       "$corpus" "$seeds/$t" >"$log" 2>&1; then
    echo "fuzz.sh: $t FAILED (input in $dir/crashes/):" >&2
    tail -40 "$log" >&2
    return 1
  fi
  local execs
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')"
  echo "fuzz.sh: $t: $execs executions in $secs s, no crash (corpus $(ls "$corpus" | wc -l) inputs; $log)" >&2
}

status=0
case "$mode" in
  smoke)
    for t in "${targets[@]}"; do
      reg="tests/fuzz/regressions/$t"
      if [ -d "$reg" ] && [ -n "$(ls -A "$reg")" ]; then
        "$bin/$t" -rss_limit_mb="$rss" -timeout=10 "$reg"/* >"$dir/logs/$t-regressions.log" 2>&1 \
          || { echo "fuzz.sh: $t fails on a regression input:" >&2; tail -40 "$dir/logs/$t-regressions.log" >&2; status=1; }
      fi
      run_target "$t" "${FUZZ_SMOKE_SECONDS:-10}" || status=1
    done
    ;;
  long)
    for t in "${targets[@]}"; do run_target "$t" "${2:-900}" nice || status=1; done
    ;;
  *) echo "fuzz.sh: unknown mode '$mode' (smoke or long)" >&2; exit 64 ;;
esac
exit $status
