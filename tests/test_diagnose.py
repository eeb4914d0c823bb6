"""Each rule fires on records built to show its symptom and stays silent on a healthy run."""

import re

import pytest
from timelines import MS, steady, timeline, write_run

from latlab.analysis import analyze
from latlab.analysis.findings import Finding, Severity, Unevaluated
from latlab.metrics.summary import summarize
from latlab.records.timeline import Outcome
from latlab.records.window import Window


@pytest.fixture
def diagnosed(tmp_path):
    def run(records, **kwargs):
        a = analyze(write_run(tmp_path, records, **kwargs))
        return {f.rule: f for f in a.findings}, {u.rule: u for u in a.unevaluated}, a
    return run


def test_a_healthy_run_has_no_findings(diagnosed):
    findings, unevaluated, _ = diagnosed(steady(40, prompt=50))
    assert findings == {}
    assert set(unevaluated) == {"noisy_neighbour", "kv_cache_full", "busy_host"}


def test_every_finding_carries_numbers(diagnosed):
    records = [timeline(i, i * 10, queue=i * 20, untimed=25, prefill=300, prompt=500 + 100 * i,
                        stalls={3: 60}) for i in range(40)]
    records += [timeline(40 + i, i * 10, outcome=Outcome.HTTP_429) for i in range(5)]
    findings, _, a = diagnosed(records)
    assert len(findings) >= 4
    for f in findings.values():
        assert f.evidence and all(re.search(r"\d", line) for line in f.evidence), f
        assert f.where and f.fix
    order = [f.severity for f in a.findings]
    assert order == sorted(order, reverse=True)


def test_failures(diagnosed):
    records = steady(40) + [timeline(40 + i, i * 100, outcome=Outcome.HTTP_5XX) for i in range(4)]
    findings, _, _ = diagnosed(records)
    f = findings["failures"]
    assert f.severity == Severity.WARNING and "http_5xx: 4" in " ".join(f.evidence)
    assert "failures" not in diagnosed(steady(40))[0]


def test_rejections(diagnosed):
    records = steady(40) + [timeline(40 + i, i * 100, outcome=Outcome.HTTP_429) for i in range(10)]
    findings, _, _ = diagnosed(records)
    assert findings["rejections"].severity == Severity.CRITICAL
    assert "failures" not in findings  # a rejection is reported as a rejection only


def test_failure_counts_add_up_to_the_summarys(diagnosed):
    records = (steady(40) + [timeline(40 + i, i * 100, outcome=Outcome.HTTP_429) for i in range(3)]
               + [timeline(50 + i, i * 100, outcome=Outcome.HTTP_5XX) for i in range(2)])
    findings, _, a = diagnosed(records)
    assert sum(a.summary.failures.values()) == 5
    assert findings["failures"].evidence[0] == ("2 of 45 requests failed (4.4%), besides 3 "
                                                "rejected with HTTP 429 (see rejections)")


def test_client_bottleneck_from_the_self_check(diagnosed):
    check = {"workers": 1, "loop_lag_ms": {"p50": 0.2, "p99": 85.0, "max": 120.0},
             "lateness_p99_ms": 1.5, "bottleneck": True, "reasons": ["event-loop lag p99 85 ms"]}
    finding = diagnosed(steady(40), client=check)[0]["client_bottleneck"]
    assert finding.evidence[0] == "event-loop lag p99 85 ms"
    assert "loop_lag_ms.p99=85" in finding.evidence[-1]
    assert finding.severity == Severity.WARNING  # nothing left late: the timestamps are suspect
    late = steady(40, client_wait=50)
    assert diagnosed(late, client=check)[0]["client_bottleneck"].severity == Severity.CRITICAL
    assert "client_bottleneck" not in diagnosed(late, client=check | {"bottleneck": False})[0]


