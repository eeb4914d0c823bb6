import math
from dataclasses import replace

import numpy as np
import pytest

from latlab.metrics.request import request_metrics
from latlab.metrics.slo import meets_slos
from latlab.metrics.stats import binomial_quantile, distribution, percentile, percentile_ci
from latlab.metrics.summary import summarize
from latlab.records.slo import parse_slo
from latlab.records.timeline import Outcome, RequestTimeline, ServerTiming
from latlab.records.window import Window

MS = 1_000_000


def streamed(index: int, scheduled_ms: float, sent_ms: float, token_ms: list[float],
             counts: list[int] | None = None, usage: int | None = None,
             done_ms: float | None = None) -> RequestTimeline:
    r = RequestTimeline(id=f"r{index}", index=index, scheduled_ns=int(scheduled_ms * MS),
                        sent_ns=int(sent_ms * MS))
    for t, k in zip(token_ms, counts or [1] * len(token_ms)):
        r.add_token_event(int(t * MS), k)
    r.done_ns = int((done_ms if done_ms is not None else token_ms[-1] + 1) * MS)
    if usage is not None:
        r.completion_tokens, r.tokens_from_usage = usage, True
    return r


def test_request_metrics_follow_the_definitions():
    # first token at +50 ms, then events every 10 ms; the third event carries 3 tokens
    r = streamed(0, scheduled_ms=0, sent_ms=5, token_ms=[55, 65, 75, 85], counts=[1, 1, 3, 1],
                 usage=6, done_ms=90)
    m = request_metrics(r)
    assert m.ttft == pytest.approx(50)
    assert m.ttft_sched == pytest.approx(55)
    assert m.e2e == pytest.approx(85)
    assert m.e2e_sched == pytest.approx(90)
    assert m.lateness == pytest.approx(5)
    assert m.tpot == pytest.approx(30 / 5)
    assert m.chunk_gaps == pytest.approx([10, 10, 10])
    assert m.itl == pytest.approx([10, 10 / 3, 10 / 3, 10 / 3, 10])
    assert m.output_tokens == 6


def test_tpot_needs_two_tokens_and_failures_have_no_e2e():
    one = streamed(0, 0, 0, [40], usage=1)
    assert request_metrics(one).tpot is None
    broken = streamed(1, 0, 0, [40, 50])
    broken.outcome = Outcome.STREAM_BROKEN
    m = request_metrics(broken)
    assert m.ttft == pytest.approx(40) and m.e2e is None and m.tpot is None


def test_client_count_is_the_fallback_without_usage():
    r = streamed(0, 0, 0, [10, 20, 30], counts=[1, 2, 1])
    assert r.output_tokens == 4 and not r.tokens_from_usage


def test_percentile_is_linear_and_matches_numpy():
    data = sorted(np.random.default_rng(1).lognormal(size=257))
    for q in (50, 90, 99, 99.9):
        assert percentile(data, q) == pytest.approx(np.percentile(data, q))
    assert percentile([1.0, 2.0, math.inf], 50) == 2.0
    assert percentile([1.0, 2.0, math.inf], 60) == math.inf


def test_percentile_ci_covers_the_true_quantile():
    rng = np.random.default_rng(7)
    true_p90 = -math.log(0.1)  # exponential(1)
    covered = 0
    for _ in range(200):
        sample = np.sort(rng.exponential(size=400))
        low, high = percentile_ci(sample, 90)
        covered += low <= true_p90 <= high
    assert 0.9 <= covered / 200 <= 1.0


def test_binomial_quantile_is_scipys_binom_ppf():
    from scipy.stats import binom

    for n in [*range(1, 400), 1_000, 12_345, 100_000, 1_000_000, 64_000_000]:
        for p in (0.5, 0.9, 0.99, 0.999):
            for level in (0.025, 0.975):
                assert binomial_quantile(level, n, p) == int(binom.ppf(level, n, p)), (n, p)


def test_small_samples_are_flagged_and_unbounded():
    d = distribution(range(50))
    assert not d.percentiles["p99"].reliable and d.percentiles["p99"].ci_high is None
    assert d.percentiles["p50"].reliable
    assert distribution([]).n == 0


