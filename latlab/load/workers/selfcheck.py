"""The client's self-check while it runs: event-loop lag, process CPU and send lateness per
worker, into `WorkerHealth` (`latlab.metrics.client` turns them into a verdict).

Loop lag is sampled every 10 ms as the larger of: how long a ready callback waits for its
turn (a `sleep(0)` round trip, precise) and how late the 10 ms timer fired beyond the event
loop's 1 ms timer resolution (catches long stalls). Dispatch lateness is how late the
arrival loop woke against the schedule (waits for a concurrency cap are not counted).
"""

from __future__ import annotations

import asyncio
import time

import psutil

from latlab.records.health import WorkerHealth

SAMPLE_INTERVAL_S = 0.010
CPU_INTERVAL_S = 1.0
TIMER_RESOLUTION_NS = 1_000_000


class HealthSampler:
    """Runs beside a worker's load: loop lag every 10 ms, CPU every second."""

    def __init__(self, worker: int) -> None:
        self.health = WorkerHealth(worker)
        self._process = psutil.Process()
        self._task: asyncio.Task[None] | None = None
        self._cpu_start = 0.0
        self._wall_start = 0.0

    def start(self) -> None:
        self._cpu_start = _cpu_seconds(self._process)
        self._wall_start = time.perf_counter()
        self._process.cpu_percent(None)
        self.health.load_average = psutil.getloadavg()[0]
        self._task = asyncio.get_running_loop().create_task(self._run())

    def note_dispatch(self, late_ns: int) -> None:
        self.health.dispatch_lateness_ms.append(late_ns / 1e6)
        self.health.dispatch_at_ns.append(time.perf_counter_ns())

    async def stop(self) -> WorkerHealth:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        wall = time.perf_counter() - self._wall_start
        if wall > 0:
            self.health.cpu_mean = 100 * (_cpu_seconds(self._process) - self._cpu_start) / wall
        self.health.cpu_max = max(self.health.cpu_max, self.health.cpu_mean)
        self.health.load_average = max(self.health.load_average, psutil.getloadavg()[0])
        return self.health

    async def _run(self) -> None:
        lags, lag_times = self.health.loop_lag_ms, self.health.loop_lag_at_ns
        interval_ns = int(SAMPLE_INTERVAL_S * 1e9)
        next_cpu = time.perf_counter() + CPU_INTERVAL_S
        while True:
            due = time.perf_counter_ns() + interval_ns
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            woke = time.perf_counter_ns()
            await asyncio.sleep(0)
            turn = time.perf_counter_ns() - woke
            lags.append(max(turn, woke - due - TIMER_RESOLUTION_NS) / 1e6)
            lag_times.append(woke)
            if time.perf_counter() >= next_cpu:
                next_cpu += CPU_INTERVAL_S
                self.health.cpu_max = max(self.health.cpu_max, self._process.cpu_percent(None))
                self.health.load_average = max(self.health.load_average, psutil.getloadavg()[0])


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system
