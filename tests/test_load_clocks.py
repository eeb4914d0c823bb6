"""Clock offsets between machines (Cristian's method) and moving stamps between clocks;
the collector kept out of the load's way."""

import gc

import pytest

from latlab.load.workers.clocks import estimate_offset, shift_health, shift_record
from latlab.load.workers.collector import collector_paused, sweep_if_piled, without_collector
from latlab.records.health import WorkerHealth
from latlab.records.timeline import ConnectionTiming, RequestTimeline, SessionStep


class FakeRemote:
    """A remote clock `offset` ahead of this one; each reading takes `delays[i]` ns of
    round trip, with the reading taken `share` of the way through."""

    def __init__(self, offset: int, delays: list[int], share: float, now) -> None:
        self.offset, self.delays, self.share, self.now = offset, iter(delays), share, now

    def __call__(self) -> int:
        delay = next(self.delays)
        self.now[0] += int(delay * self.share)
        reading = self.now[0] + self.offset
        self.now[0] += delay - int(delay * self.share)
        return reading


def test_the_offset_comes_from_the_shortest_round_trip(monkeypatch):
    now = [1_000_000]
    monkeypatch.setattr("latlab.load.workers.clocks.perf_counter_ns", lambda: now[0])
    remote = FakeRemote(offset=-5_000_000_000, delays=[900_000, 200_000, 600_000], share=0.9,
                        now=now)
    found = estimate_offset(remote, round_trips=3)
    assert found.uncertainty_ns == 100_000  # half the 200 µs round trip
    assert abs(found.offset_ns - -5_000_000_000) <= found.uncertainty_ns
    assert found.offset_ns == -5_000_000_000 + 80_000  # read 90% of the way, not half


def test_the_same_clock_has_no_offset_within_the_bound():
    found = estimate_offset(lambda: __import__("time").perf_counter_ns())
    assert abs(found.offset_ns) <= found.uncertainty_ns


def test_shifting_moves_stamps_but_not_durations():
    r = RequestTimeline(id="a", index=0, scheduled_ns=100, sent_ns=110, headers_ns=120,
                        connection=ConnectionTiming(new=True, connect_ns=7),
                        first_reasoning_ns=125,
                        session=SessionStep(id="s", turn=2, turns=3, after_ns=90))
    r.add_token_event(130)
    r.add_token_event(140, 2)
    r.done_ns = 150
    shift_record(r, -100)
    assert (r.scheduled_ns, r.sent_ns, r.headers_ns, r.first_token_ns, r.last_token_ns,
            r.done_ns, r.token_ns) == (0, 10, 20, 30, 40, 50, [30, 40])
    assert r.usage_ns is None and r.connection.connect_ns == 7 and r.token_counts == [1, 2]
    assert (r.first_reasoning_ns, r.session.after_ns, r.session.tool_start_ns) == (25, -10, None)
    assert r.session.turn == 2
    h = shift_health(WorkerHealth(0, loop_lag_ms=[1.0], loop_lag_at_ns=[500],
                                  dispatch_lateness_ms=[2.0], dispatch_at_ns=[600]), 50)
    assert (h.loop_lag_at_ns, h.dispatch_at_ns, h.loop_lag_ms) == ([550], [650], [1.0])


def test_the_collector_is_off_during_a_load_and_sweeps_only_a_pile():
    if not gc.isenabled():
        pytest.skip("the collector is off in this interpreter")
    with collector_paused():
        assert not gc.isenabled()
        assert not sweep_if_piled(limit=10**9)
        garbage = []
        for _ in range(50):
            a, b = [], []
            a.append(b)
            b.append(a)  # a cycle only the collector frees
            garbage.append(a)
        del garbage, a, b
        assert sweep_if_piled(limit=10)
        assert gc.get_count()[0] < 10
    assert gc.isenabled()


async def test_a_load_runs_without_the_collector():
    if not gc.isenabled():
        pytest.skip("the collector is off in this interpreter")

    @without_collector
    async def load() -> bool:
        return gc.isenabled()

    assert await load() is False and gc.isenabled()
