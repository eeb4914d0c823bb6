"""Arrival processes, statistically (seeded, many samples, tolerances of several sigma)."""

import itertools

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from latlab.load.workload.arrivals import arrival_times, user_start_times
from latlab.load.workload.traces import TraceError
from latlab.records.arrivals import ArrivalConfig

N = 20000


def times(n: int = N, **kw) -> np.ndarray:
    return np.array(list(itertools.islice(arrival_times(ArrivalConfig(**kw)), n)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_poisson_rate_and_exponential_gaps(seed):
    t = times(process="poisson", rate=40.0, seed=seed)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    assert len(t) / t[-1] == pytest.approx(40.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.04)
    # the gaps are exponential: a Kolmogorov–Smirnov test does not reject it
    assert stats.kstest(gaps, "expon", args=(0, 1 / 40.0)).pvalue > 0.001
    # counts per second are Poisson: dispersion index (variance / mean) near 1
    counts = np.histogram(t, bins=np.arange(0, int(t[-1])))[0]
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.15)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 4.0])
def test_gamma_keeps_the_rate_with_cv_of_its_shape(burstiness):
    t = times(process="gamma", rate=20.0, burstiness=burstiness, seed=7)
    gaps = np.diff(t)
    assert len(t) / t[-1] == pytest.approx(20.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.06)


def test_constant_gaps_are_exact():
    t = times(1000, process="constant", rate=8.0)
    assert np.allclose(np.diff(t), 1 / 8.0)


def test_linear_ramp_grows_the_rate_from_zero():
    ramp, rate = 20.0, 50.0
    t = times(process="poisson", rate=rate, ramp_s=ramp, seed=3)
    # expected arrivals in [a, b) during the ramp: rate/(2·ramp)·(b² − a²); after it: rate·(b − a)
    for a, b in [(0, 5), (5, 10), (10, 15), (15, 20)]:
        expected = rate / (2 * ramp) * (b * b - a * a)
        observed = np.count_nonzero((t >= a) & (t < b))
        assert abs(observed - expected) < 5 * np.sqrt(expected) + 2
    after = np.count_nonzero((t >= 20) & (t < 40))
    assert after == pytest.approx(rate * 20, rel=0.08)


def test_the_schedule_depends_only_on_the_seed():
    a = times(100, process="poisson", rate=5.0, seed=4)
    b = times(100, process="poisson", rate=5.0, seed=4)
    c = times(100, process="poisson", rate=5.0, seed=5)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_closed_loop_users_ramp_in():
    assert user_start_times(4, 0.0) == [0.0] * 4
    assert user_start_times(4, 8.0) == [0.0, 2.0, 4.0, 6.0]


def test_trace_replay(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"timestamp": 100.5}\n{"timestamp": 100.0}\n\n{"timestamp": 102.25}\n')
    assert list(arrival_times(ArrivalConfig(process="trace", trace=path))) == [0.0, 0.5, 2.25]
    ms = tmp_path / "ms.jsonl"
    ms.write_text('{"timestamp_ms": 1000}\n{"timestamp_ms": 1250}\n')
    assert list(arrival_times(ArrivalConfig(trace=ms))) == [0.0, 0.25]


@pytest.mark.parametrize("content,fragment", [("", "empty"),
                                              ('{"timestamp": "soon"}\n',
                                               "line 1: `timestamp` must be a number"),
                                              ('{"timestamp": 1}\n{oops\n',
                                               "line 2: `(line)` is not JSON")])
def test_bad_traces_name_the_option(tmp_path, content, fragment):
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError) as e:
        list(arrival_times(ArrivalConfig(trace=path)))
    assert "--trace" in str(e.value) and fragment in str(e.value)
    with pytest.raises(TraceError, match="cannot read"):
        list(arrival_times(ArrivalConfig(trace=tmp_path / "missing.jsonl")))


@pytest.mark.parametrize("kw", [dict(process="poisson"), dict(process="poisson", rate=-1.0),
                                dict(process="gamma", rate=1.0, burstiness=0),
                                dict(process="trace"), dict(users=0)])
def test_invalid_configs_are_rejected(kw):
    with pytest.raises(ValidationError):
        ArrivalConfig(**kw)
