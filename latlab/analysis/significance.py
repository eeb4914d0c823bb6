"""Is a change between two runs real? Bootstrap CIs of differences and a rank test."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


def cluster_bootstrap_difference(a: list[np.ndarray], b: list[np.ndarray],
                                 stats: tuple[str, ...], rounds: int = BOOTSTRAP_ROUNDS,
                                 seed: int = 0) -> dict[str, Difference]:
    """`bootstrap_difference` for samples that come in groups (a request's token gaps): the
    groups are resampled whole, since the gaps of one request are not independent of each
    other; resampling them one by one would call two identical setups different. Beyond
    `MAX_CLUSTERS` groups, `MAX_CLUSTERS` are drawn at a time (a wider interval)."""
    a, b = [g for g in a if len(g)], [g for g in b if len(g)]
    if not a or not b:
        raise ValueError("bootstrap needs samples on both sides")
    rng = np.random.default_rng(seed)
    return _differences(np.concatenate(a), np.concatenate(b),
                        _resample_groups(a, stats, rounds, rng),
                        _resample_groups(b, stats, rounds, rng), stats)


def _differences(a: np.ndarray, b: np.ndarray, draws_a: dict[str, np.ndarray],
                 draws_b: dict[str, np.ndarray], stats: tuple[str, ...]) -> dict[str, Difference]:
    """Each statistic's value on both sides and the confidence interval of B − A."""
    alpha = (1 - CONFIDENCE) / 2
    result = {}
    for s in stats:
        low, high = np.quantile(draws_b[s] - draws_a[s], [alpha, 1 - alpha])
        result[s] = Difference(a=float(statistic(a, s)), b=float(statistic(b, s)),
                               ci_low=float(low), ci_high=float(high))
    return result


def _resample_groups(groups: list[np.ndarray], stats: tuple[str, ...], rounds: int,
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
    values = np.concatenate(groups)
    lengths = np.array([len(g) for g in groups])
    offsets = np.cumsum(lengths) - lengths
    size = min(len(groups), MAX_CLUSTERS)
    draws = {s: np.empty(rounds) for s in stats}
    for i in range(rounds):
        chosen = rng.integers(0, len(groups), size)
        lens = lengths[chosen]
        starts = np.repeat(offsets[chosen] - (np.cumsum(lens) - lens), lens)
        sample = values[starts + np.arange(lens.sum())]
        for s in stats:
            draws[s][i] = statistic(sample, s)
    return draws


def _resample(values: np.ndarray, stats: tuple[str, ...], rounds: int,
              rng: np.random.Generator) -> dict[str, np.ndarray]:
    draws = {s: np.empty(rounds) for s in stats}
    size = min(len(values), MAX_DRAW)
    chunk = max(1, MAX_CELLS_PER_CHUNK // size)
    for start in range(0, rounds, chunk):
        n = min(chunk, rounds - start)
        sample = values[rng.integers(0, len(values), size=(n, size))]
        for s in stats:
            draws[s][start:start + n] = statistic(sample, s)
    return draws


def rank_test(a: np.ndarray, b: np.ndarray) -> float | None:
    """Two-sided Mann–Whitney U p-value: do the two distributions differ at all?"""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
