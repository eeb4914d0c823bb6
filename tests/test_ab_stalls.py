"""The stall finding's metric, ITL per-request max (each stream's longest pause), averaged
over the streams: what one stream saw, computed from its token times; and the A/B verdicts it
gives on rounds built like llama-server's (a dozen streams a round, each stalled by the
prefills that overlapped it), where a round's ITL p99 is its few longest gaps."""

import numpy as np
import pytest
from timelines import timeline, write_run

from latlab.analysis import analyze
from latlab.analysis.ab import Sequential
from latlab.analysis.rules.compute import STALL_METRIC
from latlab.metrics.request import metric_columns, request_metrics
from latlab.metrics.summary import summarize
from latlab.records.ab import ABConfig
from latlab.records.table import as_table
from latlab.records.verdict import VerdictConfig, key_of

KEY = key_of(*STALL_METRIC)


def test_each_streams_longest_pause_is_its_itl_max():
    calm = timeline(0, 0, tokens=20, itl=30)
    stalled = timeline(1, 0, tokens=20, itl=30, stalls={5: 400, 12: 250})
    assert request_metrics(calm).itl_max == pytest.approx(30)
    assert request_metrics(stalled).itl_max == pytest.approx(430)
    m = metric_columns(as_table([calm, stalled]))
    assert m.itl_max.tolist() == pytest.approx([30, 430])
    summary = summarize([calm, stalled])
    assert summary.percentile(*STALL_METRIC) == pytest.approx((30 + 430) / 2)
    # the pooled ITL p99 of the same two streams is neither stream's longest pause
    assert summary.percentile("itl", "p99") not in (pytest.approx(30), pytest.approx(430))


def rounds(tmp_path, name: str, stall: float, seed: int, n: int = 6) -> list:
    """`n` rounds of 12 streams of 60 tokens; each stream is stalled 1–3 times (the other
    users' prefills), each stall `stall` ms scaled by its prompt's length (0.7–1.3×)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        records = []
        for i in range(12):
            at = rng.choice(np.arange(2, 60), size=rng.integers(1, 4), replace=False)
            stalls = {int(j): float(stall * rng.uniform(0.7, 1.3)) for j in at}
            records.append(timeline(i, i * 300, tokens=60, itl=30 * rng.uniform(0.9, 1.1),
                                    stalls=stalls))
        out.append(analyze(write_run(tmp_path / f"{name}{k}", records), diagnosis=False))
    return out


def looks(a: list, b: list) -> tuple[str, int | None]:
    """The stall metric's verdict over the rounds, looked at as `latlab ab --decide-on` does
    (from the third round on, at most 10), and the rounds it took."""
    config = ABConfig(a="A", b="B", decide_on=(KEY,))
    sequential = Sequential(config, config.most_rounds, config.decide_on)
    for n in range(3, len(a) + 1):
        comparison = sequential.look(a[:n], b[:n])
    return comparison.change(KEY).verdict, sequential.decided_at(KEY)


def test_halved_stalls_are_decided_better_in_few_rounds(tmp_path):
    long, short = rounds(tmp_path, "a", 600, 1), rounds(tmp_path, "b", 300, 2)
    verdict, at = looks(long, short)
    assert verdict == "better" and at is not None and at <= 4


def test_an_a_a_of_stalled_streams_is_not_called_a_change(tmp_path):
    a, b = rounds(tmp_path, "a", 600, 3, n=8), rounds(tmp_path, "b", 600, 4, n=8)
    verdict, _ = looks(a, b)
    assert verdict == "same"


def test_decide_on_takes_only_keys_a_comparison_has():
    assert ABConfig(a="A", b="B", decide_on=[KEY]).decide_on == (KEY,)
    with pytest.raises(ValueError, match="--decide-on mean_stall: expected one of"):
        ABConfig(a="A", b="B", decide_on=["mean_stall"])
    with pytest.raises(ValueError, match="--decide-on '': expected one of"):
        ABConfig(a="A", b="B", decide_on=[""])


def test_the_longest_pause_keeps_its_own_minimum_effect_unless_it_is_named():
    assert VerdictConfig().effect(KEY) == 0.2 and VerdictConfig().effect("p99_itl") == 0.05
    assert VerdictConfig(min_effect=["itl_max=10%"]).effect(KEY) == 0.1
    assert VerdictConfig(min_effect=[f"{KEY}=15%", "itl_max=10%"]).effect(KEY) == 0.15
    every = VerdictConfig(min_effect=["3%"])  # for every metric without a minimum of its own
    assert every.effect(KEY) == 0.2 and every.effect("p99_itl") == 0.03


@pytest.mark.parametrize("given,says", [
    (["5"], "expected PCT% or METRIC=PCT%"), (["itl_max=x%"], "expected PCT%"),
    (["stall=5%"], "stall is not a compared metric or statistic"),
    (["5%", "6%"], "every metric given twice"), ([f"{KEY}=5%", f"{KEY}=6%"], "given twice"),
    (["100%"], "cannot fall by 100% or more")])
def test_a_bad_minimum_effect_is_named(given, says):
    with pytest.raises(ValueError, match=says):
        VerdictConfig(min_effect=given)


def test_a_look_says_a_decide_on_key_not_measured_instead_of_decided(tmp_path):
    a, b = rounds(tmp_path, "a", 600, 5, n=3), rounds(tmp_path, "b", 300, 6, n=3)
    keys = ("goodput", KEY)  # these rounds were analysed without SLOs: no goodput
    config = ABConfig(a="A", b="B", decide_on=keys, bench={"slos": ["ttft=200ms"]})
    comparison = Sequential(config, config.most_rounds, config.decide_on).look(a, b)
    assert comparison.change("goodput") is None
    line = Sequential.look_line(comparison, keys)
    assert "not measured on both sides" in line and "decided" not in line


def test_decide_on_goodput_needs_the_slos_it_is_judged_by():
    with pytest.raises(ValueError, match="--decide-on goodput: give the SLOs"):
        ABConfig(a="A", b="B", decide_on=["goodput"])
    assert ABConfig(a="A", b="B", decide_on=["goodput"],
                    bench={"slos": ["ttft=200ms"]}).decide_on == ("goodput",)
