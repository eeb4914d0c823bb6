"""Is a change between two runs real? Bootstrap CIs of differences and a rank test.

An interval is a percentile bootstrap of `stat(b) − stat(a)`: each side resampled with
replacement on its own, `BOOTSTRAP_ROUNDS` times. No round's resample is built and sorted
(that took 25–35 s a comparison); each round's statistic is drawn from what it depends on,
with the distribution resampling gives it:

- a percentile of m values drawn from n depends on two order statistics of the resample;
  the k-th of m draws from the sorted sample x is x[⌈U·n⌉ − 1], U the k-th of m uniform
  order statistics, a Beta(k, m − k + 1) variable: two Beta draws a round;
- the mean of more than `MAX_EXACT_MEAN` values, all but normal by then, is drawn from a
  normal bent to the resampled mean's exact variance and skewness (Cornish–Fisher): its
  interval matches resampling's within resampling's own Monte Carlo error
  (`tests/test_significance.py`); a mean of fewer values is resampled;
- groups drawn whole (a request's token gaps): `cluster_bootstrap`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latlab.analysis.cluster_bootstrap import ClusterDraws, interpolate
from latlab.records.columns import Ragged

CONFIDENCE = 0.95
BOOTSTRAP_ROUNDS = 1000
MAX_DRAW = 20_000  # larger samples are resampled m-out-of-n: a wider, conservative interval
MAX_CLUSTERS = 5_000
MAX_EXACT_MEAN = 4_000  # a mean of more values is drawn from its moments


@dataclass(frozen=True, slots=True)
class Difference:
    """`b − a` of a statistic, with its bootstrap confidence interval."""

    a: float
    b: float
    ci_low: float
    ci_high: float

    @property
    def delta(self) -> float:
        return self.b - self.a

    @property
    def relative(self) -> float | None:
        return self.delta / self.a if self.a else None

    @property
    def significant(self) -> bool:
        """The interval excludes zero: the change is unlikely to be noise."""
        return self.ci_low > 0 or self.ci_high < 0


def statistic(values: np.ndarray, stat: str) -> np.ndarray:
    """`mean` or a percentile `pNN` along the last axis (linear interpolation)."""
    if stat == "mean":
        return values.mean(axis=-1)
    return np.percentile(values, float(stat[1:]), axis=-1)


def bootstrap_difference(a: np.ndarray, b: np.ndarray, stats: tuple[str, ...],
                         rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0) -> dict[str, Difference]:
    """For each statistic, `stat(b) − stat(a)` and its percentile-bootstrap CI.

    Each side is resampled independently with replacement. Samples above `MAX_DRAW` values
    (pooled ITL) are resampled `MAX_DRAW` at a time, which widens the interval: it errs
    towards "no clear change", never towards a false alarm.
    """
    if len(a) == 0 or len(b) == 0:
        raise ValueError("bootstrap needs samples on both sides")
    rng = np.random.default_rng(seed)
    return _differences(statistics(a, stats), statistics(b, stats),
                        _draws(a, stats, rounds, rng), _draws(b, stats, rounds, rng), stats)


def cluster_bootstrap_difference(a: Ragged, b: Ragged, stats: tuple[str, ...],
                                 rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0,
                                 rows: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
                                 ) -> dict[str, Difference]:
    """`bootstrap_difference` for samples that come in groups (a request's token gaps): the
    groups are resampled whole, since the gaps of one request are not independent of each
    other; resampling them one by one would call two identical setups different. Beyond
    `MAX_CLUSTERS` groups, `MAX_CLUSTERS` are drawn at a time (a wider interval). `rows`
    (masks) take some of each side's groups only."""
    sizes = [g.lengths.sum() if r is None else g.lengths[r].sum() for g, r in zip((a, b), rows)]
    if not all(sizes):
        raise ValueError("bootstrap needs samples on both sides")
    rng = np.random.default_rng(seed)
    found = [_group_statistics(ClusterDraws.draw(g, rounds, MAX_CLUSTERS, rng, r), stats)
             for g, r in zip((a, b), rows)]  # row 0: the sample's own
    return _differences(*({s: v[s][0] for s in stats} for v in found),
                        *({s: v[s][1:] for s in stats} for v in found), stats)


def _differences(whole_a: dict[str, float], whole_b: dict[str, float],
                 draws_a: dict[str, np.ndarray], draws_b: dict[str, np.ndarray],
                 stats: tuple[str, ...]) -> dict[str, Difference]:
    """Each statistic's value on both sides and the confidence interval of B − A."""
    alpha = (1 - CONFIDENCE) / 2
    result = {}
    for s in stats:
        low, high = np.quantile(draws_b[s] - draws_a[s], [alpha, 1 - alpha])
        result[s] = Difference(a=float(whole_a[s]), b=float(whole_b[s]),
                               ci_low=float(low), ci_high=float(high))
    return result


def statistics(values: np.ndarray, stats: tuple[str, ...]) -> dict[str, np.ndarray]:
    """`statistic` of each of `stats` along the last axis, the percentiles in one pass."""
    quantiles = [float(s[1:]) for s in stats if s != "mean"]
    found = dict(zip([s for s in stats if s != "mean"],
                     np.percentile(values, quantiles, axis=-1))) if quantiles else {}
    return {s: values.mean(axis=-1) if s == "mean" else found[s] for s in stats}


def _draws(values: np.ndarray, stats: tuple[str, ...], rounds: int,
           rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each statistic of `rounds` resamples of `min(n, MAX_DRAW)` of the n `values`."""
    m = min(len(values), MAX_DRAW)
    ordered = np.sort(values) if any(s != "mean" for s in stats) else values
    draws = {}
    for s in stats:
        if s != "mean":
            draws[s] = _resampled_percentile(ordered, m, float(s[1:]), rounds, rng)
        elif m <= MAX_EXACT_MEAN:
            draws[s] = values[rng.integers(0, len(values), (rounds, m))].mean(axis=1)
        else:
            draws[s] = _resampled_mean(values, m, rounds, rng)
    return draws


def _resampled_percentile(ordered: np.ndarray, m: int, q: float, rounds: int,
                          rng: np.random.Generator) -> np.ndarray:
    """The q-th percentile of `rounds` resamples of m of the sorted values `ordered`,
    through the uniform order statistics of the resample's two at `(m − 1)·q`."""
    position = (m - 1) * (q / 100)
    k = int(position)
    low = rng.beta(k + 1, m - k, rounds)
    # the next one up: the least of the m − k − 1 uniforms above the first
    high = low + (1 - low) * rng.beta(1, m - k - 1, rounds) if k + 1 < m else low
    n = len(ordered)
    at_low, at_high = (ordered[np.clip(np.ceil(u * n).astype(np.int64) - 1, 0, n - 1)]
                       for u in (low, high))
    return interpolate(at_low, at_high, np.full(rounds, position))


def _resampled_mean(values: np.ndarray, m: int, rounds: int,
                    rng: np.random.Generator) -> np.ndarray:
    """The mean of `rounds` resamples of m of `values`: normal draws bent to the resampled
    mean's variance and skewness (Cornish–Fisher, to the skewness term)."""
    mean = values.mean()
    deviations = values - mean
    variance = float(np.mean(deviations ** 2))
    if variance == 0:
        return np.full(rounds, mean)
    skewness = float(np.mean(deviations ** 3)) / variance ** 1.5 / np.sqrt(m)
    z = rng.standard_normal(rounds)
    return mean + np.sqrt(variance / m) * (z + skewness * (z * z - 1) / 6)


def _group_statistics(draws: ClusterDraws, stats: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each statistic of each round of `draws`."""
    found = draws.percentiles([float(s[1:]) for s in stats if s != "mean"])
    return {s: draws.means() if s == "mean" else found[float(s[1:])] for s in stats}


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


def rank_test(a: np.ndarray, b: np.ndarray) -> float | None:
    """Two-sided Mann–Whitney U p-value: do the two distributions differ at all?"""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
