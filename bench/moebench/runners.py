"""One run of one cell: build the command, launch it inside its memory cgroup, watch it,
and parse what it printed into the same metric names for every loader.

Per-token decode times:
  moestream       --stats-csv decode_s (one row per single-token llama_decode)
  llama-completion  the gaps between its per-token debug log lines (`n_remain: N`, printed
                  once per sampled token at debug verbosity, -lv 5) on llama.cpp's own log clock; their sum
                  is checked against its `eval time` line.
  llama-bench     none: one figure per repetition (samples_ts).
"""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import threading
import time
from typing import Any

from . import config, system

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # bench/
CGEXEC = os.path.join(HERE, "cgexec")


class Tools:
    def __init__(self, repo: str, moestream_bin: str):
        self.repo = repo
        self.moestream = moestream_bin
        self.llama_tool = os.path.join(repo, "scripts", "llama-tool")
        self._run_help: str | None = None

    def run_help(self) -> str:
        if self._run_help is None:
            if not os.access(self.moestream, os.X_OK):
                # a dry run's commit not built yet: its help is unknown
                self._run_help = ""
                return self._run_help
            r = subprocess.run([self.moestream, "run", "--help"], capture_output=True, text=True)
            self._run_help = r.stdout + r.stderr
        return self._run_help

    def has_flag(self, flag: str) -> bool:
        return re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", self.run_help(), re.M) is not None


# --------------------------------------------------------------------------- commands

def moestream_args(tools: Tools, exp: config.Experiment, cell: config.Cell, model: str,
                   inspect: dict[str, Any], out_prefix: str) -> tuple[list[str] | None, str | None]:
    """The moestream command, or (None, reason) when the CLI lacks a flag the cell needs."""
    p = cell.params
    a = [tools.moestream, "run", "-m", model, "-p", config.prompt_text(exp, cell), "-n", str(exp.tokens),
         "-t", str(p["threads"]), "-c", str(exp.ctx)] + \
        (["-b", str(exp.batch)] if exp.batch > 0 else []) + \
        ["--stats-json", out_prefix + ".stats.json", "--stats-csv", out_prefix + ".tokens.csv"]
    need: list[str] = []
    if p["loader"] == "resident":
        a.append("--no-stream")
    else:
        a += ["--io-threads", str(p["io_threads"])]
        need.append("--io-threads")
        if not p["odirect"]:
            a.append("--no-odirect")
            need.append("--no-odirect")
        # prefetch is opt-in (--prefetch), except at e50c94e where it was on unless --no-prefetch
        if p["prefetch"] and not tools.has_flag("--no-prefetch"):
            a.append("--prefetch")
            need.append("--prefetch")
        elif not p["prefetch"] and tools.has_flag("--no-prefetch"):
            a.append("--no-prefetch")
        # prefill read-ahead is on by default where it applies since the commit that adds
        # --no-prefill-readahead; before it, no flag meant off
        if p["prefill_readahead"]:
            a.append("--prefill-readahead")
            need.append("--prefill-readahead")
        elif tools.has_flag("--no-prefill-readahead"):
            a.append("--no-prefill-readahead")
        cm = p["cache_mb"]
        if cm == "off" and tools.has_flag("--cache-mb"):
            # since 9db6e53 the CLI's default is auto: "off" must be said (0 = off); before
            # it, no flag meant no cache
            a += ["--cache-mb", "0"]
        elif cm != "off":
            if cm == "all-experts":
                v = inspect.get("cache_all_experts_mib")
                if v is None:
                    return None, "moestream inspect --json has no cache_all_experts_mib"
                cm = int(v) + 1
            a += ["--cache-mb", str(cm)]
            need.append("--cache-mb")
        if p["force_cache"] and p["cache_mb"] != "off":
            a.append("--force-cache")
            need.append("--force-cache")
        if p["drop_cold"] is not None:
            a += ["--drop-cold-experts", str(p["drop_cold"])]
            need.append("--drop-cold-experts")
        if p["route_trace"]:
            a += ["--route-trace", out_prefix + ".trace"]
            need.append("--route-trace")
    if p["n_expert_used"] is not None:
        a += ["--n-expert-used", str(p["n_expert_used"])]
        need.append("--n-expert-used")
    a += p["extra_args"]
    missing = [f for f in need if not tools.has_flag(f)]
    if missing:
        return None, f"`moestream run --help` does not list {', '.join(missing)} (not implemented yet)"
    return a, None


