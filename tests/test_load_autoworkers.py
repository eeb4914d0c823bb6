"""`--workers auto`: the offered token events and how many processes hold them."""

import os

from latlab.load.workers import auto as autoworkers
from latlab.load.workers.auto import auto_workers, offered_events_per_s, parse_ns_per_event
from latlab.load.workload.requests import Workload
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.lengths import LengthDistribution
from latlab.records.workload import WorkloadConfig


def config(**arrivals) -> BenchConfig:
    workload = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=8),
                              output_tokens=LengthDistribution(kind="uniform", a=40, b=60))
    return BenchConfig(workload=workload, arrivals=ArrivalConfig(**arrivals), workers="auto",
                       requests=100)


def test_offered_events_follow_the_arrivals_and_the_output_lengths():
    closed = config(users=32)
    assert offered_events_per_s(closed, Workload(closed.workload)) == 3200.0
    open_loop = config(process="poisson", rate=10.0)
    events = offered_events_per_s(open_loop, Workload(open_loop.workload))
    assert 10 * 45 < events < 10 * 55  # rate × mean output tokens (uniform 40-60)
    capped = config(process="poisson", rate=1000.0, max_concurrency=8)
    assert offered_events_per_s(capped, Workload(capped.workload)) == 800.0


def test_the_count_scales_with_the_load_and_stays_within_bounds(monkeypatch):
    monkeypatch.setattr(autoworkers, "parse_ns_per_event", lambda: autoworkers.REFERENCE_PARSE_NS)
    per_process = autoworkers.REFERENCE_EVENTS_PER_S
    users = int(3.5 * per_process / autoworkers.STREAM_EVENTS_PER_S)
    heavy = config(users=users)
    count, why = auto_workers(heavy, Workload(heavy.workload), remote=True)
    assert count == 4 and "--workers auto: 4 for about" in why
    local, why = auto_workers(heavy, Workload(heavy.workload))
    assert local == min(4, os.cpu_count()) and (local == 4 or "4 would be needed" in why)
    light = config(users=2)
    assert auto_workers(light, Workload(light.workload))[0] == 1


def test_a_slower_machine_gets_more_processes(monkeypatch):
    c = config(users=int(1.5 * autoworkers.REFERENCE_EVENTS_PER_S / 100))
    monkeypatch.setattr(autoworkers, "parse_ns_per_event", lambda: autoworkers.REFERENCE_PARSE_NS)
    fast = auto_workers(c, Workload(c.workload), remote=True)[0]
    monkeypatch.setattr(autoworkers, "parse_ns_per_event",
                        lambda: 3 * autoworkers.REFERENCE_PARSE_NS)
    slow = auto_workers(c, Workload(c.workload), remote=True)[0]
    assert (fast, slow) == (2, 5)  # 1.5 and 4.5 processes' worth, rounded up


def test_the_self_check_times_the_parser():
    assert 0 < parse_ns_per_event(events=500) < 1_000_000
