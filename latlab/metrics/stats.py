"""Percentiles by linear interpolation, with a distribution-free confidence interval from
order statistics (binomial ranks); one with fewer than 10 samples beyond it is unreliable."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

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


def percentile_ci(
    sorted_values: Sequence[float], q: float, confidence: float = CONFIDENCE
) -> tuple[float | None, float | None]:
    """Distribution-free CI of the q-th percentile from order statistics (binomial ranks).

    A side the sample is too small to bound is `None` (e.g. the upper bound of p99 from 50
    samples): the honest answer is "unknown", not the maximum.
    """
    from scipy.stats import binom

    n = len(sorted_values)
    if n == 0:
        return None, None
    alpha = 1 - confidence
    p = q / 100.0
    lo_rank = int(binom.ppf(alpha / 2, n, p))  # 1-based rank of the lower bound
    hi_rank = int(binom.ppf(1 - alpha / 2, n, p)) + 1
    low = float(sorted_values[lo_rank - 1]) if lo_rank >= 1 else None
    high = float(sorted_values[hi_rank - 1]) if hi_rank <= n else None
    return low, high


def reliable(n: int, q: float) -> bool:
    """Whether a sample of `n` has at least MIN_TAIL_SAMPLES beyond its q-th percentile."""
    return n * (1 - q / 100.0) >= MIN_TAIL_SAMPLES


MIN_EXCEEDING = 3


def tail_exceeds(values: Sequence[float], q: float, limit: float) -> bool:
    """Whether the q-th percentile of `values` is above `limit` on evidence: the percentile
    itself when it is reliable; else at least `MIN_EXCEEDING` samples above the limit (and
    their share beyond 100 − q), so one outlier in a small sample decides nothing."""
    n = len(values)
    if n == 0:
        return False
    if reliable(n, q):
        return percentile(sorted(values), q) > limit
    over = sum(1 for v in values if v > limit)
    return over >= MIN_EXCEEDING and over >= n * (1 - q / 100.0)


def distribution(values: Iterable[float | None]) -> Distribution:
    """Mean, min, max and every percentile of `PERCENTILES` with its CI and reliability."""
    data = np.sort(np.asarray([v for v in values if v is not None], dtype=float))
    n = len(data)
    if n == 0:
        return Distribution(n=0)
    finite = data[np.isfinite(data)]
    percentiles = {}
    for name, q in PERCENTILES.items():
        low, high = percentile_ci(data, q)
        percentiles[name] = Percentile(value=percentile(data, q), ci_low=low, ci_high=high,
                                       reliable=reliable(n, q))
    return Distribution(n=n, mean=float(finite.mean()) if len(finite) == n else math.inf,
                        min=float(data[0]), max=float(data[-1]), percentiles=percentiles)
