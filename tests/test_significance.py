"""The bootstrap's intervals: each round's statistic as resampling gives it (without building
the resamples), and intervals that cover: identical setups rarely differ, real changes are
found."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from latlab.analysis import cluster_bootstrap, significance
from latlab.analysis.cluster_bootstrap import ClusterDraws
from latlab.analysis.significance import (bootstrap_difference, cluster_bootstrap_difference,
                                          fisher_test, rank_test, statistic)
from latlab.records.columns import Ragged


def test_a_real_shift_is_significant_and_its_size_is_right():
    rng = np.random.default_rng(3)
    a = rng.lognormal(3, 0.4, 800)
    b = rng.lognormal(3, 0.4, 800) + 10.0
    diff = bootstrap_difference(a, b, ("mean", "p50", "p90"))
    for d in diff.values():
        assert d.significant and d.ci_low < 10.0 < d.ci_high + 3.0
    assert diff["p50"].delta == pytest.approx(np.median(b) - np.median(a))
    assert rank_test(a, b) < 1e-6


def test_same_distribution_is_rarely_called_significant():
    rng = np.random.default_rng(11)
    false_alarms = 0
    for _ in range(40):
        a, b = rng.exponential(20, 300), rng.exponential(20, 300)
        false_alarms += bootstrap_difference(a, b, ("p50",), rounds=300, seed=1)["p50"].significant
    assert false_alarms <= 6  # ~5% expected at 95% confidence


def test_large_pooled_samples_are_bounded_and_conservative():
    rng = np.random.default_rng(5)
    a = rng.exponential(5, 60_000)
    d = bootstrap_difference(a, a.copy(), ("p99",), rounds=200)["p99"]
    assert d.delta == 0 and d.ci_low < 0 < d.ci_high


def test_statistic_names():
    values = np.arange(101, dtype=float)
    assert statistic(values, "mean") == 50
    assert statistic(values, "p99") == 99
    with pytest.raises(ValueError):
        bootstrap_difference(np.array([]), values, ("p50",))
    assert rank_test(np.array([1.0]), values) is None


def test_a_percentiles_rounds_are_distributed_as_resampling_gives_them():
    """Two Beta draws a round stand for sorting a resample: the same distribution."""
    rng = np.random.default_rng(2)
    values = rng.lognormal(0, 1, 40).round(1)  # ties too
    for m, q in ((40, 50), (40, 90), (7, 50), (25, 99), (1, 50)):
        drawn = significance._resampled_percentile(np.sort(values), m, q, 20_000, rng)
        resampled = np.percentile(values[rng.integers(0, 40, (20_000, m))], q, axis=1)
        assert scipy_stats.ks_2samp(drawn, resampled).pvalue > 0.001, (m, q)


def test_a_mean_of_many_values_is_drawn_as_resampling_would():
    """Beyond MAX_EXACT_MEAN values the mean comes from its moments: its interval is
    resampling's within a twentieth of the resampled mean's spread (1,000 rounds of
    resampling place an end of the interval within about a tenth)."""
    rng = np.random.default_rng(4)
    values = np.concatenate([rng.lognormal(3, 1, 4_410), rng.lognormal(3, 1, 90) * 20])
    m = len(values)
    assert m > significance.MAX_EXACT_MEAN
    drawn = significance._resampled_mean(values, m, 100_000, rng)
    resampled = np.concatenate([values[rng.integers(0, m, (2_000, m))].mean(axis=1)
                                for _ in range(10)])
    spread = resampled.std()
    for level in (0.025, 0.5, 0.975):
        assert abs(np.quantile(drawn, level) - np.quantile(resampled, level)) < spread / 20
    normal = values.mean() + spread * scipy_stats.norm.ppf(0.975)  # skewness matters
    assert abs(normal - np.quantile(resampled, 0.975)) > spread / 20


def _groups(lengths: np.ndarray, values: np.ndarray) -> Ragged:
    return Ragged(values, np.concatenate([[0], np.cumsum(lengths)]))


@pytest.mark.parametrize("case", ["varied", "ties", "constant", "one group", "narrow windows",
                                  "small blocks"])
def test_a_cluster_rounds_statistics_are_its_resamples(case, monkeypatch):
    """Read from windows, each round's percentiles and mean are exactly those of the
    resample its drawn groups make."""
    rng = np.random.default_rng(8)
    n = 1 if case == "one group" else 300
    lengths = rng.integers(0, 40, n) if n > 1 else np.array([30])
    scale = np.repeat(rng.lognormal(0, 0.5, n), lengths)  # groups that sit high or low
    values = rng.lognormal(3, 0.3, lengths.sum()) * scale
    if case == "ties":
        values = values.round(-1)
    if case == "constant":
        values = np.full(lengths.sum(), 7.0)
    if case == "narrow windows":  # most rounds fall outside the first window: read again
        monkeypatch.setattr(cluster_bootstrap, "WINDOW_ERRORS", 0.2)
    if case == "small blocks":  # passes over the values a few groups at a time
        monkeypatch.setattr(cluster_bootstrap, "BLOCK", 100)
    rows = rng.random(n) < 0.8 if n > 1 else None  # some requests' gaps only
    groups = _groups(lengths, values)
    draws = ClusterDraws.draw(groups, 200, 250, rng, rows)
    qs = [0, 1, 50, 90, 99, 100]
    found = draws.percentiles(qs)
    starts = groups.offsets[:-1][(lengths > 0) & (True if rows is None else rows)]
    sample = values[np.repeat(True if rows is None else rows, lengths)]
    assert [found[q][0] for q in qs] == list(np.percentile(sample, qs))  # row 0: the sample
    assert draws.means()[0] == pytest.approx(sample.mean(), rel=1e-12)
    picks = draws.weights.indices[len(draws.lengths):].reshape(200, -1)
    for r, drawn in enumerate(picks, start=1):
        resample = np.concatenate([values[starts[i]:starts[i] + draws.lengths[i]]
                                   for i in drawn])
        assert [found[q][r] for q in qs] == list(np.percentile(resample, qs))
        assert draws.means()[r] == pytest.approx(resample.mean(), rel=1e-12)


def _itl(rng, requests: int, slower: float = 1.0) -> Ragged:
    """Token gaps of `requests` requests whose gaps move together (the batch they ran in)."""
    lengths = rng.integers(30, 60, requests)
    level = np.repeat(rng.lognormal(np.log(20 * slower), 0.3, requests), lengths)
    return _groups(lengths, level * rng.lognormal(0, 0.2, lengths.sum()))


def test_identical_setups_are_rarely_called_different_and_real_changes_are_found():
    """Two runs of one setup: each statistic's interval excludes zero about 5% of the time
    (as many as 7 of 60 pass); resampling gaps one by one, ignoring that a request's move
    together, would call several times as many different. A 10% slower decode is found."""
    rng = np.random.default_rng(21)
    stats = ("mean", "p50", "p90", "p99")
    grouped, pooled = dict.fromkeys(stats, 0), dict.fromkeys(stats, 0)
    for seed in range(60):
        a, b = _itl(rng, 150), _itl(rng, 150)
        for s, d in cluster_bootstrap_difference(a, b, stats, rounds=300, seed=seed).items():
            grouped[s] += d.significant
        for s, d in bootstrap_difference(a.values, b.values, stats, rounds=300).items():
            pooled[s] += d.significant
    assert all(count <= 7 for count in grouped.values()), grouped
    assert sum(pooled.values()) > 3 * sum(grouped.values()), (pooled, grouped)
    for seed in range(5):
        found = cluster_bootstrap_difference(_itl(rng, 1_000), _itl(rng, 1_000, slower=1.1),
                                             stats, rounds=300, seed=seed)
        assert all(found[s].significant and found[s].delta > 0 for s in ("mean", "p50", "p90"))


def test_fishers_exact_test_is_scipys():
    rng = np.random.default_rng(6)
    tables = [[[0, 5], [0, 7]], [[1, 1], [1, 1]], [[5, 0], [0, 5]], [[200, 9800], [260, 9740]]]
    tables += [[[a, 900 - a], [c, 1200 - c]] for a, c in rng.integers(0, 90, (50, 2))]
    for table in tables:
        assert fisher_test(table) == pytest.approx(scipy_stats.fisher_exact(table).pvalue,
                                                   rel=1e-6)
