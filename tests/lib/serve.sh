# serve.sh — sourced by the tests that drive `moestream serve` over loopback (tests/api/run.sh,
# tests/browser/run.sh): the tiny synth model, made once per build directory, and servers on
# free ports that go away with the test. The caller sets $bin (the CLI) and $work (a scratch
# directory it removes) and calls serve_stop_all from its EXIT trap.

serve_pids=()

# synth_once PATH: the tiny qwen3moe q4_k synth model at PATH, written on first use (to a
# temporary name, then renamed, so a test running at the same time never sees half a file).
synth_once() {
  local path="$1"
  if [ ! -f "$path" ]; then
    "$bin" synth --preset tiny --type q4_k -o "$path.tmp.$$" >/dev/null
    mv "$path.tmp.$$" "$path"
  fi
}

# serve_start NAME DELAY_MS [serve flags...]: `moestream serve --port 0 -v -t 1` (one compute
# thread: the tests run beside others on a 2-core machine) with every token
# delayed by DELAY_MS (MOESTREAM_DEBUG_TOKEN_DELAY_MS); stdout in $work/NAME.out, stderr in
# $work/NAME.err, the pid in $work/NAME.pid.
serve_start() {
  local name="$1" delay="$2"; shift 2
  MOESTREAM_DEBUG_TOKEN_DELAY_MS="$delay" "$bin" serve --port 0 -v -t 1 "$@" \
    >"$work/$name.out" 2>"$work/$name.err" &
  local pid=$!
  serve_pids+=("$pid")
  echo "$pid" >"$work/$name.pid"
}

# serve_url NAME: prints the server's URL once it listens (within 60 s); fails with its log
# when it exits or does not start.
serve_url() {
  local name="$1" url=""
  for _ in $(seq 1 600); do
    url="$(grep -o 'http://127\.0\.0\.1:[0-9]*/' "$work/$name.out" || true)"
    [ -n "$url" ] && { echo "$url"; return 0; }
    kill -0 "$(cat "$work/$name.pid")" 2>/dev/null || { cat "$work/$name.err" >&2; echo "server $name exited" >&2; return 1; }
    sleep 0.1
  done
  cat "$work/$name.err" >&2
  echo "server $name did not start" >&2
  return 1
}

# serve_stop_all: stops every server serve_start started.
serve_stop_all() {
  local p
  for p in "${serve_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}
