#!/usr/bin/env bash
# arm64-gates.sh — the lossless gates for arm64 Linux, on this x86-64 machine: cross-builds
# moestream with Debian's aarch64 toolchain (cmake/aarch64-linux-gnu.cmake) against the arm64
# prefix (scripts/setup-deps.sh --arch arm64) and runs it under user-mode emulation
# (qemu-aarch64-static, started explicitly: binfmt need not be usable). `make test-arm64`;
# part of `make test`. docs/arm64.md says what it covers and what it does not.
#
# Byte identity, arm64 against arm64 (ggml's arm64 kernels are not x86's): streaming variants
# (default cache, cache off, cache off with buffered reads, a 1 MiB forced cache that evicts on
# every token, with or without the poison and residency checks, prefetch into a small cache, a
# cache holding everything with prefetch) give the same 32 token ids, the same logits hash of
# every step and the same final logits bytes as the resident run (--no-stream) of the same
# binary and CPU, on the trained demo model (models/) and a `moestream synth` model. Three
# emulated machines (the variants each runs: the gate calls at the end): a Cortex-A76 (Raspberry
# Pi 5's core: NEON, dot product, FP16; ggml's armv8.2_2 kernels), the emulator's "max" CPU with
# 128-bit SVE and int8 matmul (armv8.6_1 kernels), and the Cortex-A76 with 64 KiB pages (qemu
# -p 65536: the cache's page arithmetic at 64 KiB; the page size in the stats is checked). The
# page-size unit tests (test_page_layout, part of test_residency_cache's CachePageSize) run under
# emulation at 4, 16 and 64 KiB pages.
# Negative control: a planted corrupted expert slice (MOESTREAM_DEBUG_CORRUPT_EXPERT) must change
# the arm64 output, on both models and every machine. The stats must say which I/O paths were taken (O_DIRECT or
# buffered, io_uring or the lanes for read-ahead, page moves) and, where io_uring was wanted and
# is missing (the emulator has none), why.
#
# Env knobs (read here): BUILD_ARM64 (build tree, default build-arm64), JOBS (compile jobs,
# default nproc), QEMU (emulator, default qemu-aarch64-static), MOESTREAM_REQUIRE_ARM64 (below).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build="${BUILD_ARM64:-build-arm64}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
qemu="${QEMU:-qemu-aarch64-static}"
py="${MOESTREAM_PYTHON:-/usr/bin/python3}"  # Debian's: a PATH shim can take 0.3 s a start
jobs="${JOBS:-$(nproc)}"
t0=$(date +%s)
fail() { echo "arm64-gates: FAIL: $*" >&2; exit 1; }
say() { echo "arm64-gates: $*" >&2; }

if [ "$(uname -m)" = aarch64 ]; then
  # Natively on arm64 the whole suite (make test-unit: every gate, against llama.cpp too) runs
  # on this machine's own kernel; the emulated cross build is for other hosts.
  say "this machine is arm64: the native test suite covers arm64; no emulated cross build here"
  exit 0
fi

# ---- build -------------------------------------------------------------------------------
# The arm64 .debs are pinned to Debian sid versions and downloaded (the shared .deb folder holds
# the amd64 ones only). When they cannot be had (no network, or sid has moved past the pins),
# the step is skipped, loudly, naming why; MOESTREAM_REQUIRE_ARM64=1 (env, read here) makes
# that a failure instead.
if ! setup_log=$(scripts/setup-deps.sh --arch arm64 2>&1); then
  printf '%s\n' "$setup_log" | tail -n 5 >&2
  [ "${MOESTREAM_REQUIRE_ARM64:-0}" = 1 ] && fail "the arm64 prefix could not be assembled"
  echo "arm64-gates: SKIP: the arm64 prefix could not be assembled (last lines above); no arm64 gate ran" >&2
  exit 0
fi
deps="${MOESTREAM_DEPS_DIR:-$repo/.deps}/arm64"
if [ ! -f "$build/CMakeCache.txt" ]; then
  # -O1 without debug info (a shorter compile for the CI time budget; the native build's -O2
  # is what a native arm64 `make test` checks) and the CLI without serve and chat
  # (the gates run `run` and `synth`). The kernels computing the compared logits are ggml's,
  # from the arm64 packages, whatever moestream's flags.
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" \
    -DCMAKE_TOOLCHAIN_FILE="$repo/cmake/aarch64-linux-gnu.cmake" \
    -DMOESTREAM_UNIT_TESTS_ONLY="test_page_layout;test_residency_cache" \
    -DMOESTREAM_SERVE_AND_CHAT=OFF >&2
