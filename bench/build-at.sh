#!/usr/bin/env bash
# bench/build-at.sh [REV] — build moestream exactly as committed at REV (default HEAD), from
# a clean `git archive` export outside the work tree, and print the binary's path. Benchmarks
# then name one commit, unaffected by uncommitted edits in the shared work tree or by
# rebuilds of build/. Reuses an earlier build of the same commit.
# Env knobs (read here): MOESTREAM_BENCH_BUILD_DIR (default /var/tmp/moestream-bench-build),
#   JOBS (compile jobs, default 2), MOESTREAM_DEPS_DIR (prefix parent, default <repo>/.deps).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rev="$(git -C "$repo" rev-parse --verify "${1:-HEAD}^{commit}")"
root="${MOESTREAM_BENCH_BUILD_DIR:-/var/tmp/moestream-bench-build}"
src="$root/src-$rev"
bld="$root/build-$rev"
bin="$bld/bin/moestream"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
prefix="${MOESTREAM_DEPS_DIR:-$repo/.deps}/prefix"
[ -d "$prefix" ] || { echo "build-at: $prefix missing: run scripts/setup-deps.sh (make setup)" >&2; exit 2; }
mkdir -p "$root"
if [ ! -f "$src/CMakeLists.txt" ]; then
  rm -rf "$src.tmp"; mkdir -p "$src.tmp"
  git -C "$repo" archive "$rev" | tar -x -C "$src.tmp"
  mv "$src.tmp" "$src"
fi
{
  cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESTREAM_PREFIX="$prefix" \
    -DBUILD_TESTING=OFF
  cmake --build "$bld" --target moestream -j "${JOBS:-2}"
} >&2
[ -x "$bin" ] || { echo "build-at: no $bin after the build" >&2; exit 1; }
echo "$bin"
