"""Is a change between two runs real? Bootstrap CIs of differences and a rank test."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from latlab.records.columns import Ragged

CONFIDENCE = 0.95
BOOTSTRAP_ROUNDS = 1000
MAX_CELLS_PER_CHUNK = 4_000_000  # bounds the memory of one resampling chunk (floats)
MAX_DRAW = 20_000  # larger samples are resampled m-out-of-n: a wider, conservative interval
MAX_CLUSTERS = 5_000


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
    return _differences(a, b, _resample(a, stats, rounds, rng), _resample(b, stats, rounds, rng),
                        stats)


def cluster_bootstrap_difference(a: Ragged, b: Ragged, stats: tuple[str, ...],
                                 rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0
                                 ) -> dict[str, Difference]:
    """`bootstrap_difference` for samples that come in groups (a request's token gaps): the
    groups are resampled whole, since the gaps of one request are not independent of each
    other; resampling them one by one would call two identical setups different. Beyond
    `MAX_CLUSTERS` groups, `MAX_CLUSTERS` are drawn at a time (a wider interval)."""
    if not len(a.values) or not len(b.values):
        raise ValueError("bootstrap needs samples on both sides")
    rng = np.random.default_rng(seed)
    picks = [rng.integers(0, int((g.lengths > 0).sum()),
                          (rounds, min(int((g.lengths > 0).sum()), MAX_CLUSTERS))) for g in (a, b)]
    with ThreadPoolExecutor(2) as pool:  # numpy's partition runs outside the GIL
        draws_a, draws_b = pool.map(_resample_groups, (a, b), (stats, stats), picks)
    return _differences(a.values, b.values, draws_a, draws_b, stats)


def _differences(a: np.ndarray, b: np.ndarray, draws_a: dict[str, np.ndarray],
                 draws_b: dict[str, np.ndarray], stats: tuple[str, ...]) -> dict[str, Difference]:
    """Each statistic's value on both sides and the confidence interval of B − A."""
    alpha = (1 - CONFIDENCE) / 2
    whole_a, whole_b = statistics(a, stats), statistics(b, stats)
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


def _resample_groups(groups: Ragged, stats: tuple[str, ...], picks: np.ndarray
                     ) -> dict[str, np.ndarray]:
    """The statistics of each round's resample: the groups `picks` (one row a round, indices
    into the groups that have samples) taken whole."""
    lengths = groups.lengths
    kept = np.flatnonzero(lengths)  # a request without samples is no group
    lengths, offsets = lengths[kept], groups.offsets[:-1][kept]
    draws = {s: np.empty(len(picks)) for s in stats}
    for i, chosen in enumerate(picks):
        lens = lengths[chosen]
        starts = np.repeat(offsets[chosen] - (np.cumsum(lens) - lens), lens)
        sample = groups.values[starts + np.arange(lens.sum())]
        for s, value in statistics(sample, stats).items():
            draws[s][i] = value
    return draws


def _resample(values: np.ndarray, stats: tuple[str, ...], rounds: int,
              rng: np.random.Generator) -> dict[str, np.ndarray]:
    draws = {s: np.empty(rounds) for s in stats}
    size = min(len(values), MAX_DRAW)
    chunk = max(1, MAX_CELLS_PER_CHUNK // size)
    for start in range(0, rounds, chunk):
        n = min(chunk, rounds - start)
        sample = values[rng.integers(0, len(values), size=(n, size))]
        for s, value in statistics(sample, stats).items():
            draws[s][start:start + n] = value
    return draws


def rank_test(a: np.ndarray, b: np.ndarray) -> float | None:
    """Two-sided Mann–Whitney U p-value: do the two distributions differ at all?"""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