def llama_completion_args(tools: Tools, exp: config.Experiment, cell: config.Cell, model: str,
                          inspect: dict[str, Any]) -> list[str]:
    p = cell.params
    lm = {"llama-mmap": "mmap", "llama-dio": "dio"}[p["loader"]]
    a = [tools.llama_tool, "llama-completion", "-m", model, "-p", config.prompt_text(exp, cell), "-n", str(exp.tokens),
         "--temp", "0", "-s", "1", "-no-cnv", "--no-warmup", "-lm", lm, "--no-repack",
         "-t", str(p["threads"]), "-tb", str(p["threads"]), "-fit", "off", "-c", str(exp.ctx),
         *(["-b", str(exp.batch), "-ub", str(exp.batch)] if exp.batch > 0 else []), "-lv", "5", "--log-timestamps",
         "--log-colors", "off"]
    if p["n_expert_used"] is not None:
        a += ["--override-kv", f"{inspect.get('arch', 'qwen3moe')}.expert_used_count=int:{p['n_expert_used']}"]
    return a + p["extra_args"]


def llama_bench_args(tools: Tools, exp: config.Experiment, cell: config.Cell, model: str,
                     inspect: dict[str, Any]) -> list[str]:
    p = cell.params
    lm = {"bench-mmap": "mmap", "bench-dio": "dio"}[p["loader"]]
    a = [tools.llama_tool, "llama-bench", "-m", model, "-p", "0", "-n", str(exp.tokens), "-r", "1",
         "--no-warmup", "-lm", lm, "--repack", "0", "-t", str(p["threads"]), "-o", "json"]
    return a + p["extra_args"]


def fio_engine_text(iodepth: int) -> str:
    """How the probe reads, for the pages: psync, or io_uring at a queue depth."""
    return "psync" if iodepth <= 1 else f"io_uring, {iodepth} reads in flight per job"


def fio_args(model: str, inspect: dict[str, Any], lanes: int, seconds: int, out_json: str,
             iodepth: int = 1) -> list[str]:
    """Random O_DIRECT reads of the expert region, block = one expert slice (rounded up to
    4 KiB, as an O_DIRECT read of a slice is), numjobs = lanes; synchronous psync like the
    engine's lanes (iodepth 1), or io_uring with iodepth reads in flight per job."""
    slice_b = max(p["slice_bytes"] for p in inspect["projections"])
    bs = (slice_b + 4095) // 4096 * 4096
    offs = [t["file_offset"] for l in inspect["moe_layers"] for t in l["tensors"]]
    ends = [t["file_offset"] + t["tensor_bytes"] for l in inspect["moe_layers"] for t in l["tensors"]]
    lo = min(offs) // 4096 * 4096
    hi = max(ends) // 4096 * 4096
    return ["fio", "--name=expert-slices", f"--filename={model}", "--readonly", "--rw=randread",
            f"--bs={bs}", "--blockalign=4096", "--direct=1"] + (
            ["--ioengine=psync"] if iodepth <= 1 else ["--ioengine=io_uring", f"--iodepth={iodepth}"]) + [
            f"--numjobs={lanes}", "--time_based", f"--runtime={seconds}", f"--offset={lo}",
            f"--size={hi - lo}", "--group_reporting", "--randrepeat=0", "--output-format=json",
            f"--output={out_json}"]


# --------------------------------------------------------------------------- running

