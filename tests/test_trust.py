"""The defects a new user found (issue 10): numbers and advice that must not be wrong."""

from latlab.metrics.summary import summarize
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
    s = summarize(records, Window.of_run(records), concurrency_cap=2)
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
