"""The statistics a comparison takes, and Fisher's exact test against scipy's."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from latlab.analysis.significance import fisher_test, statistics


def test_statistic_names():
    values = np.arange(101, dtype=float)
    assert statistics(values, ("mean", "p99")) == {"mean": 50, "p99": 99}
    assert statistics(values, ("p50", "mean", "p90")) == {"p50": 50, "mean": 50, "p90": 90}


def test_fishers_exact_test_is_scipys():
    rng = np.random.default_rng(6)
    tables = [[[0, 5], [0, 7]], [[1, 1], [1, 1]], [[5, 0], [0, 5]], [[200, 9800], [260, 9740]]]
    tables += [[[a, 900 - a], [c, 1200 - c]] for a, c in rng.integers(0, 90, (50, 2))]
    for table in tables:
        assert fisher_test(table) == pytest.approx(scipy_stats.fisher_exact(table).pvalue,
                                                   rel=1e-6)
