"""Statistics for the benchmark tables.

Decode speed of a cell = decoded tokens / their total decode time, over every kept token of
every repetition (the first `trim` decodes of each run are dropped: see
docs/benchmark-method.md). This is the same quantity the CLI prints as decode tok/s (a ratio
of sums, i.e. 1 / mean seconds per token), not the mean of per-token tok/s, which would
over-weight the fast tokens.

Intervals: percentile bootstrap, resampling tokens with replacement *within each
repetition* (stratified by run), B resamples. It captures token-to-token noise; it does not
capture run-to-run differences (a run that started in a different memory state, or shared
the CPU with a compiler), which is why the tables also list every repetition's own figure.
Tokens of one run are not independent (a slow stretch while another job runs), so the
intervals are optimistic; read a disagreement between repetitions as the larger
uncertainty.

Ratios to the baseline resample the two cells independently and take percentiles of the
ratio of the two resampled figures.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

DEFAULT_B = 4000
SEED = 20261129


def _boot_sums(nums: Sequence[np.ndarray], dens: Sequence[np.ndarray], idx_rng: np.random.Generator,
               B: int) -> tuple[np.ndarray, np.ndarray]:
    """B resampled totals of the concatenations of nums and of dens, resampling within each
    array; token i of nums[r] and of dens[r] are drawn together (the same indices)."""
    tn, td = np.zeros(B), np.zeros(B)
    for a, d in zip(nums, dens):
        n = len(a)
        if n == 0:
            continue
        idx = idx_rng.integers(0, n, size=(B, n))
        tn += a[idx].sum(axis=1)
        td += d[idx].sum(axis=1)
    return tn, td


def ratio_of_sums(num: Sequence[Sequence[float]], den: Sequence[Sequence[float]], B: int = DEFAULT_B,
                  seed: int = SEED) -> dict[str, Any] | None:
    """Point estimate and bootstrap samples of sum(num)/sum(den), where num[r][i] and den[r][i]
    belong to token i of run r (resampled together)."""
    nums = [np.asarray(x, dtype=float) for x in num]
    dens = [np.asarray(x, dtype=float) for x in den]
    if not nums or sum(len(x) for x in nums) == 0:
        return None
    pn = sum(x.sum() for x in nums)
    pd = sum(x.sum() for x in dens)
    if pd <= 0:
        return None
    bn, bd = _boot_sums(nums, dens, np.random.default_rng(seed), B)
    with np.errstate(divide="ignore", invalid="ignore"):
        boots = bn / bd
    boots = boots[np.isfinite(boots)]
    lo, hi = np.percentile(boots, [2.5, 97.5]) if len(boots) else (np.nan, np.nan)
    return {"value": pn / pd, "lo": float(lo), "hi": float(hi), "boots": boots}


def tok_s(decode_s_per_run: Sequence[Sequence[float]], B: int = DEFAULT_B, seed: int = SEED):
    """Decode tok/s with its bootstrap interval from per-token decode seconds."""
    ones = [[1.0] * len(r) for r in decode_s_per_run]
    return ratio_of_sums(ones, decode_s_per_run, B, seed)


def tok_s_from_runs(run_decode_s: Sequence[float], run_tokens: Sequence[int], B: int = DEFAULT_B,
                    seed: int = SEED):
    """For loaders without per-token data (llama-bench): resample whole runs."""
    if not run_decode_s:
        return None
    return ratio_of_sums([list(map(float, run_tokens))], [list(run_decode_s)], B, seed)


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """a / b with an interval from independent resamples of a and b."""
    if not a or not b or b["value"] == 0:
        return None
    n = min(len(a["boots"]), len(b["boots"]))
    if n == 0:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        r = a["boots"][:n] / b["boots"][:n]
    r = r[np.isfinite(r)]
    lo, hi = np.percentile(r, [2.5, 97.5])
    return {"value": a["value"] / b["value"], "lo": float(lo), "hi": float(hi)}


def public(x: dict[str, Any] | None) -> dict[str, Any] | None:
    """Drop the bootstrap samples before writing results."""
    if x is None:
        return None
    return {k: (float(v) if isinstance(v, (np.floating, float)) else v)
            for k, v in x.items() if k != "boots"}
