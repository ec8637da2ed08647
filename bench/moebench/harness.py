"""Run one experiment: model, preflight, interleaved run order, one cgroup per run, results."""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import random
import shutil
import subprocess
import sys
import time
from typing import Any

from . import config, models, runners, stats, system

SCHEMA = 1


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def fio_cap_bytes(exp: config.Experiment) -> int | None:
    """The memory cap a capped fio probe runs under: the experiment's one cap. Uncapped cells
    (a resident reference, say) do not count, so reads are probed where the engine reads;
    with two different caps, or none, the probe runs uncapped."""
    caps = {config.parse_bytes(c.params["mem_cap"]) for c in exp.cells} - {None}
    if not (exp.fio and exp.fio.capped and len(caps) == 1):
        return None
    return caps.pop()


class Log:
    def __init__(self, path: str | None):
        self.f = open(path, "a") if path else None

    def __call__(self, msg: str) -> None:
        line = f"[{dt.datetime.now().strftime('%H:%M:%S')}] {msg}"
        print(line, file=sys.stderr, flush=True)
        if self.f:
            self.f.write(line + "\n")
            self.f.flush()


def run_order(exp: config.Experiment, names: list[str], seed: int) -> list[tuple[int, str]]:
    """interleaved: A B C, A B C, ...; alternate: A B C, C B A, ...; shuffled: a new random
    permutation per repetition (seeded, recorded)."""
    out = []
    rng = random.Random(seed)
    for r in range(exp.reps):
        seq = list(names)
        if exp.order == "alternate" and r % 2 == 1:
            seq.reverse()
        elif exp.order == "shuffled":
            rng.shuffle(seq)
        out += [(r, n) for n in seq]
    return out


def required_memory(cell: config.Cell, ins: dict[str, Any], cap: int | None) -> int:
    """RAM a run needs to start without hurting anyone (page cache it can drop excluded)."""
    loader = cell.params["loader"]
    if loader == "stream":
        cm = cell.params["cache_mb"]
        if cm == "all-experts":   # the budget runners.py passes: cache_all_experts_mib + 1
            mib = ins.get("cache_all_experts_mib")
            buf = (int(mib) + 1) << 20 if mib is not None else ins.get("expert_bytes_total", 0)
        elif isinstance(cm, int):
            buf = cm << 20
        else:   # off / auto: one token's working set at least
            buf = ins.get("token_working_set_bytes", 0) * (1 if cm == "off" else 2)
        need = ins.get("dense_bytes_total", 0) + buf
    elif loader in ("llama-mmap", "bench-mmap"):
        need = ins.get("file_size", 0)   # mmap prefaults the whole file
    else:
        need = ins.get("file_size", 0)
    return min(need, cap) if cap else need


def snapshot_binary(path: str) -> str:
    sha = system.sha256_file(path)
    d = os.path.join(os.environ.get("MOESTREAM_BENCH_BIN_DIR", "/var/tmp/moestream-bench-bin"), sha[:16])
    dst = os.path.join(d, os.path.basename(path))
    if not os.path.exists(dst):
        os.makedirs(d, exist_ok=True)
        tmp = dst + f".tmp.{os.getpid()}"
        shutil.copy2(path, tmp)
        os.replace(tmp, dst)
    return dst


def resolve_commit(repo: str, rev: str) -> str:
    r = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", rev + "^{commit}"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"commit {rev!r}: not a revision of {repo}: {r.stderr.strip()}")
    return r.stdout.strip()


