"""The four verdicts on replicates: error rates by simulation (fixed seeds), power with few
rounds, equivalence, the sequential looks' α."""

import math
from functools import partial

import numpy as np
import pytest

from latlab.analysis.verdicts import (
    FAMILY_ALPHA,
    PAIRED_FROM,
    alpha,
    judge,
    judge_look,
    look_share,
    paired_interval,
    ratio_interval,
    same_spent,
    spent,
)
from latlab.records.verdict import HEADLINE

HEADLINE_ALPHA = FAMILY_ALPHA / len(HEADLINE)


def rounds(rng, n: int, level: float, spread: float) -> np.ndarray:
    """`n` rounds' values of a statistic around `level`, each off by a lognormal drift."""
    return level * np.exp(rng.normal(0, spread, n))


def verdict(a, b, min_effect=0.05, strict=False, confidence=1 - HEADLINE_ALPHA):
    return judge(ratio_interval(a, b, confidence), min_effect, lower_is_better=True,
                 strict=strict).verdict


@pytest.mark.parametrize("n,spread", [(2, 0.05), (3, 0.2), (5, 0.5)])
def test_a_a_is_rarely_better_or_worse(n, spread):
    """Identical sides: a false better/worse at most at the test's α (1 %), over 2,000
    simulated A/As."""
    rng = np.random.default_rng(n)
    calls = [verdict(rounds(rng, n, 100, spread), rounds(rng, n, 100, spread))
             for _ in range(2000)]
    false = sum(v in ("better", "worse") for v in calls)
    assert false / len(calls) <= 2 * HEADLINE_ALPHA, false


@pytest.mark.parametrize("n", [2, 3])
def test_a_twofold_change_is_never_the_same(n):
    """B twice as slow, rounds drifting 30 %: never "same", whatever the draw."""
    rng = np.random.default_rng(7)
    calls = {verdict(rounds(rng, n, 100, 0.3), rounds(rng, n, 200, 0.3)) for _ in range(2000)}
    assert "same" not in calls and "better" not in calls
    assert "worse" in calls


def test_twenty_times_slower_is_worse_with_two_rounds():
    """The GPU case: TTFT p50 37.6 → 2,348 ms over two rounds a side, the slow side's rounds
    far apart in milliseconds (a band in ms called this "same")."""
    assert verdict([37.6, 39.0], [2100.0, 2600.0]) == "worse"
    assert verdict([4199.0, 4100.0], [850.0, 1000.0]) == "better"  # tok/s: lower is "better"


def test_same_needs_the_whole_interval_inside_the_minimum_effect():
    tight_a, tight_b = [100.0, 100.5, 99.8], [100.2, 100.1, 99.9]
    assert verdict(tight_a, tight_b) == "same"
    wide = judge(ratio_interval([100.0, 130.0], [110.0, 90.0], 0.99), 0.05, True, False)
    assert wide.verdict == "can't tell" and "more rounds" in wide.why


def test_strict_verdicts_need_the_interval_past_the_minimum_effect():
    """Two single runs: a change of 6 % whose interval reaches down to 3 % is not called."""
    a = [100.0, 100.4, 99.6, 100.1]
    b = [106.0, 103.5, 108.5, 106.2]
    assert verdict(a, b) == "worse"
    strict = judge(ratio_interval(a, b, 0.99), 0.05, True, strict=True)
    assert strict.verdict == "can't tell" and "latlab ab" in strict.why
    far = [200.0, 201.0, 199.0, 200.5]  # twice as slow: past the minimum effect throughout
    assert verdict(a, far, strict=True) == "worse"


def test_two_single_runs_are_never_the_same():
    """Blocks inside ±5 % of each other: "same" from an A/B's rounds, but from two single runs
    "can't tell" (a drift between the runs would not show in their blocks)."""
    tight_a, tight_b = [100.0, 100.5, 99.8, 100.1], [100.2, 100.1, 99.9, 100.3]
    assert verdict(tight_a, tight_b) == "same"
    strict = judge(ratio_interval(tight_a, tight_b, 0.99), 0.05, True, strict=True)
    assert strict.verdict == "can't tell" and "latlab ab" in strict.why
    assert -0.05 < strict.interval.low < strict.interval.high < 0.05


def test_too_few_replicates_cannot_tell():
    assert ratio_interval([1.0], [2.0], 0.95) is None
    assert judge(None, 0.05, True, False).verdict == "can't tell"
    zero = ratio_interval([1.0, 0.0, 0.5], [2.0, 2.1, 1.9], 0.95)  # a rate that was 0 once
    assert zero is not None and zero.estimate == pytest.approx(3.0)


def test_more_rounds_shrinks_the_interval_to_a_decision():
    rng = np.random.default_rng(3)
    a, b = rounds(rng, 20, 100, 0.25), rounds(rng, 20, 150, 0.25)
    first = ratio_interval(a[:3], b[:3], 0.99)
    more = first.more_rounds(0.05)
    assert more is not None and more >= 1
    later = ratio_interval(a, b, 0.99)
    assert later.half_width < first.half_width