class Monitor(threading.Thread):
    """Samples the process (and its cgroup) every `period` s: /proc/PID/io read_bytes,
    major faults, RSS; the cgroup's usage (page cache included)."""

    def __init__(self, pid: int, cg: system.MemCgroup | None, t0: float, period: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.cg, self.t0, self.period = pid, cg, t0, period
        self.samples: list[tuple[float, int | None, int | None, int | None, int | None]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic() - self.t0
            rb = majflt = rss = None
            io = system.read(f"/proc/{self.pid}/io")
            if io:
                m = re.search(r"read_bytes: (\d+)", io)
                rb = int(m.group(1)) if m else None
            st = system.read(f"/proc/{self.pid}/stat")
            if st:
                f = st.rsplit(")", 1)[1].split()
                majflt = int(f[9])
            status = system.read(f"/proc/{self.pid}/status")
            if status:
                m = re.search(r"VmRSS:\s+(\d+) kB", status)
                rss = int(m.group(1)) * 1024 if m else None
            cgu = self.cg.usage() if self.cg else None
            self.samples.append((round(t, 3), rb, majflt, rss, cgu))
            self.stop.wait(self.period)


def launch(cmd: list[str], cg: system.MemCgroup | None, stdout_path: str, stderr_path: str,
           timeout_s: int, cwd: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run cmd inside cg (via bench/cgexec), wait with wait4 for its rusage, kill its process
    group on timeout or Ctrl-C."""
    full = [CGEXEC, cg.procs_file if cg else "-"] + cmd
    cpu0 = system.cpu_times()
    la0 = system.loadavg()
    t0 = time.monotonic()
    with open(stdout_path, "wb") as so, open(stderr_path, "wb") as se:
        p = subprocess.Popen(full, stdout=so, stderr=se, stdin=subprocess.DEVNULL, cwd=cwd,
                             start_new_session=True, env=env)
        mon = Monitor(p.pid, cg, t0)
        mon.start()
        timed_out = False
        status = ru = None
        try:
            deadline = t0 + timeout_s
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid == p.pid:
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    os.killpg(p.pid, signal.SIGKILL)
                    _, status, ru = os.wait4(p.pid, 0)
                    break
                time.sleep(0.05)
        except BaseException:
            try:
                os.killpg(p.pid, signal.SIGKILL)
                os.wait4(p.pid, 0)
            except OSError:
                pass
            p.returncode = -9
            raise
        finally:
            mon.stop.set()
            mon.join()
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    cpu1 = system.cpu_times()
    hz = os.sysconf("SC_CLK_TCK")
    # steal (the hypervisor ran someone else on our vCPUs) is reported on its own
    busy = lambda c: sum(v for k, v in c.items() if k not in ("idle", "iowait", "steal"))  # noqa: E731
    own = ru.ru_utime + ru.ru_stime
    return {
        "command": full,
        "returncode": p.returncode,
        "killed_by_signal": -p.returncode if p.returncode < 0 else None,
        "timed_out": timed_out,
        "wall_s": round(wall, 4),
        "rusage": {"utime_s": ru.ru_utime, "stime_s": ru.ru_stime, "maxrss_bytes": ru.ru_maxrss * 1024,
                   "majflt": ru.ru_majflt, "minflt": ru.ru_minflt,
                   "read_bytes": ru.ru_inblock * 512, "nvcsw": ru.ru_nvcsw, "nivcsw": ru.ru_nivcsw},
        # CPU time the rest of the machine used while this ran (other engineers' builds,
        # the harness itself): a noise indicator on a shared 2-core VM.
        "other_cpu_s": round((busy(cpu1) - busy(cpu0)) / hz - own, 2),
        "steal_s": round((cpu1["steal"] - cpu0["steal"]) / hz, 2),
        "loadavg_before": la0,
        "loadavg_after": system.loadavg(),
        "monitor": mon.samples,
    }


# --------------------------------------------------------------------------- parsing

_TS = re.compile(r"(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ([IDWE]) ")


def _ts(m: re.Match) -> float:
    return int(m.group(1)) * 60 + int(m.group(2)) + int(m.group(3)) / 1e3 + int(m.group(4)) / 1e6


def parse_llama_completion(text: str) -> dict[str, Any]:
    """Timings from llama-completion's timestamped log (-lv 5 --log-timestamps)."""
    out: dict[str, Any] = {}
    remain_t: list[float] = []
    t_sysinfo = None
    # stdout (the generated text) and stderr (the log) are separate files: anchor each log
    # line at its start, so that a digit printed by the model cannot shift a timestamp
    for m in re.finditer(r"(?m)^" + _TS.pattern + r"(.*)", text):
        t = _ts(m)
        msg = m.group(6)
        if msg.startswith("n_remain:"):
            remain_t.append(t)
        elif msg.startswith("system_info:") and t_sysinfo is None:
            t_sysinfo = t
        mm = re.search(r"prompt eval time =\s*([0-9.]+) ms /\s*(\d+) tokens", msg)
        if mm:
            out["prefill_s"] = float(mm.group(1)) / 1e3
            out["n_prompt"] = int(mm.group(2))
        mm = re.search(r"\beval time =\s*([0-9.]+) ms /\s*(\d+) runs", msg)
        if mm and "prompt" not in msg:
            out["llama_eval_s"] = float(mm.group(1)) / 1e3
            out["llama_eval_runs"] = int(mm.group(2))
    if t_sysinfo is not None:
        out["load_s"] = t_sysinfo          # process start -> model + context ready
    if remain_t:
        out["ttft_s"] = remain_t[0]        # process start -> first sampled token
        out["n_generated"] = len(remain_t)
        out["per_token"] = {"decode_s": [b - a for a, b in zip(remain_t, remain_t[1:])],
                            "t_end_s": remain_t[1:]}
        out["t_first_token_s"] = remain_t[0]
        out["t_last_token_s"] = remain_t[-1]
    if out.get("prefill_s") and out.get("n_prompt"):
        out["prefill_tok_s"] = out["n_prompt"] / out["prefill_s"]
    d = out.get("per_token", {}).get("decode_s")
    if d:
        out["decode_s"] = sum(d)
        out["decode_tok_s"] = len(d) / sum(d)
    return out


def parse_llama_bench(stdout: str) -> dict[str, Any]:
    try:
        j = json.loads(stdout[stdout.index("["):])
    except (ValueError, json.JSONDecodeError):
        return {"parse_error": "no JSON array in llama-bench output"}
    tg = [t for t in j if t.get("n_gen", 0) > 0]
    if not tg:
        return {"parse_error": "no tg test in llama-bench output"}
    t = tg[0]
    ns = t.get("samples_ns") or []
    out = {"n_generated": t["n_gen"], "decode_tok_s": t.get("avg_ts"),
           "bench_samples_ts": t.get("samples_ts"), "bench_samples_ns": ns,
           "llama_bench_build": t.get("build_commit")}
    if ns:
        out["decode_s"] = ns[0] / 1e9
    return out


def parse_moestream_summary(stderr: str) -> dict[str, Any]:
    """The run summary moestream prints on stderr (used when --stats-json is off)."""
    out: dict[str, Any] = {}
    pats = {
        "load_s": r"\| load ([0-9.]+) s", "ttft_s": r"first token ([0-9.]+) s",
        "prefill_tok_s": r"prefill \d+ tok ([0-9.]+) tok/s", "n_prompt": r"prefill (\d+) tok",
        "decode_tok_s": r"decode \d+ tok ([0-9.]+) tok/s", "n_generated": r"decode (\d+) tok",
        "flash_mib": r"flash read ([0-9.]+) MiB", "flash_reads": r"MiB in (\d+) reads",
        "io_s": r"\(io ([0-9.]+) s\)", "mib_per_token": r"\| ([0-9.]+) MiB/token",
        "token_demand_mib": r"token demand ([0-9.]+) MiB", "layer_demand_mib": r"widest layer ([0-9.]+) MiB",
        "peak_rss_mib": r"peak RSS ([0-9.]+) MiB", "majflt_per_token": r"major faults/token ([0-9.]+)",
    }
    for k, pat in pats.items():
        m = re.search(pat, stderr)
        if m:
            out[k] = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    conv = {"flash_mib": "flash_bytes_read", "mib_per_token": "bytes_per_token",
            "token_demand_mib": "token_demand_bytes", "layer_demand_mib": "layer_demand_bytes",
            "peak_rss_mib": "peak_rss_bytes"}
    for k, k2 in conv.items():
        if k in out:
            out[k2] = out.pop(k) * (1 << 20)
    return out


STATS_JSON_UTF8_BUG = "invalid UTF-8"


def parse_moestream(prefix: str, stderr: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    sj: dict[str, Any] = {}
    if os.path.exists(prefix + ".stats.json"):
        try:
            with open(prefix + ".stats.json") as f:
                sj = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            return {"parse_error": f"stats json: {e}"}
    else:
        out.update(parse_moestream_summary(stderr))
        out["stats_source"] = "stderr summary + tokens csv (no --stats-json)"
        if "decode_tok_s" not in out:
            return {"parse_error": "no --stats-json file and no run summary on stderr"}
    if sj:
        text = sj.pop("text", "")
        sj["text_len"] = len(text)
        out["stats_json"] = sj
    for k in ("load_s", "ttft_s", "prefill_s", "prefill_tok_s", "decode_s", "decode_tok_s",
              "n_prompt", "n_generated", "peak_rss_bytes", "majflt_per_token", "flash_bytes_read",
              "flash_reads", "io_s", "bytes_per_token", "token_demand_bytes", "layer_demand_bytes",
              "expert_buffer_bytes", "logits_sha"):
        if k in sj:
            out[k] = sj[k]
    # cache / drop-cold figures pass through under cache_* / drop_* whether the CLI writes
    # them flat (cache_hits) or nested ({"cache": {"hits": ...}})
    for k, v in sj.items():
        if isinstance(v, dict) and k in ("cache", "drop_cold", "drop"):
            for k2, v2 in v.items():
                if isinstance(v2, (int, float, str, bool)) or v2 is None:
                    out[f"{k}_{k2}" if not k2.startswith(k) else k2] = v2
        elif k.startswith(("cache_", "drop_", "experts_", "weight_mass_", "resident_expert",
                           "peak_resident_expert", "prefetch_")) or k in ("hit_rate", "hits", "misses"):
            out[k] = v
    if "cache_hit_pct" not in out:
        hits, look = out.get("cache_hits"), out.get("cache_lookups")
        if look is None and hits is not None and out.get("cache_misses") is not None:
            look = hits + out["cache_misses"]
        if isinstance(hits, (int, float)) and isinstance(look, (int, float)) and look > 0:
            out["cache_hit_pct"] = 100.0 * hits / look
    settings = sj.get("settings") or {}
    if isinstance(out.get("cache_budget_bytes"), (int, float)) and out["cache_budget_bytes"] > 0:
        out["cache_budget_mib"] = out["cache_budget_bytes"] / (1 << 20)
    elif isinstance(settings.get("cache_mb"), (int, float)) and settings["cache_mb"] > 0:
        out["cache_budget_mib"] = settings["cache_mb"]
    cols: dict[str, list[float]] = {}
    try:
        with open(prefix + ".tokens.csv") as f:
            header = f.readline().strip().split(",")
            for line in f:
                vals = line.strip().split(",")
                if len(vals) != len(header):
                    continue
                for h, v in zip(header, vals):
                    cols.setdefault(h, []).append(float(v))
    except OSError as e:
        out["parse_error"] = f"tokens csv: {e}"
    out["per_token"] = {k: v for k, v in cols.items() if k != "step"}
    return out


def parse_fio(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            txt = f.read()
        j = json.loads(txt[txt.index("{"):])
        job = j["jobs"][0]["read"]
        return {"bw_bytes_s": job["bw_bytes"], "iops": job["iops"], "io_bytes": job["io_bytes"],
                "runtime_ms": job["runtime"], "clat_mean_us": job["clat_ns"]["mean"] / 1e3,
                "clat_p99_us": job["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1e3}
    except (OSError, ValueError, KeyError, IndexError) as e:
        return {"parse_error": str(e)}


def interp(samples: list, t: float, col: int) -> float | None:
    pts = [(s[0], s[col]) for s in samples if s[col] is not None]
    if not pts:
        return None
    if t <= pts[0][0]:
        return pts[0][1]
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return pts[-1][1]
