#!/usr/bin/python3
"""bench/serve_restart.py — `serve` requests whose prompt prefix was cached: by an earlier
request of the same server process, and by an earlier server run (restart).

  bench/serve_restart.py [--bin build/bin/moestream] [--model GGUF] [--reps 2] [--tokens 32]

Every repetition (interleaved: cold, same process, restart, then the next repetition) starts
with an empty `--prompt-cache DIR` and runs two servers, one after the other, under the same
8 GiB memory cgroup as the bench presets (page cache included; the model file is evicted and
clean caches dropped before every start):

  server 1  `cold`     a streamed /completion request: a shared prefix of --prefix-tokens
                       tokens (default 1024, two prompt batches of -b 512: the prompt cache
                       stores batch-aligned prefixes, docs/prompt-cache.md) then a suffix of
                       its own; the server prefills it all and writes the prefix's KV to DIR.
            `same`     the same prefix, another suffix, in the same server process: the prefix
                       is reused (the engine's kept KV or the prompt cache).
  server 2  `restart`  the same prefix, a third suffix, after a restart: the prefix's KV is
                       restored from DIR and only the suffix is prefilled.

Per request it records the time from sending the request to its first streamed token, the
whole request, and the server's own figures: the response's `moestream.stats` (prompt tokens,
tokens reused in process, prefill seconds, decode tok/s) and `/stats` (prompt tokens restored
from the prompt cache, restore time, first-16 hit rate); per server the load (start to /health
answering). Results go to bench/results/serve-restart-<UTC stamp>.json ("format": 2, rendered
on docs/benchmarks.md by bench/report.py --all) and are printed. Needs root (cgroup,
drop_caches).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from moebench import models, system  # noqa: E402

FORMAT = 2
# The request kinds, in the order a repetition runs them, with what cached their prefix.
KINDS = ("cold", "same", "restart")
SUFFIXES = {"cold": " and the river ran to the sea.",
            "same": " and a fox lived in the wood.",
            "restart": " and the king had three sons."}


def prompt(n: int) -> str:
    """The presets' prompt_tokens prompt: "Once upon a time" repeated, cut to n characters (n
    tokens on the synth models' byte-level vocabulary)."""
    base = "Once upon a time"
    return " ".join([base] * (n // (len(base) + 1) + 1))[:n]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


class Server:
    """One `moestream serve --prompt-cache DIR` under the memory cgroup."""

    def __init__(self, a: argparse.Namespace, label: str):
        system.evict(a.model)
        self.cg = system.MemCgroup(f"serve-restart-{os.getpid()}-{label}", a.mem_cap)
        self.port = str(a.port)
        self.cmd = [os.path.join(HERE, "cgexec"), self.cg.procs_file, a.bin, "serve", "-m", a.model,
                    "--port", self.port, "-t", "2", "--io-threads", "4", "-c", "4096", "-b", "512",
                    "--prompt-cache", a.cache_dir]
        t0 = time.monotonic()
        self.p = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)
        try:
            while True:
                if self.p.poll() is not None:
                    raise SystemExit(f"serve exited ({self.p.returncode}): "
                                     f"{self.p.stderr.read()[-2000:]}")
                try:
                    if get_json(self.url("/health")).get("status") == "ok":
                        break
                except OSError:
                    pass
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        self.load_s = time.monotonic() - t0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def request(self, text: str, tokens: int) -> dict:
        body = json.dumps({"prompt": text, "n_predict": tokens, "temperature": 0,
                           "stream": True}).encode()
        req = urllib.request.Request(self.url("/completion"), data=body,
                                     headers={"Content-Type": "application/json"})
        t1 = time.monotonic()
        first = None
        ms: dict = {}
        with urllib.request.urlopen(req, timeout=3600) as r:
            for line in r:
                if not line.startswith(b"data:"):
                    continue
                if first is None and b'"content"' in line:
                    first = time.monotonic() - t1
                if b'"moestream"' in line:
                    ms = json.loads(line[5:]).get("moestream") or {}
        rec = {"request_to_first_token_s": first, "request_s": time.monotonic() - t1,
               "moestream_stats": ms.get("stats"), "lossy": ms.get("lossy")}
        st = get_json(self.url("/stats"))
        rec["prompt_cache"] = st.get("prompt_cache")
        rec["stats"] = {k: st.get(k) for k in ("n_prompt", "tok_s", "cache_hit_pct")}
        rec["warm_experts"] = st.get("warm_experts")
        return rec

    def stop(self) -> dict:
        self.p.terminate()
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        cg = self.cg.stats()
        self.cg.destroy()
        return cg


def one_rep(a: argparse.Namespace, rep: int) -> list[dict]:
    """cold and same on one server, restart on the next; DIR emptied first."""
    shutil.rmtree(a.cache_dir, ignore_errors=True)
    prefix = prompt(a.prefix_tokens)
    out = []
    for server_kinds in (("cold", "same"), ("restart",)):
        srv = Server(a, f"{server_kinds[0]}-r{rep}")
        recs = []
        try:
            for kind in server_kinds:
                rec = {"rep": rep, "kind": kind, "load_s": srv.load_s, "command": srv.cmd}
                rec.update(srv.request(prefix + SUFFIXES[kind], a.tokens))
                rec["loadavg_after"] = system.loadavg()
                recs.append(rec)
        finally:
            cg = srv.stop()
        for rec in recs:
            rec["cgroup"] = cg
        out += recs
    return out


def line(rec: dict) -> str:
    ms = rec.get("moestream_stats") or {}
    pc = rec.get("prompt_cache") or {}
    return (f"rep {rec['rep']} {rec['kind']:8s}: request -> first token "
            f"{rec['request_to_first_token_s']:.2f} s | request {rec['request_s']:.2f} s | "
            f"prefill {ms.get('prefill_s')} s of {ms.get('n_prompt')} tokens "
            f"({ms.get('n_prompt_reused')} not prefilled, {pc.get('tokens_restored')} "
            f"restored) | load {rec['load_s']:.2f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin", "moestream"))
    ap.add_argument("--model", default=models.preset_path("qwen3-30b-a3b", "qwen3moe", "q4_k", 1, 0.65))
    ap.add_argument("--prefix-tokens", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--mem-cap", type=int, default=8 << 30, help="bytes (default 8 GiB)")
    ap.add_argument("--port", type=int, default=18093)
    ap.add_argument("--cache-dir", default="/var/tmp/moestream-bench-pcache-serve")
    ap.add_argument("--out", default=None, help="results file (default bench/results/...)")
    a = ap.parse_args()
    if not os.path.exists(a.model):
        raise SystemExit(f"{a.model}: no such model (bench/run.py --preset warm-start makes it)")
    if a.reps < 1 or a.tokens < 1 or a.prefix_tokens < 1:
        raise SystemExit("--reps, --tokens and --prefix-tokens must be >= 1")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    res = {"experiment": "serve-restart", "format": FORMAT, "stamp": stamp, "argv": sys.argv,
           "model": a.model, "prefix_tokens": a.prefix_tokens, "tokens": a.tokens,
           "reps": a.reps, "mem_cap": a.mem_cap, "suffixes": SUFFIXES,
           "machine": system.machine_info(a.model), "loadavg_before": system.loadavg(),
           "versions": system.versions(REPO, a.bin, os.path.join(REPO, "scripts", "llama-tool")),
           "requests": []}
    for rep in range(a.reps):
        for rec in one_rep(a, rep):
            res["requests"].append(rec)
            print(line(rec), flush=True)
    shutil.rmtree(a.cache_dir, ignore_errors=True)
    out = a.out or os.path.join(HERE, "results", f"serve-restart-{stamp}.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1, default=str)
        f.write("\n")
    print(f"results: {os.path.relpath(out, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
