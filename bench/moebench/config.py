"""Experiment files (TOML) -> a validated matrix of cells.

An experiment names a model preset, the prompt, the token count, the repetitions, and a
list of cells. Each cell is a full assignment of the matrix variables (VARIABLES below);
a cell that is compared names its `baseline` cell, and the two must differ in exactly one
variable (validate() refuses the experiment otherwise). docs/benchmark-method.md
describes the format; bench/experiments/*.toml are the examples.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import re
import tomllib
from typing import Any

from . import models

# Matrix variables: name -> default. Every cell has a value for each one.
VARIABLES: dict[str, Any] = {
    # what loads the model and runs the decode:
    #   stream      moestream, experts streamed from flash
    #   resident    moestream --no-stream (llama.cpp's own loading inside moestream)
    #   llama-mmap  Debian llama-completion -lm mmap --no-repack
    #   llama-dio   Debian llama-completion -lm dio --no-repack
    #   bench-mmap / bench-dio   Debian llama-bench (tg only, per-repetition figures)
    "loader": "stream",
    "threads": 2,               # compute threads (-t)
    "io_threads": 2,            # moestream read lanes (--io-threads)
    "odirect": True,            # moestream O_DIRECT (False: --no-odirect)
    "prefetch": False,          # moestream next-layer read-ahead (--prefetch; on by default
                                # with --no-prefetch at e50c94e only)
    "prefill_readahead": False, # moestream --prefill-readahead (docs/prefetch.md)
    "cache_mb": "off",          # moestream LRU budget: "off" | MiB | "auto" | "all-experts"
    "force_cache": False,       # moestream --force-cache
    "drop_cold": None,          # moestream --drop-cold-experts F (lossy)
    "n_expert_used": None,      # experts per token (lossy below the model's k)
    "readahead_kb": "keep",     # block-device readahead for the run: KiB or "keep"
    "mem_cap": "none",          # memory cap incl. page cache: "none" | "8GiB" | bytes
    "start": "cold",            # cold: model file evicted + caches dropped before the run
    "extra_args": [],           # escape hatch: extra CLI arguments (counts as a variable)
    "route_trace": False,       # moestream --route-trace <run prefix>.trace (kept in raw/)
    # moestream as committed at this revision (bench/build-at.sh: a clean export), so one run
    # can compare two commits side by side; absent = the run's binary (--commit / --bin).
    "commit": None,
    # the model split into this many shards with Debian's llama-gguf-split (--split-max-tensors,
    # the first shard given to the loader; models.ensure_split), or None: the one file
    "split": None,
    # the prompt: None = the experiment's `prompt`; N = a prompt of N characters, the
    # experiment's prompt repeated (prompt_text()); on the synth models' byte-level vocabulary
    # (no merges, no BOS) that is N tokens. The run records n_prompt as tokenized.
    "prompt_tokens": None,
    # OMP_WAIT_POLICY for the run (ggml's CPU backend threads are OpenMP threads): None =
    # inherited, "passive" = idle threads sleep, "active" = they spin
    "omp_wait_policy": None,
    # moestream's environment knobs for the run (src/engine/env_knobs.h, docs/cli.md): a table
    # of MOESTREAM_* names (no MOESTREAM_DEBUG_* test knob) or GLIBC_TUNABLES (e.g. the
    # resident reference on huge pages: "glibc.malloc.hugetlb=1") to string values, e.g.
    # env = { MOESTREAM_OVERLAP_STAGES = "3" }; {} = inherited
    "env": {},
}

MOESTREAM_LOADERS = {"stream", "resident"}
LLAMA_COMPLETION_LOADERS = {"llama-mmap", "llama-dio"}
LLAMA_BENCH_LOADERS = {"bench-mmap", "bench-dio"}
LOADERS = MOESTREAM_LOADERS | LLAMA_COMPLETION_LOADERS | LLAMA_BENCH_LOADERS

_COMMON = {"loader", "threads", "n_expert_used", "readahead_kb", "mem_cap", "start", "extra_args",
           "split", "prompt_tokens", "omp_wait_policy"}
APPLIES: dict[str, set[str]] = {
    "stream": _COMMON | {"io_threads", "odirect", "prefetch", "prefill_readahead", "cache_mb", "force_cache", "drop_cold",
                         "route_trace", "commit", "env"},
    "resident": _COMMON | {"commit", "env"},
    "llama-mmap": set(_COMMON),
    "llama-dio": set(_COMMON),
    "bench-mmap": _COMMON - {"prompt_tokens"},   # llama-bench runs tg only: no prompt
    "bench-dio": _COMMON - {"prompt_tokens"},
}
# A variable that applies to only one side of a comparison is ignored when it has its
# neutral value there (cache off, lossless, O_DIRECT); any other value counts as a change.
# io_threads has no neutral value: comparing a streaming cell with a non-streaming one
# is a comparison of loaders, whatever the lanes.
NEUTRAL = {"cache_mb": "off", "force_cache": False, "drop_cold": None, "odirect": True,
           "prefetch": False, "prefill_readahead": False,
           "route_trace": False, "commit": None, "split": None, "prompt_tokens": None,
           "omp_wait_policy": None, "env": {}}

EXPERIMENT_KEYS = {
    "name", "title", "description", "model", "arch", "type", "seed", "attn_gain", "prompt", "tokens",
    "reps", "trim", "order", "ctx", "batch", "timeout_s", "placeholder", "defaults", "cell",
    "sweep", "fio_probe", "bootstrap", "notes", "mem_margin_mib", "publish",
}


class ConfigError(Exception):
    pass



@dataclasses.dataclass
class Cell:
    name: str
    params: dict[str, Any]
    baseline: str | None = None
    note: str = ""

    def applies(self, var: str) -> bool:
        return var in APPLIES[self.params["loader"]]


@dataclasses.dataclass
class FioProbe:
    lanes: list[int]
    seconds: int = 4
    capped: bool = True      # run under the experiment's memory cap (cells' common cap)
    # Reads in flight per job: 1 = synchronous psync, like a read lane; more = io_uring with
    # that queue depth, the device's rate with reads queued (as the engine's io_uring tails are)
    iodepth: int = 1


@dataclasses.dataclass
class Experiment:
    name: str
    title: str
    description: str
    model: str                # synth preset (tiny | mid | qwen3-30b-a3b) or a path to a .gguf
    arch: str
    type: str
    seed: int
    attn_gain: float          # synth --attn-gain (0.3 = the default weights; 1.0 = output repeats)
    prompt: str
    tokens: int
    reps: int
    trim: int
    order: str                # interleaved | alternate | shuffled
    ctx: int
    batch: int                # -b (and llama.cpp's -ub); 0 = not passed: each binary's own choice
    timeout_s: int
    placeholder: bool
    cells: list[Cell]
    fio: FioProbe | None
    bootstrap: int
    notes: list[str]
    mem_margin_mib: int
    publish: bool = True      # write its section into docs/benchmarks.md when run as defined
    source: str = ""

    def cell(self, name: str) -> Cell:
        for c in self.cells:
            if c.name == name:
                return c
        raise KeyError(name)


def parse_bytes(v: Any) -> int | None:
    """'8GiB' / '512MiB' / 123 -> bytes; 'none' -> None."""
    if v is None or v == "none":
        return None
    if isinstance(v, int):
        return v
    m = re.fullmatch(r"\s*([0-9.]+)\s*(B|KiB|MiB|GiB|TiB)?\s*", str(v))
    if not m:
        raise ConfigError(f"bad size {v!r} (use e.g. 8GiB, 512MiB or a byte count)")
    mult = {"B": 1, None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * mult)


def _check_value(cell: str, var: str, v: Any) -> None:
    bad = lambda why: ConfigError(f"cell {cell!r}: {var} = {v!r}: {why}")  # noqa: E731
    if var == "loader" and v not in LOADERS:
        raise bad(f"one of {sorted(LOADERS)}")
    if var in ("threads", "io_threads") and not (isinstance(v, int) and v >= 1):
        raise bad("a positive integer")
    if var in ("odirect", "prefetch", "prefill_readahead", "force_cache", "route_trace") and not isinstance(v, bool):
        raise bad("true or false")
    if var == "cache_mb" and not (v in ("off", "auto", "all-experts") or (isinstance(v, int) and v >= 0)):
        raise bad('"off", "auto", "all-experts" or MiB')
    if var == "drop_cold" and not (v is None or isinstance(v, (int, float))):
        raise bad("a fraction or absent")
    if var == "n_expert_used" and not (v is None or (isinstance(v, int) and v >= 1)):
        raise bad("a positive integer or absent")
    if var == "readahead_kb" and not (v == "keep" or (isinstance(v, int) and v >= 0)):
        raise bad('"keep" or KiB')
    if var == "mem_cap":
        parse_bytes(v)
    if var == "start" and v not in ("cold", "warm"):
        raise bad('"cold" or "warm"')
    if var == "extra_args" and not (isinstance(v, list) and all(isinstance(a, str) for a in v)):
        raise bad("a list of strings")
    if var == "split" and not (v is None or (isinstance(v, int) and not isinstance(v, bool) and 2 <= v <= 99)):
        raise bad("a shard count in [2, 99] or absent")
    if var == "prompt_tokens" and not (v is None or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 20)):
        raise bad("a prompt length in [1, 1048576] or absent")
    if var == "omp_wait_policy" and v not in (None, "passive", "active"):
        raise bad('"passive", "active" or absent')
    if var == "env" and not (isinstance(v, dict) and all(
            isinstance(k, str) and (re.fullmatch(r"MOESTREAM_[A-Z0-9_]+", k) or k == "GLIBC_TUNABLES")
            and not k.startswith("MOESTREAM_DEBUG_") and isinstance(x, str) for k, x in v.items())):
        raise bad("a table of MOESTREAM_* names (not MOESTREAM_DEBUG_*) or GLIBC_TUNABLES to "
                  "string values")
    if var == "commit" and not (v is None or (isinstance(v, str) and re.fullmatch(r"[0-9A-Za-z._/~^-]+", v))):
        raise bad("a git revision (commit hash, tag or branch) or absent")


def prompt_text(exp: "Experiment", cell: Cell) -> str:
    """The cell's prompt: the experiment's, or (prompt_tokens = N) that text repeated with
    single spaces and cut to N characters."""
    n = cell.params.get("prompt_tokens")
    if n is None:
        return exp.prompt
    base = exp.prompt.strip() or "Once upon a time"
    reps = n // (len(base) + 1) + 1
    return " ".join([base] * reps)[:n]


def _fmt_name(template: str, params: dict[str, Any]) -> str:
    def sub(m: re.Match) -> str:
        return str(params[m.group(1)])
    return re.sub(r"\{(\w+)\}", sub, template)


def diff(a: Cell, b: Cell) -> list[tuple[str, Any, Any]]:
    """Variables in which cell a differs from cell b (see NEUTRAL for one-sided ones)."""
    out = []
    for var in VARIABLES:
        ina, inb = a.applies(var), b.applies(var)
        va, vb = a.params.get(var), b.params.get(var)
        if ina and inb:
            if va != vb:
                out.append((var, vb, va))
        elif ina != inb:
            side_val = va if ina else vb
            side = a if ina else b
            if var == "force_cache" and side.params.get("cache_mb") == "off":
                continue   # forcing a cache that is off changes nothing
            if var in NEUTRAL and side_val != NEUTRAL[var]:
                out.append((var, vb if inb else "n/a", va if ina else "n/a"))
    return out


def describe_change(a: Cell, b: Cell) -> str:
    return ", ".join(f"{v}: {old} → {new}" for v, old, new in diff(a, b))


def load(path: str, overrides: dict[str, Any] | None = None) -> Experiment:
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    raw = copy.deepcopy(raw)
    for k, v in (overrides or {}).items():
        if v is not None:
            raw[k] = v
    unknown = set(raw) - EXPERIMENT_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}")
    name = raw.get("name") or os.path.splitext(os.path.basename(path))[0]
    defaults = dict(VARIABLES)
    for k, v in raw.get("defaults", {}).items():
        if k not in VARIABLES:
            raise ConfigError(f"{path}: [defaults] {k}: not a matrix variable ({', '.join(VARIABLES)})")
        defaults[k] = v

    cells: list[Cell] = []

    def add(name_: str, params: dict[str, Any], baseline: str | None, note: str) -> None:
        p = dict(defaults)
        for k, v in params.items():
            if k not in VARIABLES:
                raise ConfigError(f"{path}: cell {name_!r}: {k}: not a matrix variable")
            p[k] = v
        for k, v in p.items():
            _check_value(name_, k, v)
        if any(c.name == name_ for c in cells):
            raise ConfigError(f"{path}: two cells named {name_!r}")
        if not re.fullmatch(r"[A-Za-z0-9._+-]+", name_):
            raise ConfigError(f"{path}: cell name {name_!r}: use letters, digits, . _ + -")
        cells.append(Cell(name_, p, baseline, note))

    for c in raw.get("cell", []):
        c = dict(c)
        n = c.pop("name", None)
        if not n:
            raise ConfigError(f"{path}: a [[cell]] without name")
        bl = c.pop("baseline", None)
        note = c.pop("note", "")
        add(n, c, bl, note)
    for s in raw.get("sweep", []):
        s = dict(s)
        var, values = s.get("vary"), s.get("values")
        if var not in VARIABLES or not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: [[sweep]] needs vary = <variable> and values = [...]")
        template = s.get("name", f"{var}-{{{var}}}")
        base = s.get("set", {})
        # baseline = "first": every value compares with the sweep's first cell, which
        # compares with first_baseline (or nothing); baseline = CELL: all compare with CELL.
        baseline = s.get("baseline", "first")
        first_baseline = s.get("first_baseline")
        note = s.get("note", "")
        names: list[str] = []
        for v in values:
            params = dict(base)
            params[var] = v
            full = dict(defaults)
            full.update(params)
            names.append(_fmt_name(template, full))
            if baseline == "first":
                bl = first_baseline if len(names) == 1 else names[0]
            else:
                bl = baseline if baseline != names[-1] else None
            add(names[-1], params, bl, note)

    fio = None
    if "fio_probe" in raw:
        fp = raw["fio_probe"]
        depth = fp.get("iodepth", 1)
        if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= 256:
            raise ConfigError(f"{name}: fio_probe.iodepth must be an integer in 1..256, not {depth!r}")
        fio = FioProbe(lanes=list(fp.get("lanes", [1, 2, 4, 8])), seconds=int(fp.get("seconds", 4)),
                       capped=bool(fp.get("capped", True)), iodepth=depth)

    exp = Experiment(
        name=name,
        title=raw.get("title", name),
        description=raw.get("description", "").strip(),
        model=raw.get("model", "tiny"),
        arch=raw.get("arch", "qwen3moe"),
        type=raw.get("type", "q4_k"),
        seed=int(raw.get("seed", 1)),
        attn_gain=float(raw.get("attn_gain", models.DEFAULT_ATTN_GAIN)),
        prompt=raw.get("prompt", "Once upon a time"),
        tokens=int(raw.get("tokens", 32)),
        reps=int(raw.get("reps", 2)),
        trim=int(raw.get("trim", 4)),
        order=raw.get("order", "interleaved"),
        ctx=int(raw.get("ctx", 512)),
        batch=int(raw.get("batch", 512)),
        timeout_s=int(raw.get("timeout_s", 1800)),
        placeholder=bool(raw.get("placeholder", False)),
        cells=cells,
        fio=fio,
        bootstrap=int(raw.get("bootstrap", 4000)),
        notes=list(raw.get("notes", [])),
        mem_margin_mib=int(raw.get("mem_margin_mib", 1024)),
        publish=bool(raw.get("publish", True)),
        source=path,
    )
    validate(exp)
    return exp


def validate(exp: Experiment) -> None:
    if not exp.cells and not exp.fio:
        raise ConfigError(f"{exp.name}: no cells and no fio probe")
    if exp.order not in ("interleaved", "alternate", "shuffled"):
        raise ConfigError(f"{exp.name}: order = {exp.order!r}: interleaved | alternate | shuffled")
    if exp.batch < 0:
        raise ConfigError(f"{exp.name}: batch = {exp.batch}: prompt tokens per decode, or 0 "
                          "for each binary's own choice (no -b)")
    if exp.reps < 1 or exp.tokens < 2:
        raise ConfigError(f"{exp.name}: reps >= 1 and tokens >= 2")
    if exp.trim < 0 or exp.trim >= exp.tokens - 1:
        raise ConfigError(f"{exp.name}: trim = {exp.trim} leaves no decoded token (tokens = {exp.tokens})")
    names = {c.name for c in exp.cells}
    for c in exp.cells:
        if c.params.get("prompt_tokens") is not None and not c.applies("prompt_tokens"):
            raise ConfigError(f"{exp.name}: cell {c.name!r}: prompt_tokens does not apply to "
                              f"loader {c.params['loader']!r} (llama-bench runs no prompt)")
    for c in exp.cells:
        if c.baseline is None:
            continue
        if c.baseline not in names:
            raise ConfigError(f"{exp.name}: cell {c.name!r}: baseline {c.baseline!r} is not a cell")
        if c.baseline == c.name:
            raise ConfigError(f"{exp.name}: cell {c.name!r} is its own baseline")
        d = diff(c, exp.cell(c.baseline))
        if len(d) != 1:
            what = "; ".join(f"{v}: {o} → {n}" for v, o, n in d) or "nothing"
            raise ConfigError(
                f"{exp.name}: cell {c.name!r} vs its baseline {c.baseline!r} changes {len(d)} "
                f"variables ({what}); a comparison must change exactly one")
