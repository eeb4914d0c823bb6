"""The curve analysis on synthetic points: knee, SLO-max and its bracketing, the stop rules,
cost arithmetic."""

import math

import pytest

from latlab.analysis.capacity import (
    cost,
    curve,
    elasticity,
    knee,
    saturation,
    too_many_errors,
)
from latlab.analysis.slo_max import slo_max
from latlab.records.sweep import Point


def pt(load: float, latency: float, achieved: float | None = None, median: float | None = None,
       slo: dict | None = None, mode: str = "rate", tokens: float = 0.0, **kw) -> Point:
    return Point(label=f"{load:g}", mode=mode, load=load,
                 achieved=load if achieved is None else achieved, error_rate=0.0, requests=100,
                 latency=latency, median_latency=latency if median is None else median,
                 slo_values=slo or {}, output_tokens_per_s=tokens, **kw)


def mm1(rates: list[float], mu: float = 10.0, scale: float = 1000.0) -> list[Point]:
    """An M/M/1 queue: latency 1/(mu - rate); its elasticity is rho/(1 - rho)."""
    return [pt(r, scale / (mu - r)) for r in rates]


def test_the_knee_is_where_latency_starts_to_grow_faster_than_throughput():
    points = mm1([1, 3, 5, 7, 8, 9])
    # elasticities by hand: 1→3: ln(9/7)/ln 3 = 0.23, 3→5: ln(7/5)/ln(5/3) = 0.66,
    # 5→7: ln(5/3)/ln(7/5) = 1.52 — the first above 1.
    k = knee(points)
    assert k.load == 5 and k.next == "7"
    assert k.elasticity == pytest.approx(math.log(5 / 3) / math.log(7 / 5))
    assert all(elasticity(a, b) <= 1 for a, b in zip(points[:2], points[1:3]))


def test_the_knee_does_not_depend_on_units_or_order():
    scaled = [pt(p.load * 10, p.latency * 1e-3) for p in mm1([7, 1, 5, 3, 9, 8])]
    assert knee(scaled).load == 50


def test_latency_rising_at_flat_throughput_is_a_knee_of_infinite_elasticity():
    points = [pt(1, 100), pt(2, 105), pt(4, 400, achieved=2.0)]
    k = knee(points)
    assert k.load == 2 and math.isinf(k.elasticity)


def test_no_knee_while_latency_grows_slower_than_throughput():
    assert knee(mm1([1, 2, 3, 4])) is None
    assert knee([pt(1, 100)]) is None


def test_sync_probe_and_interrupted_points_stay_out_of_the_curve():
    sync = pt(0.5, 10, mode="synchronous")  # a closed loop never queues like Poisson arrivals
    probe = pt(64, 5000, achieved=9.0, mode="throughput")
    cut = pt(8, 9000, interrupted=True)
    points = [sync, *mm1([1, 3]), probe, cut]
    assert [p.load for p in curve(points)] == [1, 3]
    assert knee(points) is None


def test_an_open_loop_point_counts_no_more_throughput_than_it_was_offered():
    # 3 → 4 req/s offered, the 3 req/s window happened to complete 3.6/s: throughput rose
    # 3 → 3.9, not 3.6 → 3.9, and latency doubled: a knee at 3.
    points = [pt(2, 100), pt(3, 110, achieved=3.6), pt(4, 220, achieved=3.9)]
    assert points[1].throughput == 3 and points[2].throughput == 3.9
    assert knee(points).load == 3
    assert elasticity(points[1], points[2]) == pytest.approx(math.log(2) / math.log(1.3))


def slo_points(values: list[float], loads=(2, 4, 6, 8), metric="ttft") -> list[Point]:
    return [pt(load, v, slo={metric: v}, tokens=10 * load) for load, v in zip(loads, values)]


def test_slo_max_interpolates_between_the_last_pass_and_the_first_fail():
    best = slo_max(slo_points([100, 200, 400, 800]), {"ttft": 300.0}, 99)
    assert best.passing.load == 4 and best.failing.load == 6
    assert best.load == pytest.approx(5.0)  # 200 → 400 ms over 4 → 6 req/s crosses 300 at 5
    assert best.achieved == pytest.approx(5.0) and best.output_tokens_per_s == pytest.approx(50.0)
    assert best.interpolated and best.limiting == "ttft"
    assert "interpolated linearly in p99 ttft" in best.statement


