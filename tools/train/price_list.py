#!/usr/bin/env python3
"""The price of each lossy knob on the trained model: `moestream eval` over a grid of settings
(quality: perplexity, KL, top-1 vs the lossless run at the same cache budget; savings: flash
bytes read per token vs that lossless run). Writes OUT.json, OUT.md (a table) and OUT.png (KL
vs read savings; needs python3-matplotlib).

  price_list.py --bin build/bin/moestream -m MODEL -f TEXT -o docs/quality-trained [--max-tokens N]
                [--window W]   (eval --window: each W tokens scored from an empty context; 0 = one context)
                [--only TEXT]  (only the settings whose label contains TEXT; the rows of OUT.json
                                with other labels are kept, so the tables hold every setting)
                [--fallback FILE --fallback-type T]  (a `moestream make-fallback --type T` companion
                                of MODEL: adds the --miss-fallback rows)
"""
import argparse, json, subprocess, sys

GRID = [  # (label, extra flags)
    ("k=3, cache off", ["--cache-mb", "0", "--n-expert-used", "3"]),
    ("k=2, cache off", ["--cache-mb", "0", "--n-expert-used", "2"]),
    ("k=1, cache off", ["--cache-mb", "0", "--n-expert-used", "1"]),
    ("k=3, cache 4 MiB", ["--cache-mb", "4", "--force-cache", "--n-expert-used", "3"]),
    ("k=2, cache 4 MiB", ["--cache-mb", "4", "--force-cache", "--n-expert-used", "2"]),
]
for mb in (2, 4, 8):
    for f in (0.5, 0.75, 1.0):
        GRID.append((f"drop-cold {f}, cache {mb} MiB",
                     ["--cache-mb", str(mb), "--force-cache", "--drop-cold-experts", str(f)]))
GRID.append(("k=3 + drop-cold 0.75, cache 4 MiB",
             ["--cache-mb", "4", "--force-cache", "--n-expert-used", "3", "--drop-cold-experts", "0.75"]))
for mb in (2, 4, 8):
    for m in (0.05, 0.1, 0.2):
        GRID.append((f"substitute {m}, cache {mb} MiB",
                     ["--cache-mb", str(mb), "--force-cache", "--substitute-experts", str(m)]))
FALLBACK_W = (0.05, 0.1, 0.2)


def fallback_grid(path, ty):
    return [(f"fallback {ty} {w}, cache {mb} MiB",
             ["--cache-mb", str(mb), "--force-cache", "--miss-fallback", path,
              "--fallback-threshold", str(w)]) for mb in (2, 4, 8) for w in FALLBACK_W]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=2000)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--only", default="")
    ap.add_argument("--fallback", default="")
    ap.add_argument("--fallback-type", default="Q2_K")
    a = ap.parse_args()
    grid = GRID + (fallback_grid(a.fallback, a.fallback_type) if a.fallback else [])
    rows = []
    kept = {}
    if a.only:
        try:
            kept = {r["setting"]: r for r in json.load(open(a.out + ".json"))}
        except FileNotFoundError:
            pass
    for label, extra in grid:
        if a.only and a.only not in label:
            if label in kept:
                rows.append(kept[label])
            continue
        ctx = a.window if a.window else a.max_tokens
        cmd = [a.bin, "eval", "-m", a.model, "-f", a.file, "-t", "2", "-c", str(max(16, ctx)),
               "--max-tokens", str(a.max_tokens), "--window", str(a.window), "--json"] + extra
        j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        ref_b, run_b = j["reference"].get("bytes_per_token", 0.0), j["bytes_per_token"]
        rows.append({"setting": label, "flags": " ".join(extra), "ppl": j["perplexity"],
                     "ppl_ref": j["perplexity_reference"]["value"], "kl": j["mean_kl_nats"],
                     "top1": j["top1_agreement_pct"], "bytes_per_token": run_b,
                     "ref_bytes_per_token": ref_b,
                     "read_savings": (1 - run_b / ref_b) if ref_b > 0 else 0.0,
                     "tokens": j["tokens"], "window": j.get("window", 0)})
        print(f"{label}: KL {j['mean_kl_nats']['value']:.4f} top1 {j['top1_agreement_pct']['value']:.1f}% "
              f"ppl {j['perplexity']['value']:.3f} (ref {rows[-1]['ppl_ref']:.3f}) "
              f"reads {run_b / 1024:.1f} vs {ref_b / 1024:.1f} KiB/token", file=sys.stderr, flush=True)
    json.dump(rows, open(a.out + ".json", "w"), indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("| setting | perplexity [95% CI] | lossless ppl | mean KL (nats) [95% CI] | top-1 agreement | "
                "KiB read / token (lossless) | reads avoided |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['setting']} | {r['ppl']['value']:.3f} [{r['ppl']['lo']:.3f}, {r['ppl']['hi']:.3f}] | "
                    f"{r['ppl_ref']:.3f} | {r['kl']['value']:.4f} [{r['kl']['lo']:.4f}, {r['kl']['hi']:.4f}] | "
                    f"{r['top1']['value']:.1f}% [{r['top1']['lo']:.1f}, {r['top1']['hi']:.1f}] | "
                    f"{r['bytes_per_token'] / 1024:.1f} ({r['ref_bytes_per_token'] / 1024:.1f}) | "
                    f"{100 * r['read_savings']:.1f}% |\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        colors = {"cache off": "tab:gray", "cache 2 MiB": "tab:blue", "cache 4 MiB": "tab:orange",
                  "cache 8 MiB": "tab:green"}
        for ax, key, ylabel in ((axes[0], "kl", "mean KL vs lossless (nats/token)"),
                                (axes[1], "top1", "top-1 agreement with lossless (%)")):
            seen = set()
            for r in rows:
                knob, cache = r["setting"].rsplit(", ", 1)
                marker = "*" if "+" in knob else ("s" if knob.startswith("k=") else "o")
                if knob.startswith("substitute"):
                    marker = "^"
                if knob.startswith("fallback"):
                    marker = "v"
                short = knob.replace("drop-cold ", "F=").replace("substitute ", "M=").replace(" + ", "+")
                if knob.startswith("fallback"):
                    short = "W=" + knob.rsplit(" ", 1)[1]
                lab = cache if cache not in seen else None
                seen.add(cache)
                ax.scatter(100 * r["read_savings"], r[key]["value"], marker=marker, s=60 if marker == "*" else 36,
                           color=colors.get(cache, "black"), label=lab)
                ax.annotate(short, (100 * r["read_savings"], r[key]["value"]), fontsize=7,
                            xytext=(4, 2), textcoords="offset points")
            ax.set_xlabel("flash reads avoided vs lossless at the same cache budget (%)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0].legend(title="circle: drop-cold, square: fewer experts, star: both, triangle: substitute", fontsize=7,
                       title_fontsize=7)
        fig.suptitle("Trained model: quality vs read savings per lossy setting (moestream eval)")
        fig.tight_layout()
        fig.savefig(a.out + ".png", dpi=110)
    except ImportError:
        print("matplotlib missing: no chart", file=sys.stderr)


if __name__ == "__main__":
    main()