def test_slo_parsing():
    assert parse_slo("ttft=200ms") == ("ttft", 200.0)
    assert parse_slo("tpot=0.05s") == ("tpot", 50.0)
    assert parse_slo("e2e=2s") == ("e2e", 2000.0)  # names with digits
    assert parse_slo("e2e_sched<=3s") == ("e2e_sched", 3000.0)
    for bad in ("ttft", "speed=3ms", "ttft=-1ms", "ttft=0"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_summary_counts_failures_and_goodput():
    records = [streamed(i, i * 100, i * 100, [i * 100 + 20 + 10 * j for j in range(5)], usage=5)
               for i in range(8)]
    records[3].first_token_ns = records[3].sent_ns + 500 * MS  # slow TTFT
    failed = RequestTimeline(id="x", index=8, scheduled_ns=800 * MS, sent_ns=800 * MS,
                             done_ns=801 * MS, outcome=Outcome.HTTP_429, status=429)
    records.append(failed)
    window = Window.of_run(records)
    s = summarize(records, window, slos={"ttft": 100.0})
    assert s.requests == 9 and s.ok == 8 and s.failures == {"http_429": 1}
    assert s.goodput.good == 7
    assert s.failure_adjusted["ttft"].max == math.inf
    assert s.latency["ttft"].n == 8
    assert any("failed" in w for w in s.warnings)
    assert s.to_json()["failure_adjusted"]["ttft"]["max"] == "inf"
    assert meets_slos(request_metrics(records[0]), {"itl": 10.0})
    assert not meets_slos(request_metrics(records[0]), {"itl": 9.0})


def test_throughput_counts_only_the_window():
    records = [streamed(i, i * 1000, i * 1000, [i * 1000 + 100 * j for j in range(1, 11)], usage=10)
               for i in range(10)]
    window = Window(start_ns=2000 * MS, end_ns=8000 * MS)
    s = summarize(records, window)
    assert s.in_window == 6
    assert s.throughput.output_tokens_per_s == pytest.approx(60 / 6.0)
    assert s.throughput.offered_rate == pytest.approx(1.0)


def test_throughput_counted_a_block_at_a_time_is_the_whole_runs(monkeypatch):
    """Blocks of 4 requests against one block: the same rates to the last bit, with token
    events scaled to a disagreeing usage count, calls without events (observed from spans),
    failures, and requests sent after the window."""
    rng = np.random.default_rng(7)
    records = []
    for i in range(23):
        at = i * 350 + float(rng.uniform(0, 300))
        tokens = sorted(at + 50 + rng.uniform(0, 900, size=int(rng.integers(1, 7))))
        r = streamed(i, at, at + float(rng.uniform(0, 20)), [float(t) for t in tokens],
                     counts=rng.integers(1, 4, size=len(tokens)).tolist(),
                     usage=int(rng.integers(1, 30)))
        if i % 5 == 0:  # observed from spans: no token events
            r = replace(r, token_ns=[], token_counts=[], first_token_ns=r.first_token_ns)
        if i % 7 == 0:
            r = replace(r, outcome=Outcome.HTTP_5XX)
        records.append(r)
    window = Window(start_ns=1000 * MS, end_ns=6000 * MS)
    whole = summarize(records, window).throughput
    monkeypatch.setattr("latlab.metrics.throughput.BLOCK_ROWS", 4)
    assert summarize(records, window).throughput == whole
    assert whole.output_tokens_per_s > 0 and whole.sent_rate is not None


def test_server_timing_round_trips():
    timing = ServerTiming(preprocess=1.5, queue=0.25, prefill=31.0, decode=400.0,
                          postprocess=0.1, total=433.0)
    assert ServerTiming.from_header(timing.to_header()) == replace(timing, source="latlab")
    assert ServerTiming.from_json(timing.to_json()) == timing
    assert ServerTiming.from_header('cache;desc="hit", queue;dur=3.5') == ServerTiming(
        queue=3.5, source="latlab")
    assert ServerTiming.from_header("garbage") is None


def test_timeline_json_round_trip():
    r = streamed(0, 0, 1, [10, 20], counts=[1, 2], usage=3)
    r.server = ServerTiming(queue=1.0)
    assert RequestTimeline.from_json(r.to_json()) == r


def _served(i: int, arrival_ms: float, start_ms: float, service_ms: float) -> RequestTimeline:
    return streamed(i, arrival_ms, arrival_ms, [start_ms + service_ms / 2, start_ms + service_ms],
                    usage=2, done_ms=start_ms + service_ms)


def one_at_a_time(n: int, gap_ms: float, service_ms: float) -> list[RequestTimeline]:
    """`n` requests arriving every `gap_ms` at a server that serves one at a time."""
    records, free = [], 0.0
    for i in range(n):
        start = max(i * gap_ms, free)
        free = start + service_ms
        records.append(_served(i, i * gap_ms, start, service_ms))
    return records


def test_a_stable_short_window_did_not_fall_behind():
    # 5 req/s, each takes 170 ms: some are still running when the window closes
    records = [_served(i, i * 200, i * 200, 170) for i in range(40)]
    window = Window(start_ns=0, end_ns=7_050 * MS)
    t = summarize(records, window).throughput
    assert t.achieved_rate < 0.99 * t.offered_rate
    assert not t.fell_behind
    assert t.mean_concurrency == pytest.approx(0.85, abs=0.1)


def test_an_overloaded_server_fell_behind():
    # 10 req/s offered to a server that serves one request per 150 ms, one at a time
    records = one_at_a_time(100, gap_ms=100, service_ms=150)
    s = summarize(records, Window(start_ns=0, end_ns=10_000 * MS))
    t = s.throughput
    assert t.fell_behind and t.backlog_growth > 20
    assert t.achieved_rate == pytest.approx(1000 / 150, rel=0.05)
    assert any("fell behind" in w for w in s.warnings)


def test_a_run_stopped_by_count_is_judged_on_its_arrivals_not_its_drain():
    # 40 arrivals at 10 req/s to a one-at-a-time server of 6.7 req/s; the window runs until
    # the last request is done, long after the arrivals stopped
    records = one_at_a_time(40, gap_ms=100, service_ms=150)
    t = summarize(records, Window.of_run(records)).throughput
    assert t.offered_rate == pytest.approx(10, rel=0.05)
    assert t.fell_behind


def test_a_burst_has_no_offered_rate():
    records = [_served(i, 0, i * 50, 50) for i in range(20)]
    t = summarize(records, Window.of_run(records)).throughput
    assert t.offered_rate is None and t.sent_rate is None and not t.fell_behind
    assert t.achieved_rate == pytest.approx(20)
