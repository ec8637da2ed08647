"""Benchmark models: synth presets cached outside the repo (/var/tmp/moestream-models by
default, MOESTREAM_MODELS_DIR to change), made once with `moestream synth` and reused."""
from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import time
from typing import Any

PRESETS = ("tiny", "mid", "qwen3-30b-a3b")
DEFAULT_ATTN_GAIN = 0.3  # moestream synth --attn-gain's default (include/moestream/synth.h)


def gain_note(attn_gain: float | None) -> str:
    """", synth --attn-gain G" for a non-default gain, else "" (reports, dry runs)."""
    return "" if attn_gain in (None, DEFAULT_ATTN_GAIN) else f", synth --attn-gain {attn_gain:g}"


def models_dir() -> str:
    return os.environ.get("MOESTREAM_MODELS_DIR", "/var/tmp/moestream-models")


def preset_path(preset: str, arch: str, type_: str, seed: int,
                attn_gain: float = DEFAULT_ATTN_GAIN) -> str:
    s = "" if seed == 1 else f"-s{seed}"
    g = "" if attn_gain == DEFAULT_ATTN_GAIN else f"-g{attn_gain:g}"
    return os.path.join(models_dir(), f"{preset}-{arch}-{type_}{s}{g}.gguf")


def _synth_in_progress(path: str) -> list[str]:
    """Temp files of a `moestream synth` that is still running (FILE.tmp.<pid>)."""
    live = []
    for t in glob.glob(path + ".tmp.*"):
        m = re.search(r"\.tmp\.(\d+)$", t)
        if m and os.path.exists(f"/proc/{m.group(1)}"):
            live.append(t)
    return live


def ensure(moestream: str, model: str, arch: str, type_: str, seed: int, log,
           wait_s: int = 3600, attn_gain: float = DEFAULT_ATTN_GAIN) -> dict[str, Any]:
    """Path of the model to benchmark, synthesizing the preset if it is missing."""
    if model not in PRESETS:
        if not os.path.exists(model):
            raise SystemExit(f"model {model!r}: neither a synth preset ({', '.join(PRESETS)}) nor a file")
        return {"path": os.path.abspath(model), "preset": None, "synthesized": False}
    path = preset_path(model, arch, type_, seed, attn_gain)
    cmd = [moestream, "synth", "--preset", model, "--arch", arch, "--type", type_,
           "--seed", str(seed)]
    if attn_gain != DEFAULT_ATTN_GAIN:
        cmd += ["--attn-gain", f"{attn_gain:g}"]
    cmd += ["-o", path]
    info = {"path": path, "preset": model, "arch": arch, "type": type_, "seed": seed,
            "attn_gain": attn_gain,
            "synth_command": cmd, "synthesized": False}
    os.makedirs(models_dir(), exist_ok=True)
    t0 = time.monotonic()
    while _synth_in_progress(path):
        if time.monotonic() - t0 > wait_s:
            raise SystemExit(f"{path}: another `moestream synth` is still writing it after {wait_s} s")
        log(f"waiting: another process is synthesizing {path}")
        time.sleep(30)
    if os.path.exists(path):
        return info
    with open(os.path.join(models_dir(), ".synth.lock"), "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        if os.path.exists(path):
            return info
        dry = subprocess.run(cmd[:-2] + ["-o", path, "--dry-run"], capture_output=True, text=True)
        m = re.search(r": (\d+) bytes", dry.stdout)
        need = int(m.group(1)) if m else 0
        free = shutil.disk_usage(models_dir()).free
        if need and free < need + (2 << 30):
            raise SystemExit(f"{path}: needs {need / 2**30:.1f} GiB, only {free / 2**30:.1f} GiB free")
        log(f"synthesizing {path} ({need / 1e9:.1f} GB): {' '.join(cmd)}")
        r = subprocess.run(cmd)
        if r.returncode != 0:
            raise SystemExit(f"synth failed (exit {r.returncode}): {' '.join(cmd)}")
        info["synthesized"] = True
    return info


def inspect(moestream: str, path: str) -> dict[str, Any]:
    r = subprocess.run([moestream, "inspect", "--json", "-m", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"moestream inspect --json -m {path} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def summary(ins: dict[str, Any]) -> dict[str, Any]:
    """The inspect fields worth keeping in a results file (no per-tensor table)."""
    keep = ("file_size", "arch", "name", "n_layer", "n_moe_layer", "n_expert", "n_expert_used",
            "n_embd", "n_ff_exp", "expert_bytes_total", "dense_bytes_total", "expert_bytes",
            "token_working_set_bytes", "odirect_read_bytes", "odirect_overread_pct",
            "cache_min_mib", "cache_all_experts_mib", "alignment")
    out = {k: ins[k] for k in keep if k in ins}
    out["projections"] = ins.get("projections")
    return out


def split_prefix(path: str, n: int) -> str:
    """Where the n-shard split of model `path` lives: PREFIX-0000K-of-0000N.gguf."""
    base = path[:-5] if path.endswith(".gguf") else path
    return f"{base}-split{n}"


def split_paths(prefix: str, n: int) -> list[str]:
    """The shards of an n-shard set, llama.cpp's naming (llama_split_path)."""
    return [f"{prefix}-{k:05d}-of-{n:05d}.gguf" for k in range(1, n + 1)]


def split_tensor_count(n_tensors: int, n: int) -> int:
    """--split-max-tensors that gives exactly n shards of n_tensors, or 0 when none does."""
    per = -(-n_tensors // n)
    return per if -(-n_tensors // per) == n else 0


def ensure_split(llama_tool: str, path: str, n: int, n_tensors: int, log) -> list[str]:
    """The shards of `path` split into n (made once with llama-gguf-split, next to the model)."""
    prefix = split_prefix(path, n)
    shards = split_paths(prefix, n)
    if all(os.path.exists(p) for p in shards):
        return shards
    per = split_tensor_count(n_tensors, n)
    if per == 0:
        raise SystemExit(f"{path}: {n_tensors} tensors cannot be split into exactly {n} shards by count")
    for p in glob.glob(prefix + "-*-of-*.gguf"):
        os.remove(p)  # a partial set from an interrupted split
    cmd = [llama_tool, "llama-gguf-split", "--split", "--split-max-tensors", str(per), path, prefix]
    log(f"splitting {path} into {n} shards: {' '.join(cmd)}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not all(os.path.exists(p) for p in shards):
        raise SystemExit(f"llama-gguf-split failed ({r.returncode}): {r.stderr[-500:]}")
    return shards
