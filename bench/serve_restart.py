#!/usr/bin/python3
"""bench/serve_restart.py — a `serve` request whose prompt an earlier server run cached.

  bench/serve_restart.py [--bin build/bin/moestream] [--model GGUF] [--reps 2]

Starts `moestream serve --prompt-cache DIR` under the same 8 GiB memory cgroup as the bench
presets (page cache included; model file evicted and clean caches dropped before every start),
sends one streamed /completion request with a 1000-token prompt and 32 tokens to predict,
stops the server, and does it again: the first server prefills the prompt and writes its KV
to DIR, every later one restores it. Per server start it records the load (start to /health
answering), the time from sending the request to its first streamed token, the whole request,
and the server's /stats figures of that request (prompt tokens restored, first-16 hit rate).
The cold/restored pairs run `--reps` times (DIR is emptied before each pair). Results go to
bench/results/serve-restart-<UTC stamp>.json and are printed. Needs root (cgroup, drop_caches).
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


def prompt(n: int) -> str:
    """The presets' prompt_tokens prompt: "Once upon a time" repeated, cut to n characters (n
    tokens on the synth models' byte-level vocabulary)."""
    base = "Once upon a time"
    return " ".join([base] * (n // (len(base) + 1) + 1))[:n]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def one_server(a: argparse.Namespace, label: str) -> dict:
    system.evict(a.model)
    cg = system.MemCgroup(f"serve-restart-{os.getpid()}-{label}", a.mem_cap)
    port = str(a.port)
    cmd = [os.path.join(HERE, "cgexec"), cg.procs_file, a.bin, "serve", "-m", a.model,
           "--port", port, "-t", "2", "--io-threads", "4", "-c", "4096", "-b", "512",
           "--prompt-cache", a.cache_dir]
    rec: dict = {"label": label, "command": cmd}
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            if p.poll() is not None:
                raise SystemExit(f"serve exited ({p.returncode}): {p.stderr.read()[-2000:]}")
            try:
                if get_json(f"http://127.0.0.1:{port}/health").get("status") == "ok":
                    break
            except OSError:
                pass
            time.sleep(0.05)
        rec["load_s"] = time.monotonic() - t0
        body = json.dumps({"prompt": prompt(a.prompt_tokens), "n_predict": a.tokens,
                           "temperature": 0, "stream": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        t1 = time.monotonic()
        first = None
        with urllib.request.urlopen(req, timeout=3600) as r:
            for line in r:
                if first is None and line.startswith(b"data:") and b'"content"' in line:
                    first = time.monotonic() - t1
        rec["request_to_first_token_s"] = first
        rec["request_s"] = time.monotonic() - t1
        st = get_json(f"http://127.0.0.1:{port}/stats")
        rec["prompt_cache"] = st.get("prompt_cache")
        rec["stats"] = {k: st.get(k) for k in ("n_prompt", "tok_s", "cache_hit_pct", "lossy")}
        rec["cgroup"] = cg.stats()
    finally:
        p.terminate()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        cg.destroy()
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin", "moestream"))
    ap.add_argument("--model", default=models.preset_path("qwen3-30b-a3b", "qwen3moe", "q4_k", 1, 0.65))
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--mem-cap", type=int, default=8 << 30, help="bytes (default 8 GiB)")
    ap.add_argument("--port", type=int, default=18093)
    ap.add_argument("--cache-dir", default="/var/tmp/moestream-bench-pcache-serve")
    a = ap.parse_args()
    if not os.path.exists(a.model):
        raise SystemExit(f"{a.model}: no such model (bench/run.py --preset warm-start makes it)")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    res = {"experiment": "serve-restart", "stamp": stamp, "argv": sys.argv, "model": a.model,
           "machine": system.machine_info(a.model), "loadavg_before": system.loadavg(),
           "versions": system.versions(REPO, a.bin, os.path.join(REPO, "scripts", "llama-tool")),
           "runs": []}
    for rep in range(a.reps):
        shutil.rmtree(a.cache_dir, ignore_errors=True)
        for label in ("cold", "restored"):
            rec = one_server(a, f"{label}-r{rep}")
            rec["loadavg_after"] = system.loadavg()
            res["runs"].append(rec)
            pc = rec.get("prompt_cache") or {}
            print(f"{rec['label']}: load {rec['load_s']:.2f} s | request -> first token "
                  f"{rec['request_to_first_token_s']:.2f} s | request {rec['request_s']:.2f} s | "
                  f"prompt tokens restored {pc.get('tokens_restored')}", flush=True)
    shutil.rmtree(a.cache_dir, ignore_errors=True)
    out = os.path.join(HERE, "results", f"serve-restart-{stamp}.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1, default=str)
        f.write("\n")
    print(f"results: {os.path.relpath(out, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
