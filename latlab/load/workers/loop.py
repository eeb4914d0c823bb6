"""A worker's schedule loop: open-loop arrivals or closed-loop users, each arrival running
what the workload makes of it (`Runs`: one request, or a whole session).

Worker `w` of `W` takes the open-loop arrivals `i` the runs give it (`Runs.owner`: those with
`i % W == w`; a replayed trace's session goes to one worker whole), or runs users
`w, w + W, ...` of a closed loop (its `k`-th arrival gets index `k·W + w`). All workers read
the same absolute schedule: `t0_ns` on CLOCK_MONOTONIC, which `perf_counter_ns` reads in
every process alike. An open loop's `--max-concurrency` slots are held by what arrivals run
(a session holds its slot for all its turns) and a full cap holds the schedule.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns
from typing import Awaitable, Callable, Iterator, Protocol, TypeVar

from latlab.load.workers.selfcheck import HealthSampler
from latlab.load.workload.arrivals import sleep_until, user_start_times
from latlab.load.workload.requests import RequestSpec, Workload
from latlab.records.bench import BenchConfig
from latlab.records.timeline import RequestTimeline

T = TypeVar("T")
# Sends one request at its scheduled time and records it: its record and its answer's text.
Send = Callable[[RequestSpec, int], Awaitable[tuple[RequestTimeline, str | None]]]


class Runs(Protocol[T]):
    """What one arrival runs."""

    limit: int | None  # --requests as a bound on arrival indices (None: `open` keeps a budget)

    def arrival_offsets(self) -> Iterator[float]:
        """The open loop's arrival offsets (s) from the run's start."""

    def owner(self, index: int, workers: int) -> int:
        """The worker that runs arrival `index`."""

    def open(self, index: int) -> T | None:
        """What arrival `index` runs; None when the --requests budget has no room for it."""

    async def run(self, item: T, scheduled_ns: int) -> None:
        """Run it, its first request scheduled at `scheduled_ns`."""

    async def close(self) -> None:
        """Release what the runs held, after the load."""


class SingleRequests:
    """One request per arrival: arrival `i` sends the workload's request `i`."""

    def __init__(self, workload: Workload, send: Send, limit: int | None) -> None:
        self.workload, self.send, self.limit = workload, send, limit

    def arrival_offsets(self) -> Iterator[float]:
        return self.workload.arrival_times()

    def owner(self, index: int, workers: int) -> int:
        return index % workers

    def open(self, index: int) -> RequestSpec:
        return self.workload.request(index)

    async def run(self, item: RequestSpec, scheduled_ns: int) -> None:
        await self.send(item, scheduled_ns)

    async def close(self) -> None:
        pass


class ScheduleLoop:
    """Follows one worker's share of the schedule until it ends or is stopped; says why."""

    def __init__(self, config: BenchConfig, worker: int, t0_ns: int,
                 health: HealthSampler) -> None:
        self.config = config
        self.worker, self.workers = worker, config.workers
        self.t0 = t0_ns
        self.end_ns = t0_ns + int(config.duration_s * 1e9) if config.duration_s else None
        self.health = health
        arrivals = config.arrivals
        cap = arrivals.users if not arrivals.open_loop else arrivals.max_concurrency
        self.slots = config.share(cap, worker) if cap else 0
        self.cap = asyncio.Semaphore(self.slots) if arrivals.open_loop and self.slots else None
        self.tasks: set[asyncio.Task[None]] = set()
        self.stop_reason: str | None = None
        self.message: str | None = None
        self.stopped_ns: int | None = None
        self.expired = False  # the run's end cancelled what was in flight
        self._main: asyncio.Task[None] | None = None
        self._next = 0  # this worker's closed-loop arrivals so far

    def index(self, k: int) -> int:
        """The run-wide index of this worker's `k`-th request or session."""
        return k * self.workers + self.worker

    async def run(self, runs: Runs) -> None:
        """Arrivals until the schedule ends or is stopped, then wait for what they run."""
        follow = self._open_loop if self.config.arrivals.open_loop else self._closed_loop
        self._main = asyncio.get_running_loop().create_task(follow(runs))
        try:
            await self._main
        except asyncio.CancelledError:
            pass
        self.stop("done")
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def stop(self, reason: str, message: str | None = None) -> None:
        """Stop for `reason` ("duration", "requests", "trace", "interrupted", "aborted",
        "done"); the first reason given is the one kept."""
        if self.stop_reason is None:
            self.stop_reason, self.message, self.stopped_ns = reason, message, perf_counter_ns()

    def cancel(self, reason: str, message: str | None = None) -> None:
        """Stop and cancel everything under way (each request records how it ended)."""
        self.stop(reason, message)
        for task in self.tasks:
            task.cancel()
        if self._main is not None:
            self._main.cancel()

    def expire(self) -> None:
        """The run's end (--duration + --drain): what is still in flight is cancelled and
        recorded as unfinished, whatever the server is doing."""
        self.expired = True
        self.cancel("duration")

    def abort(self, message: str) -> None:
        """Stop scheduling; requests in flight finish (closed-loop users stop after theirs)."""
        self.stop("aborted", message)
        if self._main is not None and self.config.arrivals.open_loop:
            self._main.cancel()

    async def _open_loop(self, runs: Runs) -> None:
        for index, offset in enumerate(runs.arrival_offsets()):
            if runs.limit is not None and index >= runs.limit:
                return self.stop("requests")
            scheduled = self.t0 + int(offset * 1e9)
            if self.end_ns is not None and scheduled >= self.end_ns:
                return self.stop("duration")
            if self.workers > 1 and runs.owner(index, self.workers) != self.worker:
                continue
            item = runs.open(index)
            if item is None:
                return self.stop("requests")
            await sleep_until(scheduled)
            if self.stop_reason is not None:
                return
            self.health.note_dispatch(perf_counter_ns() - scheduled)
            if self.cap is not None:
                await self.cap.acquire()  # a full cap holds the schedule, not a task pile
            self._spawn(runs, item, scheduled)
        self.stop("trace")

    async def _closed_loop(self, runs: Runs) -> None:
        starts = user_start_times(self.config.arrivals.users, self.config.arrivals.ramp_s)
        await asyncio.gather(*[self._user(runs, start) for start in starts[self.worker::self.workers]])

    async def _user(self, runs: Runs, start_s: float) -> None:
        scheduled = self.t0 + int(start_s * 1e9)
        while self.stop_reason is None:
            index = self.index(self._next)
            if runs.limit is not None and index >= runs.limit:
                return self.stop("requests")
            if self.end_ns is not None and scheduled >= self.end_ns:
                return self.stop("duration")
            self._next += 1
            item = runs.open(index)
            if item is None:
                return self.stop("requests")
            await sleep_until(scheduled)
            self.health.note_dispatch(perf_counter_ns() - scheduled)
            await self._spawn(runs, item, scheduled)
            scheduled = perf_counter_ns()

    def _spawn(self, runs: Runs[T], item: T, scheduled_ns: int) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._arrival(runs, item, scheduled_ns))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _arrival(self, runs: Runs[T], item: T, scheduled_ns: int) -> None:
        try:
            await runs.run(item, scheduled_ns)
        finally:
            if self.cap is not None:
                self.cap.release()
