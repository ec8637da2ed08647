#!/usr/bin/env python3
"""quality_tables.py — rewrite the generated tables of docs/quality.md from the raw outputs
of tools/train/quality.sh (docs/quality/): the price list (price-list.md), the routing
statistics (routing-{trained,synth}.json) and the replay hit rates (replay-{trained,synth}.json).

    tools/train/quality_tables.py [--doc docs/quality.md] [--dir docs/quality]

Each table sits between `<!-- quality:NAME begin -->` and `<!-- quality:NAME end -->`; the
prose around them (which quotes some of the numbers) is written by hand. Exits non-zero,
naming the file, when an input or a marker is missing."""
import argparse
import json
import os
import re
import sys


def fail(msg):
    print("quality_tables: " + msg, file=sys.stderr)
    sys.exit(1)


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")


def price_table(d):
    path = os.path.join(d, "price-list.md")
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        fail(f"{path}: {e}")
    rows = [l for l in lines if l.startswith("|")]
    if len(rows) < 3:
        fail(f"{path}: no table")
    return "\n".join(rows)


def routing_table(d):
    t = load_json(os.path.join(d, "routing-trained.json"))
    s = load_json(os.path.join(d, "routing-synth.json"))
    out = ["| layer | trained: top share | eff. experts | prev-token overlap (shuffled) "
           "| synth tiny: top share | eff. experts | prev-token overlap (shuffled) |",
           "|---|---|---|---|---|---|---|"]
    for a, b in zip(t["layers"], s["layers"]):
        cell = lambda L: (f"{L['top_expert_share']:.3f} | {L['effective_experts']:.1f} | "
                          f"{L['prev_token_overlap']:.3f} ({L['prev_token_overlap_shuffled']:.3f})")
        out.append(f"| {a['layer']} | {cell(a)} | {cell(b)} |")
    return "\n".join(out)


def replay_table(d):
    def curve(which):
        r = load_json(os.path.join(d, f"replay-{which}.json"))
        return {(x["policy"], x["budget_mib"]): x["hit_pct"] for x in r["results"]}
    t, s = curve("trained"), curve("synth")
    budgets = sorted({b for (_, b) in t})
    out = ["| budget MiB | trained LRU hit % | trained Belady % | synth LRU hit % | synth Belady % |",
           "|---|---|---|---|---|"]
    for b in budgets:
        v = [t.get(("lru", b)), t.get(("belady", b)), s.get(("lru", b)), s.get(("belady", b))]
        if any(x is None for x in v):
            fail(f"replay outputs disagree on the budgets ({b} MiB missing in one)")
        out.append(f"| {b:g} | " + " | ".join(f"{x:.1f}" for x in v) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc", default="docs/quality.md")
    ap.add_argument("--dir", default="docs/quality")
    a = ap.parse_args()
    try:
        doc = open(a.doc).read()
    except OSError as e:
        fail(f"{a.doc}: {e}")
    for name, make in (("price-list", price_table), ("routing", routing_table),
                       ("replay", replay_table)):
        pat = re.compile(rf"(<!-- quality:{name} begin -->\n).*?(\n<!-- quality:{name} end -->)", re.S)
        if not pat.search(doc):
            fail(f"{a.doc}: no <!-- quality:{name} begin/end --> markers")
        table = make(a.dir)
        doc = pat.sub(lambda m: m.group(1) + table + m.group(2), doc)
    with open(a.doc, "w") as f:
        f.write(doc)
    print(f"quality_tables: rewrote 3 tables in {a.doc}")


if __name__ == "__main__":
    main()
