#!/usr/bin/python3
"""bench/report.py RESULTS.json [--no-docs] — re-render a results file: print its table and
(re)generate its section in docs/benchmarks.md and its charts in docs/img/. The statistics
are recomputed from the raw per-token data in the file, so a change to bench/moebench/stats.py
applies to old results too."""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from moebench import harness, report  # noqa: E402
from run import publish  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("results")
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args()
    with open(a.results) as f:
        res = json.load(f)
    res["summary"] = harness.summarize(res)
    publish(res, os.path.abspath(a.results), not a.no_docs)
    if res["experiment"]["cells"]:
        print(report.table(res))
    for extra in (report.fio_table(res), report.bound_table(res)):
        if extra:
            print()
            print(extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