def test_client_bottleneck_from_the_records(diagnosed):
    findings, _, _ = diagnosed(steady(40, client_wait=50))
    assert "p99 50.0 ms" in findings["client_bottleneck"].evidence[0]
    assert "client_bottleneck" not in diagnosed(steady(40, client_wait=1, connect=30))[0]
    unscheduled = steady(40)
    for r in unscheduled:
        r.scheduled_ns = None
    assert "client_bottleneck" in diagnosed(unscheduled)[1]


def overloaded(n: int = 40) -> list:
    return [timeline(i, i * 10, queue=i * 30) for i in range(n)]


def test_overload(tmp_path):
    records = overloaded()
    run = write_run(tmp_path, records)
    run.write_summary(summarize(records, Window(0, 450 * MS)))
    f = {f.rule: f for f in analyze(run).findings}["overload"]
    assert f.severity == Severity.CRITICAL and "req/s" in f.evidence[0]
    assert f.where.startswith("queue") and "queueing" in f.title


def test_overload_names_decode_when_batches_slow_down(tmp_path):
    records = [timeline(i, i * 10, tokens=50, itl=5 + i) for i in range(40)]
    run = write_run(tmp_path, records)
    run.write_summary(summarize(records, Window(0, 450 * MS)))
    f = {f.rule: f for f in analyze(run).findings}["overload"]
    assert f.where.startswith("decode") and "of the offered rate" in f.title


def test_overload_is_silent_when_the_server_keeps_up_and_unevaluated_without_a_window(
        tmp_path):
    records = steady(40)
    run = write_run(tmp_path, records)
    run.write_summary(summarize(records, Window(0, 5000 * MS)))
    a = analyze(run)
    assert "overload" not in {f.rule for f in a.findings}
    run.write_summary(summarize(records))  # no window: no throughput
    assert "overload" in {u.rule for u in analyze(run).unevaluated}


def test_load_growth(diagnosed):
    records = steady(20) + [timeline(20 + i, 2000 + i * 100, queue=80) for i in range(20)]
    findings, _, _ = diagnosed(records)
    assert "queue" in findings["queueing_under_load"].where
    assert "queueing_under_load" not in diagnosed(steady(40))[0]
    assert "queueing_under_load" in diagnosed(steady(40, server=False))[1]


def test_slow_small_requests(diagnosed):
    slow = [timeline(i, i * 100, prompt=10 + 50 * i, prefill=1 + i, upload=40) for i in range(40)]
    findings, _, _ = diagnosed(slow)
    assert findings["slow_small_requests"].where == "network"
    queued = [timeline(i, i * 100, prompt=10 + 50 * i, prefill=1 + i, queue=60) for i in range(40)]
    assert diagnosed(queued)[0]["slow_small_requests"].where == "queue"
    fast = [timeline(i, i * 100, prompt=10 + 50 * i, prefill=1 + i) for i in range(40)]
    assert "slow_small_requests" not in diagnosed(fast)[0]
    no_tiny = [timeline(i, i * 100, prompt=500 + i, upload=40) for i in range(40)]
    assert "slow_small_requests" in diagnosed(no_tiny)[1]


def test_prefill_dominates(diagnosed):
    records = [timeline(i, i * 1000, prompt=100 * (i + 1), prefill=0.2 * 100 * (i + 1))
               for i in range(40)]
    f = diagnosed(records)[0]["prefill_bound"]
    assert f.where == "prefill" and "correlation" in f.evidence[1]
    flat = [timeline(i, i * 1000, prompt=100 * (i + 1), prefill=300 if i % 2 else 30)
            for i in range(40)]
    assert "prefill_bound" not in diagnosed(flat)[0]  # does not grow with prompt length
    assert "prefill_bound" not in diagnosed(steady(40))[0]


def stuttering(stall_at: int) -> list:
    # Request i+1 prefills (30 ms) while request i is ≈70 ms into its decode, near token 14.
    return [timeline(i, i * 100, prefill=30, tokens=30, stalls={stall_at: 30}) for i in range(40)]


