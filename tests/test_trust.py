"""The defects a new user found (issue 10): numbers and advice that must not be wrong."""

from latlab.metrics.summary import RunContext, summarize
from latlab.records.timeline import Outcome, RequestTimeline
from latlab.records.window import Window

MS = 1_000_000


def sent_on_time(n: int, gap_ms: float, late_ms: float = 0.5, e2e_ms: float = 50.0,
                 **extra) -> list[RequestTimeline]:
    records = []
    for i in range(n):
        at = int(i * gap_ms * MS)
        r = RequestTimeline(id=f"r{i}", index=i, scheduled_ns=at, sent_ns=at + int(late_ms * MS),
                            **extra)
        r.add_token_event(r.sent_ns + 10 * MS)
        r.done_ns = r.sent_ns + int(e2e_ms * MS)
        records.append(r)
    return records


def test_a_count_stopped_run_that_kept_its_schedule_is_not_called_late():
    records = sent_on_time(8, 125.0)  # 8 req/s, every send 0.5 ms late
    s = summarize(records, Window.of_run(records))
    assert s.throughput.sent_rate >= 0.95 * s.throughput.offered_rate
    assert not any("could not keep the schedule" in w for w in s.warnings)


def test_a_concurrency_cap_is_not_blamed_on_the_client():
    records = sent_on_time(20, 50.0, late_ms=400.0)  # held back by the cap
    s = summarize(records, Window.of_run(records), context=RunContext(concurrency_cap=2))
    assert any("--max-concurrency 2 cap held requests back" in w for w in s.warnings)
    assert not any("could not keep the schedule" in w for w in s.warnings)
    assert any("could not keep the schedule" in w
               for w in summarize(records, Window.of_run(records)).warnings)


def test_a_dead_target_is_not_the_clients_lateness():
    records = sent_on_time(20, 50.0)
    for r in records[10:]:  # the target died: connections refused, nothing was sent
        r.sent_ns, r.token_ns, r.token_counts, r.first_token_ns = None, [], [], None
        r.outcome, r.done_ns = Outcome.CONNECTION_REFUSED, r.scheduled_ns + MS
    s = summarize(records, Window.of_run(records))
    assert not any("could not keep the schedule" in w for w in s.warnings)


def test_identical_setups_do_not_differ_in_itl(tmp_path):
    """A request's token gaps move together: resampled one by one they look like thousands
    of independent samples and two runs of the same setup 'differ'."""
    import numpy as np
    from timelines import timeline, write_run

    from latlab.analysis import analyze
    from latlab.analysis.compare import compare

    def run(seed: int):
        rng = np.random.default_rng(seed)
        records = [timeline(i, i * 100, tokens=60, itl=float(rng.lognormal(np.log(10), 0.3)))
                   for i in range(60)]
        return analyze(write_run(tmp_path / str(seed), records))

    c = compare(run(1), run(2))
    for stat in ("p50", "mean", "p99"):
        change = c.change(f"{stat}_itl")
        assert change.verdict not in ("better", "worse"), (stat, change.a, change.b,
                                                           change.interval)


def test_a_point_that_fell_behind_meets_no_slo():
    from latlab.analysis.slo_max import slo_max
    from latlab.records.sweep import Point

    def point(rate: float, achieved: float, ttft: float, behind: bool = False) -> Point:
        return Point(label=f"{rate:g} req/s", mode="rate", load=rate, achieved=achieved,
                     error_rate=0.0, requests=100, latency=ttft * 3, median_latency=ttft * 2,
                     slo_values={"ttft": ttft}, output_tokens_per_s=0.0,
                     offered=rate * 1.37, fell_behind=behind)

    points = [point(1, 1.0, 100), point(3, 3.0, 200), point(6, 4.71, 300, behind=True)]
    best = slo_max(points, {"ttft": 500.0}, 99)
    assert best.load == 3 and best.failing.label == "6 req/s"
    assert "fell behind" in best.statement and "4.71 of 8.22 req/s offered" in best.statement


def test_one_late_send_in_a_small_run_is_not_a_verdict():
    from latlab.metrics.client import client_check
    from latlab.records.health import WorkerHealth

    def health(late: list[float]) -> WorkerHealth:
        return WorkerHealth(worker=0, loop_lag_ms=[0.1] * 500, loop_lag_at_ns=list(range(500)),
                            dispatch_lateness_ms=late, dispatch_at_ns=list(range(len(late))),
                            cpu_mean=5, cpu_max=6)

    one = client_check([health([0.3] * 59 + [152.0])], [])
    assert not one.bottleneck  # p99 of 60 sends rests on the one outlier: unreliable
    many = client_check([health([0.3] * 54 + [40.0] * 6)], [])
    assert many.bottleneck and "lateness p99" in many.reasons[0]


def test_a_single_late_request_does_not_make_the_client_finding_critical(tmp_path):
    from timelines import steady, timeline, write_run

    from latlab.analysis import analyze
    from latlab.analysis.findings import Severity

    records = steady(60) + [timeline(60, 6100, client_wait=400.0)]
    found = {f.rule: f for f in analyze(write_run(tmp_path, records)).findings}
    assert "client_bottleneck" not in found or found["client_bottleneck"].severity != (
        Severity.CRITICAL)


def test_users_starting_together_are_a_burst_not_a_cold_server(tmp_path):
    from timelines import timeline, write_run

    from latlab.analysis import analyze

    burst = [timeline(i, 0, prefill=120 + 10 * i) for i in range(8)]  # 8 prefills at once
    warm = [timeline(8 + i, 1000 + 100 * i, prefill=15) for i in range(40)]
    a = analyze(write_run(tmp_path, burst + warm))
    assert "cold_start" not in {f.rule for f in a.findings}
    assert "started together" in {u.rule: u for u in a.unevaluated}["cold_start"].needs


def test_a_large_network_share_is_a_finding(tmp_path):
    from timelines import steady, write_run

    from latlab.analysis import analyze

    far = {f.rule: f for f in analyze(write_run(tmp_path, steady(40, upload=50,
                                                                 download=50))).findings}
    assert "network_share" in far and "100.0 ms" in far["network_share"].evidence[0]
    near = analyze(write_run(tmp_path, steady(40)))
    assert "network_share" not in {f.rule for f in near.findings}
