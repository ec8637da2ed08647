#!/usr/bin/python3
"""bench/report.py — render benchmark results.

  bench/report.py --all             regenerate docs/benchmarks.md from bench/results/*.json
  bench/report.py --all --check     exit 1 if docs/benchmarks.md is not what --all renders
  bench/report.py FILE.json         print one results file's tables
  bench/report.py FILE.json --charts   ... and redraw its charts in docs/img/ (matplotlib)

The statistics are recomputed from the raw per-token data in each file, so a change to
bench/moebench/stats.py applies to old results too. docs/benchmarks.md holds the newest
complete run of every preset (bench/moebench/page.py); never edit it by hand.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from moebench import page, report  # noqa: E402


def print_tables(res: dict) -> None:
    if res["experiment"]["cells"]:
        print(report.table(res))
    for extra in (report.fio_table(res), report.bound_table(res), report.hidden_bound_table(res),
                  report.read_bound_split_table(res), report.prefill_table(res),
                  report.warm_table(res)):
        if extra:
            print()
            print(extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", help="one bench/results/*.json file")
    ap.add_argument("--all", action="store_true", help="regenerate docs/benchmarks.md")
    ap.add_argument("--check", action="store_true", help="with --all: compare, do not write")
    ap.add_argument("--charts", action="store_true", help="with FILE.json: redraw its charts in docs/img/")
    a = ap.parse_args()
    if a.all == bool(a.results):
        ap.error("give either --all or one results file")
    if a.check and not a.all:
        ap.error("--check goes with --all")
    if a.charts and not a.results:
        ap.error("--charts goes with a results file")
    if a.all:
        doc = os.path.join(REPO, "docs", "benchmarks.md")
        text = page.render(REPO)
        if a.check:
            old = open(doc).read() if os.path.exists(doc) else ""
            if old != text:
                print("docs/benchmarks.md differs from what bench/report.py --all renders "
                      "(run it to regenerate)", file=sys.stderr)
                return 1
            return 0
        with open(doc, "w") as f:
            f.write(text)
        print("wrote docs/benchmarks.md", file=sys.stderr)
        return 0
    if not os.path.isfile(a.results):
        print(f"bench/report.py: {a.results}: no such file", file=sys.stderr)
        return 2
    res = page.load(a.results)
    if "experiment" not in res:
        print(f"bench/report.py: {a.results}: not a bench/run.py results file", file=sys.stderr)
        return 2
    if a.charts:
        imgs = report.charts(res, os.path.join(REPO, "docs", "img"))
        print(f"drew {len(imgs)} chart(s) in docs/img/", file=sys.stderr)
    print_tables(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
