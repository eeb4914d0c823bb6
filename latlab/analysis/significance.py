"""The statistics a comparison takes of a sample, and Fisher's exact test of two error
counts. (Whether a change is real is `verdicts.py`'s: on replicates, not on one run's
requests, which cannot see a host that drifts between runs.)"""

from __future__ import annotations

import numpy as np


def statistics(values: np.ndarray, stats: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each of `stats` (`mean` or a percentile `pNN`, linear interpolation) along the last
    axis, the percentiles in one pass."""
    quantiles = [float(s[1:]) for s in stats if s != "mean"]
    found = dict(zip([s for s in stats if s != "mean"],
                     np.percentile(values, quantiles, axis=-1))) if quantiles else {}
    return {s: values.mean(axis=-1) if s == "mean" else found[s] for s in stats}


def fisher_test(table: list[list[int]]) -> float:
    """Two-sided p-value of Fisher's exact test of a 2×2 table of counts: the chance of the
    tables with its margins that are at most as likely as it (scipy.stats' `fisher_exact`,
    without importing scipy.stats, a second of every comparison's start)."""
    from scipy.special import gammaln

    (a, b), (c, d) = table
    row, other, column = a + b, c + d, a + c
    if 0 in (row, other, column, b + d):
        return 1.0
    x = np.arange(max(0, column - other), min(column, row) + 1)
    log_p = (gammaln(row + 1) - gammaln(x + 1) - gammaln(row - x + 1) + gammaln(other + 1)
             - gammaln(column - x + 1) - gammaln(other - column + x + 1)
             - gammaln(row + other + 1) + gammaln(column + 1) + gammaln(row + other - column + 1))
    observed = log_p[a - x[0]]
    return min(1.0, float(np.exp(log_p[log_p <= observed + 1e-7]).sum()))