def test_stutter_when_stalls_coincide_with_other_prefills(diagnosed):
    f = diagnosed(stuttering(14))[0]["decode_stalls"]
    assert f.severity == Severity.WARNING and "prefill" in f.where
    assert "98% of stalls" in f.evidence[2]  # 39 of 40: the last request has no successor
    # judged by each stream's longest pause: 5 ms a token, and the one 30 ms stall on top
    assert f.metric == ("itl_max", "mean")
    assert "longest pause (ITL per-request max) 35.0 ms on average" in f.evidence[1]


def test_stutter_not_explained_by_prefills(diagnosed):
    f = diagnosed(stuttering(2))[0]["decode_stalls"]
    assert f.severity == Severity.INFO and "something else" in f.where


def test_no_stutter_without_stalls(diagnosed):
    assert "decode_stalls" not in diagnosed(steady(40, tokens=30))[0]
    assert "decode_stalls" in diagnosed(steady(4, tokens=5))[1]


def tenants(light_queue: float) -> list:
    heavy = [timeline(i, 2000 + i * 100, tenant="big", prompt=4000, tokens=60)
             for i in range(10)]
    light = [timeline(100 + i, i * 50, tenant="small", prompt=50,
                      queue=light_queue if 2000 <= i * 50 < 3300 else 0.0) for i in range(80)]
    return heavy + light


def test_tenant_interference(diagnosed):
    f = diagnosed(tenants(100))[0]["noisy_neighbour"]
    assert "'big'" in f.title and "'small'" in f.title
    assert "noisy_neighbour" not in diagnosed(tenants(0))[0]
    one = [timeline(i, i * 50, tenant="solo") for i in range(20)]
    assert "noisy_neighbour" in diagnosed(one)[1]


def test_cold_start(diagnosed):
    records = [timeline(0, 0, prefill=800)] + steady(40)[1:]
    f = diagnosed(records)[0]["cold_start"]
    assert "request #0" in f.evidence[1]
    assert "cold_start" not in diagnosed(steady(40))[0]
    assert "cold_start" in diagnosed(steady(10))[1]


def test_unattributed(diagnosed):
    f = diagnosed(steady(40, untimed=20))[0]["unattributed"]
    assert "20.0 ms per request" in f.evidence[1]
    assert "unattributed" not in diagnosed(steady(40, untimed=1))[0]


def test_rules_without_successful_requests_say_what_they_need(diagnosed):
    findings, unevaluated, _ = diagnosed([timeline(i, i * 10, outcome=Outcome.TIMEOUT)
                                          for i in range(5)])
    assert set(findings) == {"failures"}
    assert unevaluated["decode_stalls"].needs == "needs successful requests"
    assert all(isinstance(u, Unevaluated) for u in unevaluated.values())
    assert all(isinstance(f, Finding) for f in findings.values())


def test_prefill_dominates_with_few_requests_per_prompt_bucket(diagnosed):
    records = [timeline(i, i * 1000, prompt=4 ** (i + 3), prefill=0.2 * 4 ** (i + 3))
               for i in range(5)]
    f = diagnosed(records)[0]["prefill_bound"]
    assert f.evidence[0].startswith("all prompts:")


def scrapes(run, points) -> None:
    """Write `(t_ms, waiting, kv_usage, preemptions)` scrapes into the run's metrics.jsonl."""
    from latlab.records.scrape import METRICS, Scrape

    lines = [Scrape(t_ns=int(t * MS), values={"waiting": w, "kv_usage": kv, "preemptions": p,
                                              "running": 4}).model_dump_json()
             for t, w, kv, p in points]
    (run.path / METRICS).write_text("\n".join(lines) + "\n")


