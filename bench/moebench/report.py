"""Results JSON -> Markdown tables and PNG charts (the page itself: page.py)."""
from __future__ import annotations

import os
import re
from typing import Any

MiB = 1 << 20


def _f(x: Any, nd: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _ci(d: dict[str, Any] | None, nd: int = 2) -> str:
    if not d:
        return "—"
    return f"{d['value']:.{nd}f} [{d['lo']:.{nd}f}, {d['hi']:.{nd}f}]"


def _mean(d: dict[str, Any] | None, nd: int = 2, scale: float = 1.0) -> str:
    if not d:
        return "—"
    return f"{d['mean'] / scale:.{nd}f}"


def _sched(s: str | None) -> str:
    m = re.search(r"\[(\S+)\]", s or "")
    return m.group(1) if m else str(s)


def cell_status(s: dict[str, Any]) -> str:
    st = s["statuses"]
    if not st:
        return "not run"
    counts: dict[str, int] = {}
    for x in st:
        counts[x] = counts.get(x, 0) + 1
    txt = ", ".join(f"{k}×{v}" if v > 1 else k for k, v in counts.items())
    return txt


def mib_per_token(s: dict[str, Any]) -> str:
    if s.get("loader") == "resident":
        return "—"
    if s.get("mib_read_per_token"):
        return _ci(s["mib_read_per_token"], 1)
    if s.get("proc_read_bytes_per_token_est"):
        return f"≈{s['proc_read_bytes_per_token_est']['mean'] / MiB:.1f}¹"
    return "—"


# A lossy knob's cell -> how often it fired, per rep (the --stats-json counters).
_KNOB_COUNTERS = (("--drop-cold-experts", "experts_dropped", "dropped"),
                  ("--substitute-experts", "experts_substituted", "substituted"),
                  ("--miss-fallback", "experts_fallback", "from the low-bit copy"))


def knob_fired(c: dict[str, Any], s: dict[str, Any]) -> str:
    """'; substituted 0, 0 per rep' for each lossy knob the cell sets ('' for none)."""
    p = c["params"]
    args = list(p.get("extra_args") or [])
    if p.get("drop_cold"):
        args.append("--drop-cold-experts")
    out = ""
    for flag, key, what in _KNOB_COUNTERS:
        if flag not in args:
            continue
        reps = (s.get(key) or {}).get("per_rep")
        out += f"; {what} " + (", ".join(f"{v:.0f}" for v in reps) + " per rep" if reps
                               else "— (no counter)")
    return out


def table(res: dict[str, Any]) -> str:
    sm = res["summary"]["cells"]
    exp = res["experiment"]
    rows = ["| cell | one change vs baseline | decode tok/s [95% CI] | × baseline [95% CI] | "
            "per rep | load s | TTFT s | MiB read/token | engine read MiB/s | peak RSS MiB | "
            "cgroup peak MiB | majflt/token | runs |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in exp["cells"]:
        s = sm[c["name"]]
        change = f"{c['change']} (vs `{c['baseline']}`)" if c["baseline"] else "*reference*"
        per_rep = ", ".join(_f(x) for x in s.get("decode_tok_s_per_rep", [])) or "—"
        hit = ""
        if c["params"].get("cache_mb") == "off" or c["params"]["loader"] != "stream":
            pass
        elif s.get("decode_hit_pct"):
            hit = f"; decode hit {_ci(s['decode_hit_pct'], 1)}%"
        elif s.get("cache_hit_pct"):
            hit = f"; hit {s['cache_hit_pct']['mean']:.1f}%"
        if s.get("cache_budget_mib") and c["params"]["cache_mb"] in ("auto", "all-experts"):
            hit += f"; budget {s['cache_budget_mib']['mean']:.0f} MiB"
        if s.get("prefetch_accuracy_pct") and s.get("prefetch_experts", {}).get("mean"):
            hit += (f"; prefetch: {s['prefetch_accuracy_pct']['mean']:.0f}% of guesses right, "
                    f"{s['prefetch_experts']['mean']:.0f} experts read ahead")
        hit += knob_fired(c, s)
        rows.append("| `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} |".format(
            c["name"], change, _ci(s.get("decode_tok_s")), _ci(s.get("ratio_to_baseline")),
            per_rep, _mean(s.get("load_s")), _mean(s.get("ttft_s")), mib_per_token(s),
            _ci(s.get("engine_read_mib_s"), 0),
            _mean(s.get("peak_rss_bytes"), 0, MiB),
            _f(s["cgroup_max_usage_bytes"] / MiB, 0) if s.get("cgroup_max_usage_bytes") else "—",
            _mean(s.get("majflt_per_token"), 1), cell_status(s), hit))
    return "\n".join(rows)


def fio_table(res: dict[str, Any]) -> str | None:
    fio = res["summary"].get("fio_mib_s")
    if not fio:
        return None
    eng: dict[int, list[str]] = {}
    for c in res["experiment"]["cells"]:
        s = res["summary"]["cells"][c["name"]]
        if c["params"]["loader"] == "stream" and s.get("engine_read_mib_s"):
            eng.setdefault(c["params"]["io_threads"], []).append(
                f"{s['engine_read_mib_s']['value']:.0f} (`{c['name']}`)")
    rows = ["| lanes | fio random O_DIRECT MiB/s (mean; per rep) | engine read MiB/s at these lanes |",
            "|---|---|---|"]
    for k in sorted(fio, key=int):
        v = fio[k]
        rows.append(f"| {k} | {v['mean']:.0f} ({', '.join(f'{x:.0f}' for x in v['per_rep'])}) | "
                    f"{'; '.join(eng.get(int(k), [])) or '—'} |")
    return "\n".join(rows)


def _resident_ref(exp: dict[str, Any], sm: dict[str, Any], c: dict[str, Any],
                  figure: str = "decode_tok_s") -> dict[str, Any] | None:
    """The resident cell that is cell c's compute reference: same threads, same prompt; of
    several (4 KiB pages, huge pages), the fastest at figure, so the bound is the strictest."""
    refs = [r for r in exp["cells"] if r["params"]["loader"] == "resident"
            and r["params"]["threads"] == c["params"]["threads"]
            and r["params"].get("prompt_tokens") == c["params"].get("prompt_tokens")
            and sm[r["name"]].get(figure)]
    return max(refs, key=lambda r: _value(sm[r["name"]][figure]), default=None)


def _value(fig: dict[str, Any]) -> float:
    return fig["value"] if "value" in fig else fig["mean"]


def _bound_inputs(res: dict[str, Any]):
    """Per streaming cell with decode figures and a resident reference: (cell, its summary,
    the reference cell, t_compute s/token, MiB read per token, fio MiB/s at its lanes or None)."""
    exp = res["experiment"]
    sm = res["summary"]["cells"]
    fio = res["summary"].get("fio_mib_s") or {}
    for c in exp["cells"]:
        s = sm[c["name"]]
        if c["params"]["loader"] != "stream" or not s.get("decode_tok_s") or not s.get("mib_read_per_token"):
            continue
        ref = _resident_ref(exp, sm, c)
        if ref is None:
            continue
        yield (c, s, ref, 1.0 / sm[ref["name"]]["decode_tok_s"]["value"],
               s["mib_read_per_token"]["value"], fio.get(str(c["params"]["io_threads"]), {}).get("mean"))


def _per_token_floor(each: list[float], tc: float, f: float) -> float:
    """Σ over tokens of max(t_compute, that token's MiB / fio's MiB/s): the least decode time
    when no token's reads can start before it runs."""
    return sum(max(tc, m / f) for m in each)


def _has_prompt_lengths(exp: dict[str, Any]) -> bool:
    return any(c["params"].get("prompt_tokens") is not None for c in exp["cells"])


def hidden_bound_table(res: dict[str, Any]) -> str | None:
    """Reads hidden behind compute: decode time/token against max(t_compute, MiB read per
    token / fio rate at the cell's lanes); the same bound taken token by token (the mean over
    kept tokens of max(t_compute, that token's MiB / fio rate)); each rep's longest single read
    (a stalled request shows there). Shown for experiments with prompt lengths."""
    if not _has_prompt_lengths(res["experiment"]):
        return None
    rows = []
    for c, s, _ref, tc, mib, f in _bound_inputs(res):
        t_read = mib / f if f else None
        bound = max(tc, t_read) if t_read is not None else None
        meas = 1.0 / s["decode_tok_s"]["value"]
        # The same bound token by token: a token whose reads take longer than the compute
        # cannot be hidden within it (its routing is known only once it runs).
        each = s.get("mib_read_each_token")
        pt = _per_token_floor(each, tc, f) / len(each) if (each and f) else None
        rmax = (s.get("read_max_s") or {}).get("per_rep")
        rmax_ms = ", ".join(f"{1e3 * v:.0f}" for v in rmax) if rmax else "—"
        rows.append(f"| `{c['name']}` | {_f(c['params'].get('prompt_tokens'))} | {tc:.3f} | {mib:.1f} | "
                    f"{_f(t_read, 3)} | {_f(bound, 3)} | {meas:.3f} | "
                    f"{_f(meas / bound if bound else None)} | {_f(pt, 3)} | "
                    f"{_f(meas / pt if pt else None)} | {rmax_ms} |")
    if not rows:
        return None
    return "\n".join([
        "| cell | prompt tokens | t_compute s/token (resident) | MiB read/token | read s/token at fio rate | "
        "max(t_compute, read) s/token | measured s/token | measured / bound | "
        "per-token bound s/token | measured / per-token bound | longest single read ms (per rep) |",
        "|---|---|---|---|---|---|---|---|---|---|---|"] + rows)


def read_bound_split_table(res: dict[str, Any]) -> str | None:
    """The time above max(t_compute, MiB read per token / fio rate), split by token: the kept
    tokens whose reads at fio's rate outlast t_compute (their routing is known only once they
    run, so their reads cannot hide within them: their floor is their read time) and the other
    tokens (their floor is t_compute). Per cell: how many tokens read longer than the compute
    and their share of the MiB read; those tokens' measured time over their read time at fio's
    rate; the other tokens' measured time per token over t_compute; and the whole decode over
    the per-token floor. Shown for experiments with prompt lengths, for cells with per-token
    decode times."""
    if not _has_prompt_lengths(res["experiment"]):
        return None
    rows = []
    for c, s, _ref, tc, _mib, f in _bound_inputs(res):
        each, dec = s.get("mib_read_each_token"), s.get("decode_s_each_token")
        if not (each and dec and f and len(each) == len(dec)):
            continue
        burst = [(m, d) for m, d in zip(each, dec) if m / f > tc]
        other = [d for m, d in zip(each, dec) if m / f <= tc]
        share = sum(m for m, _ in burst) / sum(each) if sum(each) > 0 else 0.0
        b_ratio = sum(d for _, d in burst) / sum(m / f for m, _ in burst) if burst else None
        o_ratio = sum(other) / len(other) / tc if other else None
        floor = sum(max(tc, m / f) for m in each)
        rows.append(f"| `{c['name']}` | {len(burst)} of {len(each)} | {100 * share:.0f}% | "
                    f"{_f(b_ratio)} | {_f(o_ratio)} | {_f(sum(dec) / floor)} |")
    if not rows:
        return None
    return "\n".join([
        "| cell | tokens whose reads at fio rate outlast t_compute | their share of MiB read | "
        "those tokens: measured / their reads at fio rate | other tokens: measured / t_compute | "
        "all tokens: measured / per-token bound |",
        "|---|---|---|---|---|---|"] + rows)


def warm_table(res: dict[str, Any]) -> str | None:
    """Start-up figures (harness._warm_start_figures): the prompt cache's restore and the warm
    expert set's preload against cold starts. Shown for experiments whose cells restore a
    prompt or preload experts."""
    exp = res["experiment"]
    sm = res["summary"]["cells"]
    mean = lambda s, k: (s.get(k) or {}).get("mean")  # noqa: E731
    if not any(mean(sm[c["name"]], "prompt_cache_tokens") or mean(sm[c["name"]], "warm_experts_preloaded")
               for c in exp["cells"]):
        return None
    rows = []
    for c in exp["cells"]:
        s = sm[c["name"]]
        f16, st = mean(s, "first16_tok_s"), mean(s, "steady_tok_s")
        per = lambda k, nd=2: ", ".join(_f(x, nd) for x in (s.get(k) or {}).get("per_rep", [])) or "—"  # noqa: E731
        rows.append(f"| `{c['name']}` | {_f(mean(s, 'prompt_cache_tokens'), 0)} | {_f(mean(s, 'load_s'))} | "
                    f"{_f(mean(s, 'after_load_s'))} ({per('after_load_s')}) | {_f(mean(s, 'ttft_s'))} | "
                    f"{_f(mean(s, 'warm_experts_preloaded'), 0)} | {_f(f16)} ({per('first16_tok_s')}) | "
                    f"{_f(mean(s, 'first16_hit_pct'), 1)} ({per('first16_hit_pct', 1)}) | {_f(st)} | "
                    f"{_f(f16 / st if (f16 and st) else None)} |")
    return "\n".join([
        "| cell | prompt tokens restored | load s | end of load → first token s (per rep) | ttft s | "
        "experts preloaded | first 16 decode tok/s (per rep) | first 16 hit % (per rep) | "
        "steady tok/s (tokens 17+) | first 16 / steady |",
        "|---|---|---|---|---|---|---|---|---|---|"] + rows)


def prefill_table(res: dict[str, Any]) -> str | None:
    """Prefill against the resident cell with the same prompt: prefill tok/s, time to first
    token, and TTFT against the resident prefill time plus the dense read: the cell's dense
    bytes at fio's rate for its lanes (the storage's speed, whatever the engine's dense read
    took; the cell's own dense read when there is no fio figure). Shown for experiments with
    prompt lengths."""
    exp = res["experiment"]
    if not _has_prompt_lengths(exp):
        return None
    sm = res["summary"]["cells"]
    fio = res["summary"].get("fio_mib_s") or {}
    rows = []
    for c in exp["cells"]:
        s = sm[c["name"]]
        if not s.get("prefill_tok_s"):
            continue
        ref = (_resident_ref(exp, sm, c, "prefill_tok_s")
               if c["params"]["loader"] != "resident" else None)
        rs = sm[ref["name"]] if ref else {}
        pt = s["prefill_tok_s"]["mean"]
        n = (s.get("n_prompt") or {}).get("mean")
        rpt = (rs.get("prefill_tok_s") or {}).get("mean")
        rprefill = n / rpt if (n and rpt) else None
        dense = (s.get("dense_read_s") or {}).get("mean")
        dense_bytes = (s.get("dense_read_bytes") or {}).get("mean")
        rate = fio.get(str(c["params"].get("io_threads")), {}).get("mean")
        dense_fio = dense_bytes / 2**20 / rate if (dense_bytes and rate) else None
        ttft = (s.get("ttft_s") or {}).get("mean")
        read = dense_fio if dense_fio is not None else dense
        ref_name = f" (`{ref['name']}`)" if ref else ""
        target = rprefill + (read or 0.0) if rprefill is not None else None
        rows.append(f"| `{c['name']}` | {_f(int(n) if n else None)} | {pt:.2f} | "
                    f"{_f(pt / rpt if rpt else None)} | {_f(ttft)} | "
                    f"{_f(rprefill)}{ref_name} | "
                    f"{_f(dense)} | {_f(dense_fio)} | "
                    f"{_f(ttft / target if (ttft and target) else None)} | "
                    f"{_f((s.get('flash_bytes_read') or {}).get('mean', 0) / 2**30 if s.get('flash_bytes_read') else None)} |")
    if not rows:
        return None
    return "\n".join([
        "| cell | prompt tokens | prefill tok/s | × resident prefill | TTFT s | resident prefill s | "
        "dense read s (run) | dense read s at fio rate | TTFT / (resident prefill + dense read) | "
        "GiB read (run) |",
        "|---|---|---|---|---|---|---|---|---|---|"] + rows)


def bound_table(res: dict[str, Any]) -> str | None:
    """The serial bound per streaming cell: time/token >= t_compute + bytes/bandwidth when
    the reads are not overlapped with compute (docs/benchmark-method.md)."""
    rows = []
    for c, s, ref, tc, mib, f in _bound_inputs(res):
        eng = s.get("engine_read_mib_s", {}) or {}
        t_eng = mib / eng["value"] if eng.get("value") else None
        t_fio = mib / f if f else None
        meas = s["decode_tok_s"]["value"]
        rows.append(f"| `{c['name']}` | {tc:.3f} (`{ref['name']}`) | {mib:.1f} | "
                    f"{_f(t_fio, 3)} | {_f(1 / (tc + t_fio) if t_fio is not None else None)} | "
                    f"{_f(t_eng, 3)} | {_f(1 / (tc + t_eng) if t_eng is not None else None)} | "
                    f"{meas:.2f} | {_f(100 * s['io_share_of_decode'] if s.get('io_share_of_decode') else None, 0)}% |")
    if not rows:
        return None
    return "\n".join([
        "| cell | t_compute s/token (resident) | MiB read/token | read s/token at fio rate | "
        "serial bound tok/s (fio) | read s/token at engine rate | serial bound tok/s (engine rate) | "
        "measured tok/s | decode time blocked on reads |",
        "|---|---|---|---|---|---|---|---|---|"] + rows)


# ---------------------------------------------------------------------- charts

def charts(res: dict[str, Any], img_dir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exp = res["experiment"]
    sm = res["summary"]["cells"]
    name = exp["name"]
    os.makedirs(img_dir, exist_ok=True)
    written = []
    colors = {"stream": "#1f77b4", "resident": "#2ca02c", "llama-mmap": "#d62728",
              "llama-dio": "#ff7f0e", "bench-mmap": "#9467bd", "bench-dio": "#8c564b"}
    cells = [c for c in exp["cells"] if sm[c["name"]].get("decode_tok_s")]
    if cells:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(cells) + 1.6))
        for i, c in enumerate(cells):
            s = sm[c["name"]]
            d = s["decode_tok_s"]
            ax.barh(i, d["value"], color=colors.get(c["params"]["loader"], "grey"),
                    hatch="//" if not c["baseline"] else None, alpha=0.8)
            ax.errorbar(d["value"], i, xerr=[[d["value"] - d["lo"]], [d["hi"] - d["value"]]],
                        fmt="none", ecolor="black", capsize=3)
            reps = [x for x in s.get("decode_tok_s_per_rep", []) if x]
            ax.plot(reps, [i] * len(reps), "k.", ms=4)
        vals = [sm[c["name"]]["decode_tok_s"]["value"] for c in cells]
        if max(vals) / max(min(vals), 1e-9) > 30:
            ax.set_xscale("log")
        ax.set_yticks(range(len(cells)), [c["name"] for c in cells])
        ax.invert_yaxis()
        ax.set_xlabel("decode tok/s (bar: all kept tokens; whisker: 95% bootstrap CI; dots: repetitions)")
        ax.set_title(f"{name}: decode speed ({res['model'].get('preset')}, hatched = reference cells)",
                     fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        p = os.path.join(img_dir, f"bench-{name}-toks.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    mcells = [c for c in exp["cells"] if sm[c["name"]].get("mib_read_per_token")
              or sm[c["name"]].get("proc_read_bytes_per_token_est")]
    if mcells:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(mcells) + 1.6))
        for i, c in enumerate(mcells):
            s = sm[c["name"]]
            if s.get("mib_read_per_token"):
                d = s["mib_read_per_token"]
                ax.barh(i, d["value"], color=colors.get(c["params"]["loader"], "grey"), alpha=0.8)
                ax.errorbar(d["value"], i, xerr=[[d["value"] - d["lo"]], [d["hi"] - d["value"]]],
                            fmt="none", ecolor="black", capsize=3)
            else:
                v = s["proc_read_bytes_per_token_est"]["mean"] / MiB
                ax.barh(i, v, color=colors.get(c["params"]["loader"], "grey"), alpha=0.4, hatch="..")
            if s.get("token_demand_bytes"):
                ax.plot(s["token_demand_bytes"]["mean"] / MiB, i, "k|", ms=14)
        ax.set_yticks(range(len(mcells)), [c["name"] for c in mcells])
        ax.invert_yaxis()
        ax.set_xlabel("MiB read from the model file per decoded token "
                      "(| = routed demand; dotted = llama.cpp, /proc estimate)")
        ax.set_title(f"{name}: flash reads per token", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        p = os.path.join(img_dir, f"bench-{name}-mib-per-token.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    hit = [(c, sm[c["name"]]) for c in exp["cells"]
           if c["params"]["loader"] == "stream" and c["params"]["cache_mb"] != "off"
           and sm[c["name"]].get("decode_hit_pct")]
    if hit:
        fig, ax = plt.subplots(figsize=(6, 4))
        by_lanes: dict[int, list[tuple[float, float]]] = {}
        for c, s in hit:
            cm = c["params"]["cache_mb"]
            x = s.get("cache_budget_mib", {}).get("mean") if isinstance(s.get("cache_budget_mib"), dict) else None
            if x is None:
                x = cm if isinstance(cm, (int, float)) else None
            if x is None:
                continue
            by_lanes.setdefault(c["params"]["io_threads"], []).append((x, s["decode_hit_pct"]["value"]))
        for lanes, pts in sorted(by_lanes.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{lanes} lanes")
        tot = res["model"].get("inspect", {}).get("expert_bytes_total")
        if tot:
            xs = [p[0] for pts in by_lanes.values() for p in pts]
            if xs:
                xx = [0, max(xs) * 1.05]
                ax.plot(xx, [100 * x * MiB / tot for x in xx], "k--", lw=1,
                        label="no locality: budget / all expert bytes")
        ax.set_xlabel("cache budget (MiB)")
        ax.set_ylabel("decode cache hit % (kept tokens)")
        ax.set_title(f"{name}: hit rate vs budget", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        p = os.path.join(img_dir, f"bench-{name}-hit-rate.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    fio = res["summary"].get("fio_mib_s")
    if fio:
        fig, ax = plt.subplots(figsize=(6, 4))
        ks = sorted(fio, key=int)
        ax.plot([int(k) for k in ks], [fio[k]["mean"] for k in ks], "s-", color="grey", label="fio (mean)")
        for k in ks:
            ax.plot([int(k)] * len(fio[k]["per_rep"]), fio[k]["per_rep"], ".", color="grey")
        eng = [(c["params"]["io_threads"], sm[c["name"]]["engine_read_mib_s"]) for c in exp["cells"]
               if c["params"]["loader"] == "stream" and c["params"]["cache_mb"] == "off"
               and sm[c["name"]].get("engine_read_mib_s")]
        if eng:
            eng.sort(key=lambda e: e[0])
            ax.errorbar([e[0] for e in eng], [e[1]["value"] for e in eng],
                        yerr=[[e[1]["value"] - e[1]["lo"] for e in eng], [e[1]["hi"] - e[1]["value"] for e in eng]],
                        fmt="o-", color="#1f77b4", capsize=3, label="moestream decode reads")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("read lanes (fio numjobs / --io-threads)")
        ax.set_ylabel("MiB/s")
        ax.set_title(f"{name}: read rate, engine vs fio", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        p = os.path.join(img_dir, f"bench-{name}-read-rate.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written
