#!/usr/bin/python3
"""bench/run.py — run one benchmark experiment and publish its results.

  bench/run.py --preset stream-lanes                 # bench/experiments/stream-lanes.toml
  bench/run.py bench/experiments/capped-8g.toml
  bench/run.py --preset stream-lanes --model tiny --tokens 12 --reps 2   # quick check
  bench/run.py --preset capped-8g --dry-run          # the matrix, the changes, the commands
  bench/run.py --list

Writes bench/results/EXPERIMENT-STAMP.json (machine, versions, commands, every run's raw
per-token data and the statistics), raw tool output under bench/results/raw/ (not
committed), and — when the experiment ran as defined (its own model, all cells) — its
charts in docs/img/ and docs/benchmarks.md regenerated (bench/report.py --all). Needs root for the memory
cgroup, readahead and drop_caches. docs/benchmark-method.md explains the method.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from moebench import config, harness, models, page, report  # noqa: E402


def experiments_dir() -> str:
    return os.path.join(HERE, "experiments")


def list_experiments() -> None:
    for p in sorted(glob.glob(os.path.join(experiments_dir(), "*.toml"))):
        try:
            e = config.load(p)
            tag = " (placeholder)" if e.placeholder else ""
            print(f"{e.name:18s} {len(e.cells):2d} cells x {e.reps} reps, model {e.model}{tag}: {e.title}")
        except config.ConfigError as err:
            print(f"{os.path.basename(p)}: INVALID: {err}")


def select_cells(exp: config.Experiment, names: list[str]) -> None:
    keep = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n in keep:
            continue
        try:
            c = exp.cell(n)
        except KeyError:
            raise SystemExit(f"no cell {n!r} in {exp.name} ({', '.join(c.name for c in exp.cells)})")
        keep.add(n)
        if c.baseline:
            todo.append(c.baseline)
    exp.cells = [c for c in exp.cells if c.name in keep]


def publish(res: dict, docs: bool) -> None:
    """Draw the run's charts in docs/img/ and regenerate docs/benchmarks.md (bench/report.py
    --all), which shows the newest complete run of every preset."""
    if not docs:
        return
    imgs = report.charts(res, os.path.join(REPO, "docs", "img"))
    page.write(REPO)
    print(f"regenerated docs/benchmarks.md and drew {len(imgs)} chart(s) in docs/img/", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", nargs="?", help="an experiment TOML file")
    ap.add_argument("--preset", help="an experiment name from bench/experiments/")
    ap.add_argument("--list", action="store_true", help="list the experiments")
    ap.add_argument("--model", help="override the model: a synth preset (tiny|mid|qwen3-30b-a3b) or a .gguf")
    ap.add_argument("--tokens", type=int, help="override tokens per run")
    ap.add_argument("--reps", type=int, help="override repetitions")
    ap.add_argument("--trim", type=int, help="override decodes dropped at the start of each run")
    ap.add_argument("--cells", help="comma-separated cells to run (their baselines are added)")
    ap.add_argument("--bin", default=os.environ.get("MOESTREAM_BIN", os.path.join(REPO, "build", "bin", "moestream")),
                    help="moestream binary (default build/bin/moestream, env MOESTREAM_BIN)")
    ap.add_argument("--commit", metavar="REV",
                    help="benchmark moestream exactly as committed at REV (bench/build-at.sh builds a "
                         "clean export outside the work tree); overrides --bin")
    ap.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--wait", type=int, default=1800,
                    help="max seconds to wait for other jobs on the model / for free memory")
    ap.add_argument("--dry-run", action="store_true", help="print the matrix and commands, run nothing")
    ap.add_argument("--no-docs", action="store_true",
                    help="do not draw charts or regenerate docs/benchmarks.md (a run with overrides "
                         "never appears there: the page shows complete as-defined runs only)")
    ap.add_argument("--force", action="store_true", help="run a placeholder experiment")
    a = ap.parse_args()

    if a.list:
        list_experiments()
        return 0
    if a.preset:
        path = os.path.join(experiments_dir(), a.preset + ".toml")
    elif a.experiment:
        path = a.experiment
    else:
        ap.error("give an experiment file or --preset NAME (--list lists them)")
    if not os.path.exists(path):
        raise SystemExit(f"{path}: no such experiment (bench/run.py --list)")
    try:
        exp = config.load(path, {"model": a.model, "tokens": a.tokens, "reps": a.reps, "trim": a.trim})
    except config.ConfigError as e:
        raise SystemExit(f"invalid experiment: {e}")
    as_defined = not (a.model or a.tokens or a.reps or a.trim is not None or a.cells)
    if a.cells:
        select_cells(exp, [c.strip() for c in a.cells.split(",") if c.strip()])
    if exp.placeholder and not (a.force or a.dry_run):
        raise SystemExit(f"{exp.name} is a placeholder (its flags may not exist yet): --force to run it")

    if a.dry_run:
        print(f"{exp.name}: {exp.title}\nmodel {exp.model} ({exp.arch}, {exp.type}{models.gain_note(exp.attn_gain)}), "
              f"{exp.tokens} tokens, "
              f"{exp.reps} reps, order {exp.order}, trim {exp.trim}")
        for c in exp.cells:
            ch = f"vs {c.baseline}: {config.describe_change(c, exp.cell(c.baseline))}" if c.baseline else "reference"
            print(f"  {c.name:24s} {ch}")
    commit = None
    if a.commit:
        import subprocess
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", a.commit + "^{commit}"],
                                capture_output=True, text=True, check=True).stdout.strip()
        r = subprocess.run([os.path.join(HERE, "build-at.sh"), commit], stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise SystemExit(f"bench/build-at.sh {commit} failed")
        a.bin = r.stdout.strip().splitlines()[-1]
    os.makedirs(a.results_dir, exist_ok=True)
    h = harness.Harness(exp, REPO, os.path.abspath(a.bin), a.results_dir,
                        os.path.join(a.results_dir, "raw"), wait_s=a.wait, dry_run=a.dry_run,
                        commit=commit)
    if a.dry_run:
        h.preflight()
        from moebench import runners, system  # noqa: F401
        mpath = models.preset_path(exp.model, exp.arch, exp.type, exp.seed, exp.attn_gain) if exp.model in models.PRESETS else exp.model
        ins = models.inspect(h.tools.moestream, mpath) if os.path.exists(mpath) else {}
        if not ins:
            print(f"(model {mpath} not there yet: it will be synthesized)")
            return 0
        ra = system.Readahead(mpath)
        names = [c.name for c in exp.cells] + ([f"fio-lanes-{l}" for l in exp.fio.lanes] if exp.fio else [])
        for i, (rep, n) in enumerate(harness.run_order(exp, names, 0)):
            if rep:
                break
            cell = next((c for c in exp.cells if c.name == n), None)
            rec = h.run_one(i, rep, cell, int(n.rsplit("-", 1)[1]) if cell is None else None, mpath, ins, ra, None)
            env = "".join(f"{k}={v} " for k, v in rec.get("env", {}).items())
            print(f"  [{n}] {rec.get('reason') or env + ' '.join(rec.get('command', []))}")
        return 0

    res = h.run(sys.argv)
    path_out = os.path.join(a.results_dir, f"{exp.name}{'' if as_defined else '--' + os.path.basename(str(exp.model))}"
                            f"-{h.stamp}.json")
    with open(path_out, "w") as f:
        json.dump(res, f, indent=1, default=str)
        f.write("\n")
    print(f"results: {os.path.relpath(path_out, REPO)}", file=sys.stderr)
    in_repo = os.path.abspath(a.results_dir) == os.path.join(HERE, "results")
    publish(res, as_defined and in_repo and exp.publish and not res.get("interrupted") and not a.no_docs)
    if res["experiment"]["cells"]:
        print(report.table(res))
    for extra in (report.fio_table(res), report.bound_table(res), report.hidden_bound_table(res),
                  report.prefill_table(res), report.warm_table(res)):
        if extra:
            print()
            print(extra)
    return 130 if res.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