def test_the_tighter_slo_limits_the_answer():
    points = [pt(load, 0, slo={"ttft": t, "tpot": p})
              for load, t, p in ((2, 100, 10), (4, 200, 20), (6, 400, 60))]
    best = slo_max(points, {"ttft": 300.0, "tpot": 30.0}, 99)
    assert best.limiting == "tpot" and best.load == pytest.approx(4 + 10 / 40 * 2)


def test_slo_max_never_claims_above_the_highest_load_measured():
    best = slo_max(slo_points([10, 20, 30, 40]), {"ttft": 300.0}, 99)
    assert best.load == 8 and best.failing is None and not best.interpolated
    assert "unmeasured" in best.statement


def test_slo_max_when_even_the_lowest_load_fails():
    best = slo_max(slo_points([500, 600, 700, 800]), {"ttft": 300.0}, 99)
    assert best.load is None and best.failing.load == 2 and best.passing is None


def test_failed_requests_at_the_failing_point_stop_the_interpolation():
    best = slo_max(slo_points([100, 200, math.inf, math.inf]), {"ttft": 300.0}, 99)
    assert best.load == 4 and not best.interpolated
    assert "cannot be interpolated" in best.statement
    assert best.model_dump(mode="json")["failing"]["values"]["ttft"] == "inf"


def test_a_point_passing_again_above_a_failure_does_not_raise_the_answer():
    best = slo_max(slo_points([100, 400, 200, 900]), {"ttft": 300.0}, 99)
    assert best.failing.load == 4 and best.load <= 4
    assert best.notes and "6" in best.notes[0]


def test_no_slo_no_answer():
    assert slo_max(slo_points([1, 2, 3, 4]), {}, 99) is None


def test_clear_saturation_stops_the_sweep():
    prev = pt(10, 200, achieved=9.8)
    cur = pt(15, 900, achieved=10.1)
    message = saturation(prev, cur)
    assert message and "+50%" in message and "+3%" in message


@pytest.mark.parametrize("cur", [
    pt(15, 900, achieved=14.7),  # throughput still follows the load
    pt(15, 205, achieved=10.1),  # latency flat
    pt(10.5, 900, achieved=9.8),  # load up only 5%
])
def test_no_saturation_without_all_of_its_signs(cur):
    assert saturation(pt(10, 200, achieved=9.8), cur) is None


def test_an_open_loop_point_keeping_up_with_its_rate_is_not_saturated():
    assert saturation(pt(10, 200, achieved=9.8), pt(11, 400, achieved=10.0)) is None
    closed = saturation(pt(8, 200, achieved=9.8, mode="concurrency"),
                        pt(16, 400, achieved=10.0, mode="concurrency"))
    assert closed and "users" in closed


def test_error_rate_stop():
    point = pt(10, 100)
    point.error_rate = 0.2
    assert "20.0%" in too_many_errors(point, 0.05)
    assert too_many_errors(point, 0.25) is None


def test_cost_per_million_tokens_and_per_thousand_requests():
    c = cost(3.6, requests_per_s=2.0, output_tokens_per_s=100.0)
    assert c.per_million_output_tokens == pytest.approx(10.0)  # $3.6 buys 360,000 tokens
    assert c.per_thousand_requests == pytest.approx(0.5)  # $3.6 buys 7,200 requests
    assert cost(3.6, 0.0, None).model_dump() == {"per_million_output_tokens": None,
                                                 "per_thousand_requests": None}


def test_points_survive_json_with_infinite_values():
    p = pt(4, 100, slo={"ttft": math.inf, "tpot": 12.0})
    back = Point.model_validate_json(p.model_dump_json())
    assert back == p and p.model_dump(mode="json")["slo_values"]["ttft"] == "inf"


def test_slo_max_carries_the_interval_of_its_points_cis():
    """Each point's p99 has a CI; the answer from their tops (lo) and bottoms (hi) brackets
    it. A point whose CI the sample cannot bound from above counts as failing for lo."""
    values = [100, 200, 400, 800]
    points = [pt(load, v, slo={"ttft": v}, tokens=10 * load,
                 slo_intervals={"ttft": (0.8 * v, 1.2 * v)})
              for load, v in zip((2, 4, 6, 8), values)]
    best = slo_max(points, {"ttft": 300.0}, 99)
    assert best.load == pytest.approx(5.0) and best.lo < best.load < best.hi
    assert best.level == 0.95
    unbounded = [p.model_copy(update={"slo_intervals": {"ttft": (0.0, math.inf)}})
                 for p in points]
    thin = slo_max(unbounded, {"ttft": 300.0}, 99)  # too few samples to bound any point
    assert thin.load == pytest.approx(5.0) and thin.lo is None and math.isinf(thin.hi)
