import numpy as np
import pytest

from latlab.analysis.significance import bootstrap_difference, rank_test, statistic


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