def test_the_looks_spend_exactly_alpha():
    most, looks = 10, [3, 4, 5, 6, 7, 8, 9, 10]
    shares = [look_share(r, p, most) for r, p in zip(looks, [0, *looks[:-1]])]
    for kind in ("change", "same"):
        spends = [getattr(s, kind) for s in shares]
        assert sum(spends) == pytest.approx(1.0) and all(s > 0 for s in spends)
    assert spent(0) == 0 and spent(1) == pytest.approx(1) and spent(0.3) > 0.3  # front-loaded
    assert same_spent(0.7) < 0.1 and same_spent(1) == 1  # "same": late
    assert shares[0].change > shares[0].same and shares[-1].same > shares[-1].change


def test_a_final_look_spends_what_is_left():
    """Stopped by --max-time after 5 of 10 rounds: the fifth look is the last one."""
    first, last = look_share(3, 0, 10), look_share(5, 3, 10, final=True)
    assert first.change + last.change == pytest.approx(1.0)
    assert first.same + last.same == pytest.approx(1.0)


def test_headline_metrics_keep_their_alpha_however_many_rows():
    keys = [*HEADLINE, *(f"p90_x{i}" for i in range(40))]
    assert alpha("p99_ttft", keys) == pytest.approx(FAMILY_ALPHA / 5)
    assert alpha("p90_x3", keys) == pytest.approx(FAMILY_ALPHA / 40)
    assert math.isclose(sum(alpha(k, keys) for k in keys), 2 * FAMILY_ALPHA)


def test_the_keys_decided_on_share_an_alpha_of_their_own():
    keys = [*HEADLINE, "mean_itl_max", *(f"p90_x{i}" for i in range(40))]
    assert alpha("mean_itl_max", keys, ("mean_itl_max",)) == pytest.approx(FAMILY_ALPHA)
    assert alpha("p99_ttft", keys, ("mean_itl_max",)) == pytest.approx(FAMILY_ALPHA / 5)
    assert alpha("p90_x3", keys, ("mean_itl_max",)) == pytest.approx(FAMILY_ALPHA / 40)
    both = ("mean_itl_max", "p99_ttft")  # one headline key decided on leaves four
    assert alpha("p99_ttft", keys, both) == pytest.approx(FAMILY_ALPHA / 2)
    assert alpha("p50_ttft", keys, both) == pytest.approx(FAMILY_ALPHA / 4)
    assert math.isclose(sum(alpha(k, keys, both) for k in keys), 3 * FAMILY_ALPHA)


def test_a_side_of_zeros_still_gets_a_verdict():
    """Goodput 0 in every B round (no request met the SLOs): a change, not a crash."""
    interval = ratio_interval([2.0, 2.2, 1.9], [0.0, 0.0, 0.0], 0.99)
    assert interval.estimate == -1 and not interval.logs
    found = judge(interval, 0.05, lower_is_better=False, strict=False)
    assert found.verdict == "worse"
    unsure = judge(ratio_interval([2.0, 0.1, 3.9], [0.0, 0.0, 0.1], 0.99), 0.05, False, False)
    assert unsure.verdict == "can't tell" and unsure.why


def test_from_nothing_to_something_is_a_change():
    """Goodput 0 in every A round and clearly more in B's (a tune whose start met no SLO)."""
    grew = ratio_interval([0.0, 0.0, 0.0], [4.8, 5.1, 5.3], 0.99)
    assert grew.low == math.inf
    assert judge(grew, 0.05, lower_is_better=False, strict=False).verdict == "better"
    unsure = ratio_interval([0.0, 0.0], [0.0, 3.0], 0.99)
    assert unsure.low == 0 and judge(unsure, 0.05, False, False).verdict == "can't tell"
    nothing = ratio_interval([0.0, 0.0], [0.0, 0.0], 0.99)
    assert judge(nothing, 0.05, False, False).verdict == "same"


def test_an_ab_stops_on_the_metrics_it_decides_on():
    from types import SimpleNamespace

    from latlab.analysis.ab import Sequential
    from latlab.analysis.compare import Change

    ttft = Change("p50_ttft", "TTFT p50", "ms", 900.0, 450.0)  # can't tell yet
    goodput = Change("goodput", "goodput", "req/s", 1.0, 2.0, lower_is_better=False,
                     verdict="better")
    looked = SimpleNamespace(changes=[ttft, goodput])
    assert Sequential.undecided(looked) == [ttft]  # the headline metrics: one more round
    assert Sequential.undecided(looked, ("goodput",)) == []  # tune's: done


