#!/usr/bin/env bash
# arch_matrix.sh — every MoE architecture of llama.cpp's test-llama-archs, reshaped to 8 experts
# top-2 (plus a gate-less nemotron_h_moe), streams exactly like --no-stream and llama-completion,
# and a corrupted expert slice changes every one's output (tests/tools/arch_matrix.py run).
# Then docs/architectures.md must be what that run generates (arch_matrix.py check): a change in
# which architectures stream, or why one does not, fails here until the doc is regenerated with
#   tests/tools/arch_matrix.py doc build/test-models/archs/results.json docs/architectures.md
# Env (set by CTest): MOESTREAM_SRC, MOESTREAM_BIN, LLAMA_TOOL, GGML_BACKEND_PATH,
# MOESTREAM_TEST_MODELS (scratch dir); ARCH_MATRIX_JOBS (default 2); ARCH_MATRIX_ONLY (a regex
# of architectures: only those run, and the doc is not checked; the sanitizer build's subset).
set -euo pipefail
src="${MOESTREAM_SRC:?}"
py="${MOESTREAM_PYTHON:-/usr/bin/python3}"  # Debian's: a PATH shim can take 0.3 s a start
[ -x "${MOESTREAM_BIN:?}" ] || { echo "arch_matrix.sh: no moestream binary at $MOESTREAM_BIN" >&2; exit 1; }
out="${MOESTREAM_TEST_MODELS:-/tmp}/archs"
rm -rf "$out"
if [ -n "${ARCH_MATRIX_ONLY:-}" ]; then
  "$py" "$src/tests/tools/arch_matrix.py" run "$out" --jobs "${ARCH_MATRIX_JOBS:-2}" --only "$ARCH_MATRIX_ONLY"
  echo "arch_matrix.sh: subset '$ARCH_MATRIX_ONLY' only; docs/architectures.md not checked"
  exit 0
fi
"$py" "$src/tests/tools/arch_matrix.py" run "$out" --jobs "${ARCH_MATRIX_JOBS:-2}"
"$py" "$src/tests/tools/arch_matrix.py" check "$out/results.json" "$src/docs/architectures.md"
