"""The schedule loop with stand-in runs: --max-concurrency slots are taken by whatever one
arrival runs (one request, or a session of several) and given back exactly once, however the
run ends."""

import asyncio
import itertools
from time import perf_counter_ns

from latlab.load.workers.loop import ScheduleLoop
from latlab.load.workers.selfcheck import HealthSampler
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig

CAP = 2


class Counting:
    """`arrivals` runs of `sends` steps each, counting how many run at once."""

    def __init__(self, arrivals: int, sends: int, budget: bool = False) -> None:
        self.arrivals, self.sends = arrivals, sends
        self.limit = None if budget else arrivals  # a session budget, or --requests
        self.running = self.most = self.ended = 0

    def arrival_offsets(self):
        return (i / 1000.0 for i in itertools.count())  # --rate 1000, constant

    def owner(self, index: int, workers: int) -> int:
        return index % workers

    def open(self, index: int) -> int | None:
        return index if index < self.arrivals else None

    async def run(self, item: int, scheduled_ns: int) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            for _ in range(self.sends):
                await asyncio.sleep(0.005)
        finally:
            self.running -= 1
            self.ended += 1

    async def close(self) -> None:
        pass


def follow(runs: Counting, interrupt_after_s: float | None = None) -> ScheduleLoop:
    config = BenchConfig(url="http://127.0.0.1:9", duration_s=None, requests=100,
                         arrivals=ArrivalConfig(process="constant", rate=1000.0,
                                                max_concurrency=CAP))

    async def main() -> ScheduleLoop:
        loop = ScheduleLoop(config, 0, perf_counter_ns(), HealthSampler(0))
        if interrupt_after_s is not None:
            asyncio.get_running_loop().call_later(interrupt_after_s, loop.cancel, "interrupted")
        await asyncio.wait_for(loop.run(runs), timeout=10)
        return loop

    return asyncio.run(main())


def test_single_requests_and_sessions_give_their_slot_back_once():
    for runs in (Counting(12, sends=1), Counting(5, sends=3, budget=True)):
        loop = follow(runs)
        assert loop.stop_reason == "requests"
        assert runs.ended == runs.arrivals and runs.most == CAP
        assert loop.cap._value == CAP  # released once per arrival: never more, never fewer


def test_cancelled_runs_give_their_slot_back():
    runs = Counting(50, sends=20)
    loop = follow(runs, interrupt_after_s=0.03)
    assert loop.stop_reason == "interrupted" and 0 < runs.ended < runs.arrivals
    assert runs.most == CAP and loop.cap._value == CAP