def sequential(a, b, min_effect: float = 0.2, first: int = 3) -> tuple[str, int]:
    """One key decided on (its family's whole α), looked at as `latlab ab` looks: from the
    `first` round on, after each pair, up to len(a), pair by pair from PAIRED_FROM pairs; the
    verdict and the rounds it took."""
    previous = 0
    for n in range(first, len(a) + 1):
        share = look_share(n, previous, len(a))
        previous = n
        interval = paired_interval if n >= PAIRED_FROM else ratio_interval
        found = judge_look(partial(interval, a[:n], b[:n]), FAMILY_ALPHA, share, min_effect,
                           True)
        if found.verdict != "can't tell":
            return found.verdict, n
    return "can't tell", len(a)


@pytest.mark.parametrize("change,spread,wrong", [
    (1.0, 0.15, {"better", "worse"}),  # A/A on a busy host: no change called
    (1.25, 0.15, {"same", "better"}),  # past the 20 % minimum: never "same"
    (1.2, 0.15, {"same", "better"}),  # at the minimum itself
])
def test_an_ab_errs_at_most_at_its_alpha_over_all_its_looks(change, spread, wrong):
    """Ten rounds at most, looked at from the third: a wrong call in at most α (5 %) of
    1,000 simulated A/Bs, whatever the looks."""
    rng = np.random.default_rng(int(change * 100))
    calls = [sequential(rounds(rng, 10, 100, spread), rounds(rng, 10, 100 * change, spread))[0]
             for _ in range(1000)]
    assert sum(v in wrong for v in calls) / len(calls) <= FAMILY_ALPHA


def test_an_a_a_on_steady_rounds_is_the_same_within_ten_rounds():
    """Rounds 8 % apart (a calm host) and the 20 % minimum effect of the longest pause."""
    rng = np.random.default_rng(11)
    calls = [sequential(rounds(rng, 10, 100, 0.08), rounds(rng, 10, 100, 0.08))[0]
             for _ in range(300)]
    assert calls.count("same") / len(calls) >= 0.8


@pytest.mark.parametrize("spread,median_rounds", [(0.2, 3), (0.3, 5)])
def test_a_twofold_change_is_decided_in_few_rounds_and_never_the_same(spread, median_rounds):
    rng = np.random.default_rng(12)
    found = [sequential(rounds(rng, 10, 100, spread), rounds(rng, 10, 200, spread))
             for _ in range(300)]
    assert not any(v in ("same", "better") for v, _ in found)
    assert [v for v, _ in found].count("worse") >= 0.9 * len(found)
    assert np.median([n for _, n in found]) <= median_rounds


def drifting(rng, n: int, change: float, drift: float, own: float):
    """`n` A/B pairs on a host whose drift (sd `drift` of the logs) each pair shares, each
    round off by its own `own` too; B `change` times A."""
    shared = rng.normal(0, drift, n)
    return (100 * np.exp(shared + rng.normal(0, own, n)),
            100 * change * np.exp(shared + rng.normal(0, own, n)))


@pytest.mark.parametrize("change,wrong", [(1.0, {"better", "worse"}), (1.25, {"same"})])
def test_pairs_keep_the_error_rates_on_a_drifting_host(change, wrong):
    rng = np.random.default_rng(21)
    calls = [sequential(*drifting(rng, 10, change, 0.3, 0.1))[0] for _ in range(1000)]
    assert sum(v in wrong for v in calls) / len(calls) <= FAMILY_ALPHA


def test_an_a_a_on_a_slowly_drifting_host_is_the_same_pair_by_pair():
    """The third latlab serve A/A: rounds 0.315 apart (sd of logs), pairs 0.12: side
    against side "same" was out of reach in ten rounds; pair by pair it is within them."""
    rng = np.random.default_rng(22)
    calls = [sequential(*drifting(rng, 10, 1.0, 0.29, 0.12))[0] for _ in range(300)]
    assert calls.count("same") / len(calls) >= 0.5


def test_a_paired_interval_needs_three_positive_pairs():
    assert paired_interval([1.0, 2.0], [1.0, 2.0], 0.95) is None
    assert paired_interval([1.0, 0.0, 2.0], [1.0, 2.0, 2.0], 0.95) is None
    both = paired_interval([100.0, 200.0, 50.0], [110.0, 220.0, 55.0], 0.95)
    assert both.estimate == pytest.approx(0.1) and both.low == pytest.approx(0.1)


def test_a_look_tests_no_change_at_its_share_and_same_by_two_one_sided_tests():
    asked = []

    def interval(confidence):
        asked.append(confidence)
        return ratio_interval([100.0, 101.0, 99.0, 100.0], [100.0, 100.5, 99.5, 100.0],
                              confidence)

    found = judge_look(interval, 0.01, look_share(5, 3, 10), 0.2, True)
    share = look_share(5, 3, 10)
    assert asked == pytest.approx([1 - 0.01 * share.change, 1 - 2 * 0.01 * share.same])
    assert found.verdict == "same" and found.interval.confidence == asked[1]