def build_at(repo: str, commit: str) -> str:
    r = subprocess.run([os.path.join(repo, "bench", "build-at.sh"), commit], stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench/build-at.sh {commit} failed")
    return r.stdout.strip()


class Harness:
    def __init__(self, exp: config.Experiment, repo: str, moestream_bin: str, out_dir: str,
                 raw_root: str, wait_s: int = 1800, dry_run: bool = False, commit: str | None = None):
        self.exp = exp
        self.repo = repo
        self.moestream_src = moestream_bin
        self.commit = commit
        if not dry_run and os.access(moestream_bin, os.X_OK):
            # Other engineers rebuild build/ while an experiment runs: every cell must run the
            # very same binary, so run a private copy (named by its hash).
            moestream_bin = snapshot_binary(moestream_bin)
        self.tools = runners.Tools(repo, moestream_bin)
        # Cells that name a commit run moestream as built at it (bench/build-at.sh), resolved
        # to full hashes here so the results name exactly what ran.
        self.cell_tools: dict[str, runners.Tools] = {}
        self.cell_commits: dict[str, str] = {}
        for rev in sorted({c.params["commit"] for c in exp.cells if c.params.get("commit")}):
            full = resolve_commit(repo, rev)
            self.cell_commits[rev] = full
            if dry_run:   # the binary bench/build-at.sh made before, if any (nothing is built)
                built = os.path.join(os.environ.get("MOESTREAM_BENCH_BUILD_DIR", "/var/tmp/moestream-bench-build"),
                                     f"build-{full}", "bin", "moestream")
                self.cell_tools[rev] = runners.Tools(
                    repo, built if os.access(built, os.X_OK) else f"<build-at {full[:12]}>/moestream")
                continue
            self.cell_tools[rev] = runners.Tools(repo, snapshot_binary(build_at(repo, full)))
        self.out_dir = out_dir
        self.stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.raw = os.path.join(raw_root, f"{exp.name}-{self.stamp}")
        if dry_run:   # commands are printed with a scratch directory; nothing is kept
            import tempfile
            self.raw = tempfile.mkdtemp(prefix=f"bench-dry-{exp.name}-")
        self.wait_s = wait_s
        self.dry_run = dry_run
        os.makedirs(self.raw, exist_ok=True)
        self.log = Log(os.path.join(self.raw, "harness.log"))
        self.results: dict[str, Any] = {}
        # moestream's --stats-json aborts when the generated text is not valid UTF-8 (random
        # weights emit arbitrary bytes); once seen, later runs go without it (stderr summary
        # + --stats-csv carry the figures) and the failed run is repeated.
        self.no_stats_json: str | None = None

    def tools_for(self, cell: config.Cell) -> runners.Tools:
        rev = cell.params.get("commit")
        return self.cell_tools[rev] if rev else self.tools

    # ------------------------------------------------------------------ preflight
    def preflight(self) -> None:
        for t in [self.tools, *([] if self.dry_run else self.cell_tools.values())]:
            if not os.access(t.moestream, os.X_OK):
                raise SystemExit(f"{t.moestream}: not built (make build)")
        loaders = {c.params["loader"] for c in self.exp.cells}
        if loaders & (config.LLAMA_COMPLETION_LOADERS | config.LLAMA_BENCH_LOADERS) and \
                not os.access(self.tools.llama_tool, os.X_OK):
            raise SystemExit(f"{self.tools.llama_tool}: missing")
        if self.exp.fio and not shutil.which("fio"):
            raise SystemExit("fio is not installed: run bench/setup.sh")
        caps = {config.parse_bytes(c.params["mem_cap"]) for c in self.exp.cells}
        system.cleanup_stale_cgroups()
        if any(c is not None for c in caps):
            try:
                cg = system.MemCgroup("probe", min(c for c in caps if c is not None))
                cg.destroy()
            except system.CgroupError as e:
                raise SystemExit(
                    f"REFUSING to run {self.exp.name}: its cells need a memory cap (page cache "
                    f"included) and none can be set here: {e}.\nWithout a cap the model would "
                    "fit in RAM and 'does not fit in RAM' would not be measured. Run as root on a "
                    "kernel with the cgroup v1 memory controller or cgroup v2 with memory "
                    "delegated.") from e
        if any(c.params["readahead_kb"] != "keep" for c in self.exp.cells) and os.geteuid() != 0:
            raise SystemExit("cells set readahead_kb: run as root (or set readahead_kb = \"keep\")")

    # ------------------------------------------------------------------ one run
    def _wait_exclusive(self, model: str) -> list[dict[str, Any]]:
        """Never two jobs on the same (big) model at once: wait while another process has the
        model file on its command line."""
        t0 = time.monotonic()
        waited = []
        while True:
            others = system.other_users_of(model)
            if not others:
                return waited
            if time.monotonic() - t0 > self.wait_s:
                raise RuntimeError(f"other processes use {model} after {self.wait_s} s: {others}")
            if not waited or waited[-1]["pids"] != [o["pid"] for o in others]:
                self.log(f"waiting: {len(others)} other process(es) use the model: "
                         + "; ".join(o["cmdline"][:120] for o in others))
                waited.append({"t": now_utc(), "pids": [o["pid"] for o in others]})
            time.sleep(10)

    def _wait_memory(self, need: int) -> dict[str, Any]:
        t0 = time.monotonic()
        margin = self.exp.mem_margin_mib << 20
        while True:
            avail = system.meminfo().get("MemAvailable", 0)
            if avail >= need + margin:
                return {"mem_available": avail, "needed": need, "waited_s": round(time.monotonic() - t0, 1)}
            if time.monotonic() - t0 > self.wait_s:
                return {"mem_available": avail, "needed": need, "insufficient": True,
                        "waited_s": round(time.monotonic() - t0, 1)}
            self.log(f"waiting: MemAvailable {avail / 2**30:.1f} GiB < needed "
                     f"{(need + margin) / 2**30:.1f} GiB")
            time.sleep(15)

    def run_one(self, *args, **kw) -> dict[str, Any]:
        rec = self._run_one(*args, **kw)
        if rec.get("status") == "failed" and runners.STATS_JSON_UTF8_BUG in rec.get("stderr_tail", "") \
                and self.no_stats_json is None:
            self.no_stats_json = ("--stats-json aborted on generated text that is not valid UTF-8 "
                                  "(nlohmann::json type_error 316); figures from the stderr summary "
                                  "and --stats-csv instead")
            self.log("  -> moestream --stats-json hit the UTF-8 abort: repeating without it")
            first = rec
            rec = self._run_one(*args, **kw)
            rec["repeated_after"] = {k: first.get(k) for k in ("status", "returncode", "stderr_tail")}
        return rec

    def _run_one(self, idx: int, rep: int, cell: config.Cell | None, fio_lanes: int | None,
                model: str, ins: dict[str, Any], ra: system.Readahead,
                fio_cap: int | None) -> dict[str, Any]:
        name = cell.name if cell else f"fio-lanes-{fio_lanes}"
        prefix = os.path.join(self.raw, f"{idx:03d}-{name}-r{rep}")
        rec: dict[str, Any] = {"index": idx, "rep": rep, "cell": name, "started_utc": now_utc()}
        if cell is None:
            p = {"readahead_kb": "keep", "mem_cap": "none", "start": "warm"}
            cap = fio_cap
        else:
            p = cell.params
            cap = config.parse_bytes(p["mem_cap"])
        # A split cell runs on the model's n-shard set (the first shard; every shard cold).
        shards = [model]
        if cell is not None and p.get("split"):
            if self.dry_run:
                shards = models.split_paths(models.split_prefix(model, p["split"]), p["split"])
            else:
                shards = models.ensure_split(self.tools.llama_tool, model, p["split"],
                                             int(ins.get("n_tensors", 0)), self.log)
            model = shards[0]
            rec["model_shards"] = shards
        # the command first: a cell the CLI cannot express is skipped before touching anything
        env = None
        if cell is None:
            cmd = runners.fio_args(model, ins, fio_lanes, self.exp.fio.seconds, prefix + ".fio.json",
                                   self.exp.fio.iodepth)
        elif p["loader"] in config.MOESTREAM_LOADERS:
            cmd, why = runners.moestream_args(self.tools_for(cell), self.exp, cell, model, ins, prefix)
            if cmd is None:
                rec.update(status="skipped", reason=why)
                return rec
            if self.no_stats_json:
                i = cmd.index("--stats-json")
                del cmd[i:i + 2]
                rec["stats_json_off"] = self.no_stats_json
        elif p["loader"] in config.LLAMA_COMPLETION_LOADERS:
            cmd = runners.llama_completion_args(self.tools, self.exp, cell, model, ins)
        else:
            if p["n_expert_used"] is not None:
                rec.update(status="skipped", reason="llama-bench has no --override-kv")
                return rec
            cmd = runners.llama_bench_args(self.tools, self.exp, cell, model, ins)
        if cell is not None and p["omp_wait_policy"] is not None:
            env = dict(os.environ if env is None else env, OMP_WAIT_POLICY=p["omp_wait_policy"])
            rec["omp_wait_policy"] = p["omp_wait_policy"]
        if cell is not None and cell.applies("env") and p["env"]:
            env = dict(os.environ if env is None else env, **p["env"])
            rec["env"] = dict(p["env"])
        if self.dry_run:
            rec.update(status="dry-run", command=cmd)
            return rec
        rec["waited_for_other_jobs"] = self._wait_exclusive(model)
        if cell is not None:
            mem = self._wait_memory(required_memory(cell, ins, cap))
            rec["memory_preflight"] = mem
            if mem.get("insufficient"):
                rec.update(status="skipped", reason=f"MemAvailable {mem['mem_available'] >> 20} MiB < "
                           f"needed {mem['needed'] >> 20} MiB + margin after {self.wait_s} s")
                return rec
        rec["readahead_kb"] = ra.set(p["readahead_kb"])
        rec["readahead_device"] = ra.dev.get("name")
        if p["start"] == "cold":
            rec["evict"] = system.evict(model)
            for other in shards[1:]:
                rec.setdefault("evict_other_shards", []).append(system.evict(other, drop_all=False))
        rec["model_page_cache_bytes_before"] = system.page_cache_resident(model)
        rec["mem_available_before"] = system.meminfo().get("MemAvailable")
        cg = None
        try:
            cg = system.MemCgroup(f"{idx:03d}", cap)
        except system.CgroupError as e:
            if cap is not None:
                raise
            rec["cgroup_error"] = str(e)
        try:
            run = runners.launch(cmd, cg, prefix + ".stdout", prefix + ".stderr",
                                 self.exp.timeout_s, cwd=self.repo, env=env)
            if cg:
                rec["cgroup"] = cg.stats()
        finally:
            if cg:
                cg.destroy()
        rec["readahead_kb_after"] = ra.current()
        mon = run.pop("monitor")
        with open(prefix + ".monitor.json", "w") as f:
            json.dump({"columns": ["t_s", "read_bytes", "majflt", "rss_bytes", "cgroup_usage_bytes"],
                       "samples": mon}, f)
        rec.update(run)
        rec["peak_cgroup_usage_sampled"] = max((s[4] for s in mon if s[4] is not None), default=None)
        stderr = open(prefix + ".stderr", "rb").read().decode(errors="replace")
        stdout = open(prefix + ".stdout", "rb").read().decode(errors="replace")
        oom = bool(rec.get("cgroup", {}).get("oom_kills")) or rec["killed_by_signal"] == 9 and not rec["timed_out"]
        rec["oom_killed"] = oom
        if rec["timed_out"]:
            rec["status"] = "timeout"
        elif oom:
            rec["status"] = "oom"
        elif rec["returncode"] != 0:
            if cell is not None and p["loader"] in config.MOESTREAM_LOADERS and rec["returncode"] == 64:
                rec["status"] = "skipped"
                rec["reason"] = "moestream rejected the command line: " + \
                    (stderr.strip().splitlines() or ["?"])[0][:300]
            else:
                rec["status"] = "failed"
            rec["stderr_tail"] = stderr[-2000:]
        else:
            rec["status"] = "ok"
        if cell is None:
            rec["fio"] = runners.parse_fio(prefix + ".fio.json")
            rec["lanes"] = fio_lanes
            if "parse_error" in rec["fio"] and rec["status"] == "ok":
                rec["status"] = "failed"
            return rec
        if rec["status"] != "ok":
            return rec
        if p["loader"] in config.MOESTREAM_LOADERS:
            m = runners.parse_moestream(prefix, stderr)
        elif p["loader"] in config.LLAMA_COMPLETION_LOADERS:
            m = runners.parse_llama_completion(stderr)
            m["text_tail"] = stdout[-200:]
            # decode-phase reads and faults, from the sampled /proc/PID/io and /proc/PID/stat
            # (llama.cpp's log clock starts at process start, the monitor's at fork)
            if "t_first_token_s" in m and m.get("per_token", {}).get("decode_s"):
                n = len(m["per_token"]["decode_s"])
                rb0 = runners.interp(mon, m["t_first_token_s"], 1)
                rb1 = runners.interp(mon, m["t_last_token_s"], 1)
                mf0 = runners.interp(mon, m["t_first_token_s"], 2)
                mf1 = runners.interp(mon, m["t_last_token_s"], 2)
                if rb0 is not None and rb1 is not None:
                    m["proc_read_bytes_per_token_est"] = (rb1 - rb0) / n
                if mf0 is not None and mf1 is not None:
                    m["majflt_per_token"] = (mf1 - mf0) / n
            if "llama_eval_s" in m and m.get("decode_s"):
                m["log_clock_vs_eval_time"] = m["decode_s"] / m["llama_eval_s"] if m["llama_eval_s"] else None
        else:
            m = runners.parse_llama_bench(stdout)
        if "parse_error" in m:
            rec["status"] = "failed"
            rec["reason"] = m["parse_error"]
        if m.get("n_generated") is not None and m["n_generated"] < self.exp.tokens:
            rec["short"] = f"generated {m['n_generated']} of {self.exp.tokens} tokens (end of generation token?)"
        rec["metrics"] = m
        rec["peak_rss_bytes"] = m.get("peak_rss_bytes") or rec["rusage"]["maxrss_bytes"]
        return rec

    # ------------------------------------------------------------------ experiment
    def run(self, argv: list[str]) -> dict[str, Any]:
        exp = self.exp
        self.preflight()
        # one harness at a time on this machine (runs would disturb each other)
        os.makedirs(models.models_dir(), exist_ok=True)
        lockf = open(os.path.join(models.models_dir(), ".bench.lock"), "w")
        try:
            fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.log("waiting: another bench/run.py holds the benchmark lock")
            fcntl.flock(lockf, fcntl.LOCK_EX)
        minfo = models.ensure(self.tools.moestream, exp.model, exp.arch, exp.type, exp.seed, self.log,
                              attn_gain=exp.attn_gain)
        model = minfo["path"]
        ins = models.inspect(self.tools.moestream, model)
        st = os.stat(model)
        minfo.update(size_bytes=st.st_size,
                     mtime_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime)),
                     sha256_first_64MiB=system.sha256_file(model, 64 << 20),
                     inspect=models.summary(ins))
        names = [c.name for c in exp.cells]
        if exp.fio:
            names += [f"fio-lanes-{l}" for l in exp.fio.lanes]
        order_seed = random.SystemRandom().randrange(1 << 30) if exp.order == "shuffled" else 0
        order = run_order(exp, names, order_seed)
        fio_cap = fio_cap_bytes(exp)
        self.results = {
            "schema": SCHEMA,
            "experiment": {
                "name": exp.name, "title": exp.title, "description": exp.description,
                "source": os.path.relpath(exp.source, self.repo) if exp.source else None,
                "model": exp.model, "arch": exp.arch, "type": exp.type, "seed": exp.seed,
                "attn_gain": exp.attn_gain,
                "prompt": exp.prompt, "tokens": exp.tokens, "reps": exp.reps, "trim": exp.trim,
                "order": exp.order, "order_seed": order_seed, "ctx": exp.ctx, "batch": exp.batch,
                "notes": exp.notes,
                "cells": [{"name": c.name, "params": c.params, "baseline": c.baseline,
                           "change": config.describe_change(c, exp.cell(c.baseline)) if c.baseline else None,
                           "note": c.note} for c in exp.cells],
                "fio_probe": exp.fio.__dict__ if exp.fio else None,
                "fio_cap_bytes": fio_cap,
            },
            "harness_command": argv,
            "started_utc": now_utc(),
            "machine": system.machine_info(model),
            "versions": dict(system.versions(self.repo, self.tools.moestream, self.tools.llama_tool),
                             moestream_bin_source=self.moestream_src,
                             # the commit the binary was built from: exact with --commit
                             # (clean export); otherwise the work tree's HEAD plus whatever
                             # uncommitted edits build/ was compiled with
                             moestream_bin_commit=self.commit,
                             moestream_bin_from=("clean export (bench/build-at.sh)" if self.commit
                                                 else "work tree build (may include uncommitted edits)"),
                             cell_commits={rev: {"commit": full, "moestream_bin": self.cell_tools[rev].moestream}
                                           for rev, full in self.cell_commits.items()}),
            "model": minfo,
            "raw_dir": os.path.relpath(self.raw, self.repo),
            "order": [{"index": i, "rep": r, "cell": n} for i, (r, n) in enumerate(order)],
            "runs": [],
        }
        ra = system.Readahead(model)
        self.results["machine"]["readahead_kb_at_start"] = ra.original
        self.log(f"{exp.name}: {len(order)} runs ({len(names)} cells x {exp.reps} reps, order "
                 f"{exp.order}); model {model}; raw output in {self.raw}")
        with system.Restorer() as undo:
            undo.add(ra.restore)
            for i, (rep, name) in enumerate(order):
                cell = next((c for c in exp.cells if c.name == name), None)
                lanes = int(name.rsplit("-", 1)[1]) if cell is None else None
                self.log(f"run {i + 1}/{len(order)}: {name} rep {rep + 1}")
                try:
                    rec = self.run_one(i, rep, cell, lanes, model, ins, ra, fio_cap)
                except KeyboardInterrupt:
                    self.log("interrupted: restoring readahead, writing partial results")
                    self.results["interrupted"] = True
                    break
                self.results["order"][i]["started_utc"] = rec.get("started_utc")
                self.results["runs"].append(rec)
                self.log("  -> " + _one_line(rec))
                self.save_partial()
        self.results["finished_utc"] = now_utc()
        self.results["machine"]["readahead_kb_at_end"] = ra.current()
        self.results["summary"] = summarize(self.results)
        return self.results

    def save_partial(self) -> None:
        with open(os.path.join(self.raw, "results.partial.json"), "w") as f:
            json.dump(self.results, f, indent=1, default=str)


