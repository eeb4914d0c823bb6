"""Percentiles by linear interpolation, with a distribution-free confidence interval from
order statistics (binomial ranks); one with fewer than 10 samples beyond it is unreliable."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache

import numpy as np

from latlab.records.summary import Distribution, Percentile

PERCENTILES: dict[str, float] = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p99.9": 99.9}
CONFIDENCE = 0.95
MIN_TAIL_SAMPLES = 10


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `inf` entries stay `inf`."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of no samples")
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    a, b = sorted_values[lo], sorted_values[hi]
    if frac == 0 or a == b:
        return float(a)
    if math.isinf(b):
        return math.inf
    return float(a + (b - a) * frac)


def percentiles(data: np.ndarray, qs: Sequence[float]) -> list[float]:
    """`percentile` of each of `qs` over the unsorted float array `data`, which it reorders:
    only the order statistics it reads are put in place (no full sort)."""
    n = len(data)
    ranks = {r for q in qs for r in (math.floor((n - 1) * q / 100.0),
                                     min(math.floor((n - 1) * q / 100.0) + 1, n - 1))}
    data.partition(sorted(ranks))
    return [percentile(data, q) for q in qs]


def percentile_ci(
    sorted_values: Sequence[float], q: float, confidence: float = CONFIDENCE
) -> tuple[float | None, float | None]:
    """Distribution-free CI of the q-th percentile from order statistics (binomial ranks).

    A side the sample is too small to bound is `None` (e.g. the upper bound of p99 from 50
    samples): the honest answer is "unknown", not the maximum.
    """
    n = len(sorted_values)
    if n == 0:
        return None, None
    lo_rank, hi_rank = ci_ranks(n, q, confidence)
    low = float(sorted_values[lo_rank - 1]) if lo_rank >= 1 else None
    high = float(sorted_values[hi_rank - 1]) if hi_rank <= n else None
    return low, high


@lru_cache(maxsize=4096)  # scipy's quantile costs ~1 ms; summaries ask the same (n, q) often
def ci_ranks(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """The 1-based ranks of the order statistics that bound the q-th percentile of `n`
    samples with `confidence` (a rank outside 1..n: that side is unbounded)."""
    alpha = 1 - confidence
    p = q / 100.0
    return binomial_quantile(alpha / 2, n, p), binomial_quantile(1 - alpha / 2, n, p) + 1


def binomial_quantile(level: float, n: int, p: float) -> int:
    """The least k with P(Binomial(n, p) ≤ k) ≥ `level` (scipy.stats' `binom.ppf`, without
    importing scipy.stats, a second of every command's start)."""
    from scipy.special import bdtr, bdtrik

    k = max(0, math.floor(bdtrik(level, n, p)))
    while k < n and bdtr(k, n, p) < level:
        k += 1
    while k > 0 and bdtr(k - 1, n, p) >= level:
        k -= 1
    return k


def reliable(n: int, q: float) -> bool:
    """Whether a sample of `n` has at least MIN_TAIL_SAMPLES beyond its q-th percentile."""
    return n * (1 - q / 100.0) >= MIN_TAIL_SAMPLES


MIN_EXCEEDING = 3


def tail_exceeds(values: Sequence[float] | np.ndarray, q: float, limit: float) -> bool:
    """Whether the q-th percentile of `values` is above `limit` on evidence: the percentile
    itself when it is reliable; else at least `MIN_EXCEEDING` samples above the limit (and
    their share beyond 100 − q), so one outlier in a small sample decides nothing."""
    data = np.asarray(values, dtype=float)
    n = len(data)
    if n == 0:
        return False
    if reliable(n, q):
        return percentile(np.sort(data), q) > limit
    over = int(np.count_nonzero(data > limit))
    return over >= MIN_EXCEEDING and over >= n * (1 - q / 100.0)


def distribution(values: Iterable[float | None] | np.ndarray, *, scratch: bool = False
                 ) -> Distribution:
    """Mean, min, max and every percentile of `PERCENTILES` with its CI and reliability
    (None and NaN are no sample). Only the order statistics these read are put in place
    (`np.partition`), not the whole sample sorted: pooled ITL of a big run is 10⁸ samples.
    `scratch`: `values` is a float array of the caller's own that may be reordered."""
    data = _samples(values, scratch)
    n = len(data)
    if n == 0:
        return Distribution(n=0)
    bounds = {q: ci_ranks(n, q) for q in PERCENTILES.values()}
    ranks = {0, n - 1} | {r - 1 for pair in bounds.values() for r in pair if 1 <= r <= n}
    for q in PERCENTILES.values():
        position = math.floor((n - 1) * q / 100.0)
        ranks |= {position, min(position + 1, n - 1)}
    data.partition(sorted(ranks))
    percentiles = {}
    for name, q in PERCENTILES.items():
        low, high = bounds[q]
        percentiles[name] = Percentile(
            value=percentile(data, q), reliable=reliable(n, q),
            ci_low=float(data[low - 1]) if low >= 1 else None,
            ci_high=float(data[high - 1]) if high <= n else None)
    finite = bool(np.isfinite(data).all())
    return Distribution(n=n, mean=float(data.mean()) if finite else math.inf,
                        min=float(data[0]), max=float(data[-1]), percentiles=percentiles)


def _samples(values: Iterable[float | None] | np.ndarray, scratch: bool) -> np.ndarray:
    """A float array of the samples in `values` to partition in place, without the missing
    ones (`values` itself when it is `scratch`)."""
    if isinstance(values, np.ndarray):
        data = values if scratch and values.dtype == float else values.astype(float)
        return data[~np.isnan(data)] if np.isnan(data).any() else data
    return np.asarray([v for v in values if v is not None], dtype=float)
