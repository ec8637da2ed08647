#!/bin/bash
# bench/ttft-ab.sh — time to first token of two moestream binaries, side by side.
#
#   bench/ttft-ab.sh OLD_BIN NEW_BIN [REPS] [CACHE_MB ...]
#
# For every repetition, every cache budget (default: 0 6000) and both binaries in turn
# (alternating which goes first), drops the page cache and runs
#   moestream run -m MODEL -p "Once upon a time" -n 2 -t 2 --cache-mb C --stats-json ...
# inside the memory cgroup CGROUP (default /sys/fs/cgroup/memory/ms8g, cgroups v1; "-" = none)
# and prints one line per run and a summary (median per binary and budget) of load_s,
# dense_read_s, ttft_s and the run's system CPU. Build the binaries with bench/build-at.sh.
# Needs root (drop_caches, the cgroup). Env: MODEL (default: the bench's repeating-output
# 30B model in /var/tmp/moestream-models), CGROUP, OUT (default /tmp/ttft-ab).
set -eu
usage="usage: bench/ttft-ab.sh OLD_BIN NEW_BIN [REPS] [CACHE_MB|auto ...]"
[ $# -ge 2 ] || { echo "$usage" >&2; exit 64; }
old="$1"; new="$2"; reps="${3:-2}"; shift 2; [ $# -gt 0 ] && shift
caches=("$@"); [ ${#caches[@]} -eq 0 ] && caches=(0 6000)
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "ttft-ab: REPS must be a positive integer, not '$reps'" >&2; exit 64; }
for c in "${caches[@]}"; do
  [[ "$c" =~ ^([0-9]+|auto)$ ]] || { echo "ttft-ab: bad cache budget '$c' (MiB or auto)" >&2; exit 64; }
done
for b in "$old" "$new"; do
  [ -x "$b" ] || { echo "ttft-ab: $b is not an executable" >&2; exit 64; }
done
here="$(cd "$(dirname "$0")" && pwd)"
model="${MODEL:-/var/tmp/moestream-models/qwen3-30b-a3b-qwen3moe-q4_k-g0.65.gguf}"
cg="${CGROUP:-/sys/fs/cgroup/memory/ms8g}"
out="${OUT:-/tmp/ttft-ab}"
mkdir -p "$out"
[ -f "$model" ] || { echo "ttft-ab: no model at $model (set MODEL)" >&2; exit 2; }
procs="-"; [ "$cg" != "-" ] && procs="$cg/cgroup.procs"
if [ "$procs" != "-" ] && [ ! -w "$procs" ]; then
  echo "ttft-ab: cannot write $procs (a cgroups v1 memory group, as root; CGROUP=- for none)" >&2
  exit 2
fi
rows="$out/rows.tsv"; : > "$rows"
for r in $(seq 1 "$reps"); do
  for c in "${caches[@]}"; do
    order=(old new); [ $((r % 2)) -eq 0 ] && order=(new old)
    for which in "${order[@]}"; do
      bin="$old"; [ "$which" = new ] && bin="$new"
      tag="$which-c$c-r$r"
      sync; echo 3 > /proc/sys/vm/drop_caches
      /usr/bin/time -f "%S" -o "$out/$tag.time" "$here/cgexec" "$procs" "$bin" run -m "$model" \
        -p "Once upon a time" -n 2 -t 2 --cache-mb "$c" --stats-json "$out/$tag.json" \
        > "$out/$tag.out" 2>&1 || { echo "ttft-ab: $tag failed, see $out/$tag.out" >&2; exit 1; }
      python3 - "$out/$tag.json" "$out/$tag.time" "$which" "$c" "$r" >> "$rows" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
sys_s = open(sys.argv[2]).read().split()[-1]
print("\t".join([sys.argv[3], sys.argv[4], sys.argv[5], "%.2f" % d["load_s"],
                 "%.2f" % d.get("dense_read_s", 0.0), "%.2f" % d["ttft_s"], sys_s]))
EOF
      tail -1 "$rows"
    done
  done
done
python3 - "$rows" <<'EOF'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()]
print("binary\tcache_mb\truns\tload_s\tdense_read_s\tttft_s (each)\tsys_s")
for which in ("old", "new"):
    for c in sorted({r[1] for r in rows}, key=lambda c: (c == "auto", int(c) if c.isdigit() else 0)):
        sel = [r for r in rows if r[0] == which and r[1] == c]
        med = lambda i: statistics.median(float(r[i]) for r in sel)
        print(f"{which}\t{c}\t{len(sel)}\t{med(3):.2f}\t{med(4):.2f}\t{med(5):.2f} "
              f"({', '.join(r[5] for r in sel)})\t{med(6):.1f}")
EOF
