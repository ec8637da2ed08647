#!/usr/bin/python3
"""bench/drop_prediction.py [RESULTS_JSON] — predicted vs measured reads avoided by drop-cold.

After `bench/run.py --preset drop-cold` (every run records a route trace into raw/): replays
each lossless run's trace with `moestream replay --drop-cold F` at the run's cache budget
(the prediction) and sets it against what the drop cells measured in the same experiment:
decode cache misses (= expert reads) per decoded token relative to the lossless cells.

The replay cannot model the cache responding to dropping (avoided reads free capacity, which
raises the hit rate of what remains), so it is expected to under-predict the avoided reads
(docs/replay.md). Writes bench/results/drop-prediction-<stamp>.json and regenerates
docs/benchmarks.md (its `drop-prediction` section follows `drop-cold`).

Env knobs: none. Default RESULTS_JSON: the newest bench/results/drop-cold-*.json.
"""
import glob
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def mean(xs):
    return statistics.fmean(xs) if xs else float("nan")


def decode_per_token(run, key):
    pt = run["metrics"].get("per_token") or {}
    v = pt.get(key) or []
    return mean(v)


def arg_after(cmd, flag):
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def main():
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help")):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 64
    if len(sys.argv) == 2:
        path = sys.argv[1]
    else:
        found = sorted(glob.glob(os.path.join(REPO, "bench", "results", "drop-cold-*.json")))
        if not found:
            print("drop_prediction: no bench/results/drop-cold-*.json (run bench/run.py --preset drop-cold)",
                  file=sys.stderr)
            return 2
        path = found[-1]
    with open(path) as f:
        res = json.load(f)
    runs = [r for r in res["runs"] if r.get("status") == "ok" and r.get("cell")]
    lossless = [r for r in runs if r["cell"] == "lossless"]
    drops = {}
    for r in runs:
        f = arg_after(r["command"], "--drop-cold-experts")
        if f is not None:
            drops.setdefault(float(f), []).append(r)
    if not lossless or not drops:
        print(f"drop_prediction: {path}: needs ok runs of cell 'lossless' and of drop cells", file=sys.stderr)
        return 2

    base_miss = mean([decode_per_token(r, "cache_misses") for r in lossless])
    base_bytes = mean([decode_per_token(r, "flash_bytes_read") for r in lossless])
    fracs = sorted(drops)
    pred = {F: [] for F in fracs}
    pred_mass = {F: [] for F in fracs}
    traces = []
    for r in lossless:
        trace = arg_after(r["command"], "--route-trace")
        if not trace or not os.path.exists(trace):
            print(f"drop_prediction: run {r['index']}: trace {trace} missing", file=sys.stderr)
            return 2
        traces.append(trace)
        # the binary precedes its "run" (the harness may wrap it, e.g. bench/cgexec for the cap)
        binary = r["command"][r["command"].index("run") - 1]
        budget_mib = int(r["metrics"]["cache_budget_bytes"]) >> 20
        cmd = [binary, "replay", trace, "--budgets", str(budget_mib), "--json",
               "--drop-cold", ",".join(["0"] + [str(F) for F in fracs])]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if out.returncode != 0:
            print(f"drop_prediction: {' '.join(cmd)} failed:\n{out.stderr}", file=sys.stderr)
            return 1
        rows = json.loads(out.stdout)["results"]
        base = [x for x in rows if x["drop_cold"] == 0][0]
        for F in fracs:
            x = [x for x in rows if abs(x["drop_cold"] - F) < 1e-9][0]
            pred[F].append(1.0 - x["decode_misses"] / base["decode_misses"] if base["decode_misses"] else 0.0)
            pred_mass[F].append(x["weight_mass_discarded"])

    table = []
    for F in fracs:
        miss = mean([decode_per_token(r, "cache_misses") for r in drops[F]])
        byts = mean([decode_per_token(r, "flash_bytes_read") for r in drops[F]])
        mass = mean([r["metrics"].get("weight_mass_dropped", float("nan")) for r in drops[F]])
        table.append({
            "drop_cold": F,
            "predicted_reads_avoided": mean(pred[F]),
            "predicted_reads_avoided_per_trace": pred[F],
            "measured_reads_avoided": 1.0 - miss / base_miss if base_miss else float("nan"),
            "measured_bytes_avoided": 1.0 - byts / base_bytes if base_bytes else float("nan"),
            "predicted_weight_mass_discarded": mean(pred_mass[F]),
            "measured_weight_mass_dropped": mass,
            "decode_misses_per_token": miss,
            "runs": len(drops[F]),
        })

    stamp = os.path.basename(path).rsplit("-", 1)[-1].replace(".json", "")
    out_json = os.path.join(REPO, "bench", "results", f"drop-prediction-{stamp}.json")
    with open(out_json, "w") as f:
        json.dump({"source": os.path.relpath(path, REPO), "traces": traces,
                   "lossless_decode_misses_per_token": base_miss,
                   "lossless_decode_bytes_per_token": base_bytes, "rows": table}, f, indent=1)

    sys.path.insert(0, HERE)
    from moebench import page  # noqa: E402
    with open(out_json) as f:
        print(page.drop_prediction_section(out_json, json.load(f)))
    page.write(REPO)
    print(f"wrote {os.path.relpath(out_json, REPO)} and regenerated docs/benchmarks.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