def test_kv_cache_full_from_the_servers_metrics(tmp_path):
    run = write_run(tmp_path, steady(40))
    scrapes(run, [(i * 100, 6 if i > 4 else 0, 0.99 if i > 4 else 0.5, 3 if i > 6 else 0)
                  for i in range(10)])
    f = {f.rule: f for f in analyze(run).findings}["kv_cache_full"]
    assert "5 of 10 scrapes" in f.evidence[0] and "6 requests waited" in f.evidence[1]
    assert "3 preemptions" in f.evidence[2] and "preempted" in f.title
    calm = write_run(tmp_path, steady(40))
    scrapes(calm, [(i * 100, 0, 0.3, 0) for i in range(10)])
    assert "kv_cache_full" not in {f.rule for f in analyze(calm).findings}


def test_a_pause_every_stream_shares_is_the_servers_not_a_prefills(diagnosed):
    together = [timeline(i, 0, tokens=20, itl=5, stalls={10: 1000}) for i in range(4)]
    rest = [timeline(4 + i, 2000 + 300 * i, tokens=20, itl=5) for i in range(20)]
    findings, _, _ = diagnosed(together + rest)
    pause = findings["server_pause"]
    assert "1.00 s when every one of 4 streams in flight stopped at once" in pause.evidence[0]
    alone = [timeline(0, 0, tokens=20, itl=5, stalls={10: 1000})] + [
        timeline(1 + i, 3000 + 300 * i, tokens=20, itl=5) for i in range(20)]
    assert "server_pause" not in diagnosed(alone)[0]  # one stream's stall is not the server's
    # the same stop in a predicted run is a long step the simulation drew, not a pause
    predicted = diagnosed(together + rest, config={"kind": "predict", "rate": 10.0})
    assert "server_pause" not in predicted[0] and "server_pause" in predicted[1]


def test_a_pause_the_clients_own_event_loop_made_is_not_the_servers(diagnosed):
    """Every stream stops at once while the load generator's event loop is held up: its reads
    were late, not the server's tokens (a GC pause, a busy host). The pause is the client's."""
    together = [timeline(i, 0, tokens=20, itl=5, stalls={10: 1000}) for i in range(4)]
    rest = [timeline(4 + i, 2000 + 300 * i, tokens=20, itl=5) for i in range(20)]
    start = together[0].token_ns[9]  # the streams' last token before the stop
    stalled = {"workers": 1, "bottleneck": False, "stalls": [(start, 1000.0)]}
    findings, _, _ = diagnosed(together + rest, client=stalled)
    assert "server_pause" not in findings
    elsewhere = {**stalled, "stalls": [(start + 5_000_000_000, 1000.0)]}
    assert "server_pause" in diagnosed(together + rest, client=elsewhere)[0]


def test_a_pause_filled_by_a_prefill_sent_after_the_window_is_no_server_pause(diagnosed):
    """The window's streams stop while a request sent during the cooldown prefills."""
    streams = [timeline(i, 0, tokens=20, itl=5, stalls={10: 1000}) for i in range(4)]
    late = timeline(4, 55.5, prefill=1000, tokens=20, itl=5)  # its prefill is the stall
    config = {"rate": 10.0, "clock": {"t0_ns": 0, "end_ns": 50_000_000}}
    assert "server_pause" not in diagnosed(streams + [late], config=config)[0]
    elsewhere = timeline(4, 3000, prefill=1000, tokens=20, itl=5)
    assert "server_pause" in diagnosed(streams + [elsewhere], config=config)[0]


def test_requests_the_server_read_late_waited_in_intake_not_the_network(diagnosed):
    records = [timeline(i, i * 100, upload=1, download=1) for i in range(30)]
    records[7] = timeline(7, 700, upload=801, download=1)  # arrived, then sat unread
    findings, _, a = diagnosed(records)
    assert "1 requests waited up to 800.0 ms before the server read them" in (
        findings["server_pause"].evidence[-1])
    late = next(r for r in a.decomposed if r.record.index == 7)
    assert late.parts.ms("network") == pytest.approx(2.0) and late.parts.ms("intake") == (
        pytest.approx(800.0))