fi
# "all" (= the CLI and the two tests above): one make run compiles them side by side, where
# several --target names would build one after the other (a one-file test compiling alone).
cmake --build "$build" -j "$jobs" >&2
bin="$build/bin/moestream"
readelf -h "$bin" | grep -q "AArch64" || fail "$bin is not an arm64 executable"
t_build=$(date +%s)
backends="$deps/prefix/usr/lib/aarch64-linux-gnu/ggml/backends0"

scratch="$(mktemp -d "${TMPDIR:-/tmp}/arm64-gates.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

# ---- page-size unit tests under emulation ---------------------------------------------------
# The page arithmetic in full; of the cache's CachePageSize suite, the reference-LRU check at
# 16 KiB cache pages and the accounting at every size. Not the checks that look at released
# pages with mincore: the emulator refuses mincore on PROT_NONE pages, and under -p it fills
# mincore's vector per 4 KiB host page (16 bytes where a 64 KiB page wants one), which is also
# why --cache-debug (verify_resident's mincore) stays off at 64 KiB pages below.
say "unit tests, 4 KiB pages"
"$qemu" -cpu cortex-a76 "$build/bin/test_page_layout" --gtest_brief=1 >&2 \
  || fail "test_page_layout with 4 KiB pages"
"$qemu" -cpu cortex-a76 "$build/bin/test_residency_cache" --gtest_brief=1 \
  --gtest_filter='Sizes/CachePageSize.MatchesReferenceLru/16KiB:Sizes/CachePageSize.AccountsInItsPages/*:ResidencyCache.RejectsAPageSizeTheSystemCannotMap' >&2 \
  || fail "test_residency_cache CachePageSize with 4 KiB pages"
say "unit tests, 16 KiB pages"
"$qemu" -cpu cortex-a76 -p 16384 "$build/bin/test_page_layout" --gtest_brief=1 >&2 \
  || fail "test_page_layout with 16 KiB pages"
say "unit tests, 64 KiB pages"
"$qemu" -cpu cortex-a76 -p 65536 "$build/bin/test_page_layout" --gtest_brief=1 >&2 \
  || fail "test_page_layout with 64 KiB pages"
"$qemu" -cpu cortex-a76 -p 65536 "$build/bin/test_residency_cache" --gtest_brief=1 \
  --gtest_filter='Sizes/CachePageSize.AccountsInItsPages/*:ResidencyCache.RejectsAPageSizeTheSystemCannotMap' >&2 \
  || fail "test_residency_cache CachePageSize with 64 KiB pages"

# ---- models -------------------------------------------------------------------------------
trained="$repo/models/moestream-linuxdoc-4l32e-q4_k_m.gguf"
[ -f "$trained" ] || fail "demo model missing: $trained"
synth="$scratch/synth-tiny-qwen3moe-q4_k.gguf"
"$qemu" -cpu cortex-a76 "$bin" synth --preset tiny --arch qwen3moe --type q4_k --seed 7 \
  -o "$synth" > "$scratch/synth.log" 2>&1 || { cat "$scratch/synth.log" >&2; fail "moestream synth"; }

# run NAME CPU PAGE VARIANT MODEL PROMPT [FLAGS...] -> $scratch/NAME.{json,logits,err}
run() {
  local name="$1" cpu="$2" page="$3" variant="$4" model="$5" prompt="$6"; shift 6
  GGML_BACKEND_PATH="$backends/libggml-cpu-$variant.so" "$qemu" -cpu "$cpu" -p "$page" \
    "$bin" run -m "$model" -p "$prompt" -n 32 -t 1 "$@" \
    --stats-json "$scratch/$name.json" --dump-logits "$scratch/$name.logits" \
    > "$scratch/$name.out" 2> "$scratch/$name.err" \
    || { tail -20 "$scratch/$name.err" >&2; fail "$name: moestream run $* exited non-zero"; }
}
# same REF NAME: tokens, per-step logits hash and final logits bytes identical
same() {
  cmp -s "$scratch/$1.logits" "$scratch/$2.logits" || return 1
  "$py" - "$scratch/$1.json" "$scratch/$2.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(0 if a["tokens"] == b["tokens"] and a["logits_sha"] == b["logits_sha"] else 1)
EOF
}
# paths NAME PAGE: the stats name the paths taken; prints them
paths() {
  "$py" - "$scratch/$1.json" "$2" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1])); st = s["settings"]; page = int(sys.argv[2])
