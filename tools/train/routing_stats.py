#!/usr/bin/env python3
"""Routing statistics of a qwen3moe GGUF over a text (PyTorch forward, tools/train/model.py).

  routing_stats.py -m MODEL.gguf -f TEXT [--ctx 128] [--json OUT]

Per MoE layer: the share of routed slots taken by the most used expert, the effective number
of experts (exp of the entropy of the usage distribution; n_expert = perfectly even), experts
never used; and locality: the mean share of a token's k experts that the previous token (same
window) also used, next to the same figure with the positions shuffled (the baseline a
routing without locality would give).
"""
import argparse, json, math, os, sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import load_gguf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, c = load_gguf(a.model)
    toks = list(open(a.file, "rb").read())
    n = len(toks) // a.ctx
    x = torch.tensor(toks[:n * a.ctx], dtype=torch.long).view(n, a.ctx)
    routes = [[] for _ in range(c.n_layer)]
    with torch.no_grad():
        for i in range(0, n, 16):
            _, _, r = model(x[i:i + 16], return_routes=True)
            for l, ids in enumerate(r):
                routes[l].append(ids.numpy())
    rng = np.random.default_rng(a.seed)
    out = {"model": os.path.basename(a.model), "text": os.path.basename(a.file), "ctx": a.ctx,
           "tokens": int(n * a.ctx), "n_expert": c.n_expert, "k": c.n_expert_used, "layers": []}
    for l in range(c.n_layer):
        ids = np.concatenate(routes[l])                     # [windows, ctx, k]
        cnt = np.bincount(ids.reshape(-1), minlength=c.n_expert).astype(np.float64)
        p = cnt / cnt.sum()
        ent = -(p[p > 0] * np.log(p[p > 0])).sum()

        def overlap(a_ids):
            prev, cur = a_ids[:, :-1, :], a_ids[:, 1:, :]
            same = (cur[..., :, None] == prev[..., None, :]).any(-1)   # [w, t, k]
            return float(same.mean())
        flat = ids.reshape(-1, c.n_expert_used)
        shuf = flat[rng.permutation(len(flat))].reshape(ids.shape)
        out["layers"].append({"layer": l, "top_expert_share": float(p.max()),
                              "effective_experts": float(math.exp(ent)),
                              "unused_experts": int((cnt == 0).sum()),
                              "prev_token_overlap": overlap(ids),
                              "prev_token_overlap_shuffled": overlap(shuf)})
    s = json.dumps(out, indent=1)
    if a.json:
        open(a.json, "w").write(s + "\n")
    print(s)


if __name__ == "__main__":
    main()
