#!/usr/bin/env bash
# left_out_commands.sh BIN — a CLI built with -DMOESTREAM_SERVE_AND_CHAT=OFF (the sanitizer
# builds) refuses `serve` and `chat` by name: exit 64 and one line naming the subcommand and
# the build option, before touching any file. Negative control: the same check must reject a
# subcommand this build has (`inspect` on a missing file fails for another reason).
set -uo pipefail
bin="${1:?usage: left_out_commands.sh BIN}"
work="$(mktemp -d "${TMPDIR:-/tmp}/left-out.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# refused_by_name CMD: 0 when `BIN CMD -m missing.gguf` exits 64 with the one expected line.
refused_by_name() {
  local cmd="$1" rc
  "$bin" "$cmd" -m "$work/missing.gguf" >"$work/out" 2>"$work/err"
  rc=$?
  [ "$rc" = 64 ] || { echo "$cmd: exit $rc, expected 64" >&2; return 1; }
  [ ! -s "$work/out" ] || { echo "$cmd: wrote to stdout" >&2; return 1; }
  [ "$(wc -l <"$work/err")" = 1 ] || { echo "$cmd: expected one line on stderr:" >&2; cat "$work/err" >&2; return 1; }
  grep -q "^moestream $cmd: not in this build (configured with -DMOESTREAM_SERVE_AND_CHAT=OFF)" \
    "$work/err" || { echo "$cmd: unexpected message:" >&2; cat "$work/err" >&2; return 1; }
}

fail=0
for cmd in serve chat; do
  refused_by_name "$cmd" || fail=1
done
# Negative control: a subcommand this build has is not refused that way.
if refused_by_name inspect 2>/dev/null; then
  echo "negative control: 'inspect' passed the refusal check" >&2
  fail=1
fi
[ "$fail" = 0 ] && echo "left_out_commands: serve and chat refused by name; inspect is not"
exit "$fail"