assert st["stream"], "not streaming"
assert st["page_bytes"] == page, f"page_bytes {st['page_bytes']}, emulated pages are {page}"
assert st["prefetch_io"] in ("off", "io_uring", "lanes"), st["prefetch_io"]
assert st["prefetch_io"] == ("off" if not s["prefetch"] else st["prefetch_io"])
# io_uring is wanted for read-ahead over O_DIRECT lanes: missing, the stats say why.
if st["prefetch_io"] == "lanes" and st["odirect"]:
    assert st.get("prefetch_io_fallback"), "read-ahead fell back to the lanes without a reason"
assert isinstance(st["cache_move_used"], bool)
assert len(s["tokens"]) == 32, f"{len(s['tokens'])} tokens"
print("odirect=%s prefetch_io=%s%s cache_move_used=%s page_bytes=%d" % (
    st["odirect"], st["prefetch_io"],
    " (" + st["prefetch_io_fallback"] + ")" if st.get("prefetch_io_fallback") else "",
    st["cache_move_used"], st["page_bytes"]))
EOF
}

variants=(
  ""
  "--cache-mb 0"
  "--cache-mb 0 --no-odirect"
  "--cache-mb 1 --force-cache --cache-debug"
  "--cache-mb 4 --force-cache --prefetch"
  "--cache-mb 1000000 --prefetch"
  "--cache-mb 1 --force-cache"
)
n_runs=0
n_pass=0
# gate LABEL CPU PAGE KERNELS VARIANTS: one emulated machine (qemu -cpu CPU -p PAGE, ggml's
# KERNELS build), the streaming variants numbered in VARIANTS ("all" for every one)
gate() {
  local label="$1" cpu="$2" page="$3" kernels="$4" subset="$5" mname model prompt i flags tag
  for mname in trained synth; do
    if [ "$mname" = trained ]; then model="$trained"; prompt="The kernel scheduler"
    else model="$synth"; prompt="Once upon a time"; fi
    tag="$mname-$label"
    run "$tag-ref" "$cpu" "$page" "$kernels" "$model" "$prompt" --no-stream
    n_runs=$((n_runs + 1))
    for i in "${!variants[@]}"; do
      [ "$subset" = all ] || [[ " $subset " == *" $i "* ]] || continue
      flags="${variants[$i]}"
      run "$tag-$i" "$cpu" "$page" "$kernels" "$model" "$prompt" $flags
      n_runs=$((n_runs + 1))
      same "$tag-ref" "$tag-$i" || fail "$tag: '$flags' differs from --no-stream"
      n_pass=$((n_pass + 1))
      say "$tag '${flags:-defaults}': identical to --no-stream | $(paths "$tag-$i" "$page")"
    done
    # The negative control: one corrupted routed slice changes the output.
    MOESTREAM_DEBUG_CORRUPT_EXPERT='1:*' run "$tag-bad" "$cpu" "$page" "$kernels" "$model" "$prompt"
    n_runs=$((n_runs + 1))
    if same "$tag-ref" "$tag-bad"; then
      fail "$tag: a corrupted expert slice left the output unchanged (the comparison sees nothing)"
    fi
    grep -q "corrupt" "$scratch/$tag-bad.err" || fail "$tag: the planted corruption did not announce itself"
    n_pass=$((n_pass + 1))
    say "$tag negative control: corrupted slice detected"
  done
}

# The SVE machine has 128-bit vectors, as phone cores do: at the emulator's default length
# ggml's armv8.6_1 kernels gave different, nonsensical output (resident and streaming alike).
gate a76 cortex-a76 4096 armv8.2_2 "0 1 2 3 4 5"
gate sve128-i8mm max,sve-default-vector-length=16 4096 armv8.6_1 "1 3 4"
gate a76-64k cortex-a76 65536 armv8.2_2 "0 4 6"

t1=$(date +%s)
say "$n_runs emulated runs; build $((t_build - t0)) s, tests $((t1 - t_build)) s, total $((t1 - t0)) s"
echo "arm64-gates: $n_pass passed, 0 failed"