def _one_line(rec: dict[str, Any]) -> str:
    s = rec.get("status")
    if s in ("skipped", "failed") and rec.get("reason"):
        return f"{s}: {rec['reason']}"
    if "fio" in rec:
        f = rec["fio"]
        return f"{s}: fio {f.get('bw_bytes_s', 0) / 2**20:.0f} MiB/s"
    m = rec.get("metrics", {})
    parts = [s]
    for k, fmt in (("load_s", "load {:.2f}s"), ("ttft_s", "ttft {:.2f}s"),
                   ("decode_tok_s", "decode {:.2f} tok/s"), ("bytes_per_token", "{:.0f} B/tok")):
        if m.get(k) is not None:
            parts.append(fmt.format(m[k]))
    if rec.get("other_cpu_s") is not None:
        parts.append(f"other cpu {rec['other_cpu_s']:.1f}s")
    return " | ".join(parts)


# ---------------------------------------------------------------------- summary

def _kept(rec: dict[str, Any], key: str, trim: int) -> list[float] | None:
    pt = rec.get("metrics", {}).get("per_token") or {}
    v = pt.get(key)
    return None if v is None else list(v[trim:])


FIRST = 16  # the first decode tokens whose speed and hit rate the warm-start figures report


def _warm_start_figures(s: dict[str, Any], ok: list[dict[str, Any]]) -> None:
    """Start-up figures of a cell (report.warm_table): from the end of load to the first token
    (ttft_s - load_s), the prompt tokens restored from --prompt-cache, the experts the
    --warm-experts preload read, and the first FIRST decode tokens (every token, no trim)
    against the rest of the same run: tok/s and cache hit rate."""
    def per_rep(get):
        vals = [get(r.get("metrics", {})) for r in ok]
        vals = [v for v in vals if isinstance(v, (int, float))]
        return {"mean": sum(vals) / len(vals), "per_rep": vals} if vals else None
    sj = lambda m: m.get("stats_json") or {}  # noqa: E731
    figs = {
        "after_load_s": per_rep(lambda m: m["ttft_s"] - m["load_s"]
                                if isinstance(m.get("ttft_s"), (int, float)) and
                                isinstance(m.get("load_s"), (int, float)) else None),
        "prompt_cache_tokens": per_rep(lambda m: sj(m).get("prompt_cache_tokens")),
        "warm_experts_preloaded": per_rep(lambda m: sj(m).get("warm_experts_preloaded")),
    }
    first, rest, hits, looks = [], [], [], []
    for r in ok:
        pt = r.get("metrics", {}).get("per_token") or {}
        d, h, m = pt.get("decode_s"), pt.get("cache_hits"), pt.get("cache_misses")
        if not d or len(d) <= FIRST:
            continue
        first.append(FIRST / sum(d[:FIRST]) if sum(d[:FIRST]) > 0 else None)
        rest.append((len(d) - FIRST) / sum(d[FIRST:]) if sum(d[FIRST:]) > 0 else None)
        if h and m:
            look = sum(h[:FIRST]) + sum(m[:FIRST])
            hits.append(100.0 * sum(h[:FIRST]) / look if look else None)
    for k, v in (("first16_tok_s", first), ("steady_tok_s", rest), ("first16_hit_pct", hits)):
        v = [x for x in v if x is not None]
        figs[k] = {"mean": sum(v) / len(v), "per_rep": v} if v else None
    for k, v in figs.items():
        if v is not None:
            s[k] = v


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    exp = res["experiment"]
    trim = exp["trim"]
    B = stats.DEFAULT_B
    cells: dict[str, Any] = {}
    boots: dict[str, Any] = {}
    for ci, c in enumerate(exp["cells"]):
        name = c["name"]
        runs = [r for r in res["runs"] if r["cell"] == name]
        ok = [r for r in runs if r.get("status") == "ok"]
        seed = stats.SEED + 7919 * (ci + 1)
        s: dict[str, Any] = {
            "baseline": c["baseline"], "change": c["change"], "loader": c["params"]["loader"],
            "runs": len(runs), "ok_runs": len(ok),
            "statuses": [r.get("status") for r in runs],
            "reasons": sorted({r["reason"] for r in runs if r.get("reason")}),
            "oom_kills": sum(1 for r in runs if r.get("oom_killed")),
        }
        dec = [_kept(r, "decode_s", trim) for r in ok]
        if ok and all(d is not None and len(d) > 0 for d in dec):
            t = stats.tok_s(dec, B, seed)
            s["per_token"] = True
            s["n_tokens_kept"] = sum(len(d) for d in dec)
        elif ok and all(r.get("metrics", {}).get("decode_s") for r in ok):
            t = stats.tok_s_from_runs([r["metrics"]["decode_s"] for r in ok],
                                      [r["metrics"]["n_generated"] for r in ok], B, seed)
            s["per_token"] = False
        else:
            t = None
        boots[name] = t
        if ok and s.get("per_token"):
            # steady-state check: kept decodes, second half vs first half of each run
            f1 = f2 = 0.0
            n1 = n2 = 0
            for d in dec:
                h = len(d) // 2
                f1 += sum(d[:h]); n1 += h
                f2 += sum(d[h:]); n2 += len(d) - h
            if n1 and n2 and f1 > 0:
                s["second_half_vs_first_half_s_per_token"] = (f2 / n2) / (f1 / n1)
        s["decode_tok_s"] = stats.public(t)
        s["decode_tok_s_per_rep"] = [
            (len(d) / sum(d)) if d else None for d in dec] if s.get("per_token") else \
            [r.get("metrics", {}).get("decode_tok_s") for r in ok]
        s["decode_tok_s_untrimmed_per_rep"] = [r.get("metrics", {}).get("decode_tok_s") for r in ok]
        for k in ("load_s", "ttft_s", "prefill_tok_s", "majflt_per_token", "peak_rss_bytes",
                  "token_demand_bytes", "layer_demand_bytes", "expert_buffer_bytes",
                  "proc_read_bytes_per_token_est"):
            vals = [r.get("metrics", {}).get(k, r.get(k)) for r in ok]
            vals = [v for v in vals if v is not None]
            if vals:
                s[k] = {"mean": sum(vals) / len(vals), "per_rep": vals}
        # prefill figures (report.prefill_table): the prompt as tokenized, the whole run's
        # bytes read, the dense read at load
        for k, get in (("n_prompt", lambda m: m.get("n_prompt")),
                       ("prefill_s", lambda m: m.get("prefill_s")),
                       ("flash_bytes_read", lambda m: m.get("flash_bytes_read")),
                       ("dense_read_s", lambda m: (m.get("stats_json") or {}).get("dense_read_s")),
                       # read latency (docs/metrics.md, "Read latency"), prefill + decode
                       ("read_p50_s", lambda m: (m.get("stats_json") or {}).get("read_p50_s")),
                       ("read_max_s", lambda m: (m.get("stats_json") or {}).get("read_max_s")),
                       ("dense_read_bytes", lambda m: ((m.get("stats_json") or {}).get("settings")
                                                       or {}).get("load_bytes_read"))):
            vals = [get(r.get("metrics", {})) for r in ok]
            vals = [v for v in vals if isinstance(v, (int, float))]
            if vals:
                s[k] = {"mean": sum(vals) / len(vals), "per_rep": vals}
        ch = [_kept(r, "cache_hits", trim) for r in ok]
        cm = [_kept(r, "cache_misses", trim) for r in ok]
        if ok and all(x is not None for x in ch + cm) and sum(map(sum, ch)) + sum(map(sum, cm)) > 0:
            # decode-only hit rate over the kept tokens (the run-level cache_hit_pct includes
            # the prefill and the cache filling up)
            look = [[h + m for h, m in zip(a, b)] for a, b in zip(ch, cm)]
            hp = stats.ratio_of_sums([[100.0 * h for h in a] for a in ch], look, B, seed)
            s["decode_hit_pct"] = stats.public(hp)
        for k in list(ok[0].get("metrics", {}).keys()) if ok else []:
            if k.startswith(("cache_", "experts_", "weight_mass_", "drop_", "resident_expert",
                             "peak_resident_expert", "prefetch_")) or k in ("hit_rate",):
                vals = [r["metrics"].get(k) for r in ok]
                if all(isinstance(v, (int, float)) for v in vals):
                    s[k] = {"mean": sum(vals) / len(vals), "per_rep": vals}
        _warm_start_figures(s, ok)
        fb = [_kept(r, "flash_bytes_read", trim) for r in ok]
        io = [_kept(r, "io_s", trim) for r in ok]
        dd = [_kept(r, "decode_s", trim) for r in ok]
        if ok and all(x is not None for x in fb):
            ones = [[1.0] * len(x) for x in fb]
            mpt = stats.ratio_of_sums([[v / 2**20 for v in x] for x in fb], ones, B, seed)
            s["mib_read_per_token"] = stats.public(mpt)
            # every kept token's MiB, all reps: the per-token bound (report.hidden_bound_table)
            s["mib_read_each_token"] = [round(v / 2**20, 3) for x in fb for v in x]
            # ... and its decode time, in the same order (report.read_bound_split_table)
            if all(d is not None and len(d) == len(x) for d, x in zip(dd, fb)):
                s["decode_s_each_token"] = [round(v, 6) for x in dd for v in x]
            if all(x is not None for x in io) and sum(sum(x) for x in io) > 0:
                rate = stats.ratio_of_sums([[v / 2**20 for v in x] for x in fb], io, B, seed)
                s["engine_read_mib_s"] = stats.public(rate)
                s["io_share_of_decode"] = sum(sum(x) for x in io) / sum(sum(x) for x in dd)
        cg = [r.get("cgroup", {}).get("max_usage_bytes") for r in runs if r.get("cgroup")]
        if cg:
            s["cgroup_max_usage_bytes"] = max(cg)
        s["other_cpu_s"] = [r.get("other_cpu_s") for r in runs if r.get("other_cpu_s") is not None]
        s["readahead_kb"] = sorted({r.get("readahead_kb") for r in runs if r.get("readahead_kb") is not None})
        s["model_page_cache_bytes_before"] = [r.get("model_page_cache_bytes_before") for r in runs]
        s["short_runs"] = [r["short"] for r in ok if r.get("short")]
        cells[name] = s
    base_of = {c["name"]: c["baseline"] for c in exp["cells"]}
    for c in exp["cells"]:
        if c["baseline"]:
            cells[c["name"]]["ratio_to_baseline"] = stats.public(stats.ratio(boots[c["name"]], boots[c["baseline"]]))
            # A chain of one-variable steps (A vs B vs C): also A against the chain's root, from
            # the same per-token resamples (e.g. streaming with every expert cached vs --no-stream).
            chain = [c["name"], c["baseline"]]
            while base_of.get(chain[-1]) and chain[-1] not in chain[:-1]:
                chain.append(base_of[chain[-1]])
            if len(chain) > 2:
                cells[c["name"]]["ratio_to_root"] = {
                    "root": chain[-1], "via": chain[1:-1],
                    **(stats.public(stats.ratio(boots[c["name"]], boots[chain[-1]])) or {})}
    fio: dict[str, Any] = {}
    for r in res["runs"]:
        if "fio" in r and r.get("status") == "ok":
            fio.setdefault(str(r["lanes"]), []).append(r["fio"]["bw_bytes_s"] / 2**20)
    out = {"cells": cells, "trim": trim, "bootstrap_resamples": B, "bootstrap_seed": stats.SEED}
    if fio:
        out["fio_mib_s"] = {k: {"mean": sum(v) / len(v), "per_rep": v} for k, v in fio.items()}
    return out
