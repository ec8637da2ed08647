#!/usr/bin/python3
"""partition_lru.py — decode hit rates of the expert cache's global LRU against LRU with the
budget split equally over the MoE layers (each layer keeps budget / n_layers of experts and
evicts only its own), replayed on a routing CSV such as ../shared/traces/
qwen3-30b-a3b-k6.route.csv (rows turn,phase,step,layer,slot,expert,...; phase 1 = decode).

The question it answers: what a cache whose layers own fixed slots (so that no page is ever
mapped anew for a miss: docs/cache.md, "First access through a new page-table entry") would
give up in hits. Budgets count whole experts (budget // expert bytes), not pages, so the
global column differs slightly from `moestream replay`'s page-granular LRU. Neither side
evicts an expert routed in the layer being staged.

    bench/micro/partition_lru.py ../shared/traces/qwen3-30b-a3b-k6.route.csv 2000 4000 6000
"""
import collections
import sys


def load(path):
    expert_bytes, routings = 0, collections.OrderedDict()
    with open(path) as f:
        header = None
        for line in f:
            if line.startswith("#"):
                for kv in line[1:].split():
                    if kv.startswith("expert_bytes="):
                        expert_bytes = max(expert_bytes, int(kv.split("=", 1)[1]))
                continue
            cols = line.strip().split(",")
            if header is None:
                header = cols
                continue
            d = dict(zip(header, cols))
            key = (int(d["turn"]), int(d["phase"]), int(d["step"]), int(d["layer"]))
            routings.setdefault(key, set()).add(int(d["expert"]))
    if not expert_bytes or not routings:
        raise SystemExit(f"{path}: no '# layer=L expert_bytes=B' header or no routing rows")
    return expert_bytes, list(routings.items())


def stage(lru, key_of, routed, cap):
    """One layer's routing against an OrderedDict LRU of capacity cap; returns the hits."""
    hits = 0
    for e in routed:
        k = key_of(e)
        if k in lru:
            lru.move_to_end(k)
            hits += 1
            continue
        while len(lru) >= cap:
            victim = next((v for v in lru if v not in {key_of(r) for r in routed}), None)
            if victim is None:
                break
            del lru[victim]
        lru[k] = None
    return hits


def decode_hit_pct(routings, cap, n_layers, partitioned):
    glob, per = collections.OrderedDict(), collections.defaultdict(collections.OrderedDict)
    hits = lookups = 0
    for (_, phase, _, layer), routed in routings:
        if partitioned:
            h = stage(per[layer], lambda e: e, routed, max(cap // n_layers, len(routed)))
        else:
            h = stage(glob, lambda e, l=layer: (l, e), routed, cap)
        if phase == 1:
            hits += h
            lookups += len(routed)
    return 100.0 * hits / lookups if lookups else 0.0


def main():
    if len(sys.argv) < 3:
        raise SystemExit("usage: partition_lru.py ROUTE.csv BUDGET_MIB [BUDGET_MIB ...]")
    expert_bytes, routings = load(sys.argv[1])
    n_layers = len({k[3] for k, _ in routings})
    print("budget MiB | experts | global LRU decode hit % | per-layer LRU decode hit %")
    for mib in sys.argv[2:]:
        cap = int(float(mib) * 2**20) // expert_bytes
        print(f"{mib} | {cap} | {decode_hit_pct(routings, cap, n_layers, False):.1f} | "
              f"{decode_hit_pct(routings, cap, n_layers, True):.1f}")


if __name__ == "__main__":
    main()
