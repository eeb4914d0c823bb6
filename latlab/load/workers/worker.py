"""One load-generating process: its share of the schedule, its connection pool, its records.

Worker `w` of `W` sends the open-loop arrivals `i` with `i % W == w`, or runs users
`w, w + W, ...` of a closed loop (request `k` of the worker gets index `k·W + w`). All
workers read the same absolute schedule: `t0_ns` on CLOCK_MONOTONIC, which
`perf_counter_ns` reads in every process alike. Each record is appended to requests.jsonl
the moment its request ends, cancelled ones included.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Callable, Coroutine

from latlab.load.workload.arrivals import arrival_times, sleep_until, user_start_times
from latlab.load.request.client import Client
from latlab.load.workers.collector import without_collector
from latlab.load.workers.selfcheck import HealthSampler
from latlab.load.workers.sessions import SessionDriver
from latlab.load.workload.requests import RequestSpec, Workload
from latlab.records.config import BenchConfig, ServerKind
from latlab.records.folder import RecordSink, RunFolder
from latlab.records.health import WorkerHealth
from latlab.records.timeline import Outcome, RequestTimeline, ms_between

SNAPSHOT_INTERVAL_S = 0.5
FIRST_FAILURES_ABORT = 10
CONSECUTIVE_FAILURES_ABORT = 200


@dataclass
class WorkerPlan:
    """What one worker process needs besides the config (picklable)."""

    worker: int
    url: str
    model: str
    run_path: str
    run_id: str
    t0_ns: int
    api_key: str | None = None
    server_kind: str = "auto"


@dataclass
class WorkerResult:
    worker: int
    health: WorkerHealth
    stop_reason: str
    stopped_ns: int
    message: str | None = None
    requests: int = 0
    failed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "health": self.health.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerResult:
        return cls(**{**data, "health": WorkerHealth.from_json(data["health"])})


@dataclass
class _Counters:
    dispatched: int = 0
    done: int = 0
    failed: int = 0
    tokens_done: int = 0
    consecutive_failures: int = 0
    ttft_new: list[float] = field(default_factory=list)


class Worker:
    """Runs one process's share of the load on its own event loop and connection pool."""

    def __init__(self, config: BenchConfig, plan: WorkerPlan, workload: Workload,
                 on_snapshot: Callable[[dict[str, Any]], None] | None = None,
                 writer: RecordSink | None = None) -> None:
        """`writer` takes each record as it ends (default: the run folder's requests.jsonl)."""
        self.config = config
        self.plan = plan
        self.workload = workload
        self.on_snapshot = on_snapshot
        self.w, self.n = plan.worker, config.workers
        self.t0 = plan.t0_ns
        self.end_ns = plan.t0_ns + int(config.duration_s * 1e9) if config.duration_s else None
        self.health = HealthSampler(plan.worker)
        self.counters = _Counters()
        self.in_flight: dict[int, RequestTimeline] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.stop_reason: str | None = None
        self.message: str | None = None
        self.stopped_ns: int | None = None
        self._main: asyncio.Task[None] | None = None
        self._expired = False
        self._next_k = 0
        arrivals = config.arrivals
        cap = arrivals.users if not arrivals.open_loop else arrivals.max_concurrency
        self.slots = config.share(cap, self.w) if cap else 0
        self._cap = asyncio.Semaphore(self.slots) if arrivals.open_loop and self.slots else None
        self.writer = writer or RunFolder(Path(plan.run_path)).record_writer()
        self.client = Client(plan.url, plan.model, config.workload.api, api_key=plan.api_key,
                             pool_size=self.slots, timeout_s=config.timeout_s,
                             ignore_eos=config.ignore_eos,
                             continuous_usage=config.continuous_usage, stream=config.stream,
                             keepalive=config.keepalive, kind=ServerKind(plan.server_kind))
        self.sessions = SessionDriver(self) if config.workload.sessions else None

    @without_collector  # its stalls would land in the measured gaps
    async def run(self) -> WorkerResult:
        loop = asyncio.get_running_loop()
        handled = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous = signal.getsignal(sig)
                loop.add_signal_handler(sig, self.interrupt)
                handled[sig] = previous
            except (RuntimeError, ValueError):  # not the main thread
                pass
        snapshots = loop.create_task(self._snapshots())
        self.health.start()
        expiry = (loop.call_later(max(0.0, (self.end_ns - perf_counter_ns()) / 1e9
                                      + self.config.drain_s), self._expire)
                  if self.end_ns is not None else None)
        try:
            async with self.client:
                self._main = loop.create_task(self._load())
                try:
                    await self._main
                except asyncio.CancelledError:
                    pass
                self._stop("done")
                if self.tasks:
                    await asyncio.gather(*self.tasks, return_exceptions=True)
        finally:
            if expiry is not None:
                expiry.cancel()
            for sig, previous in handled.items():
                loop.remove_signal_handler(sig)
                if previous is not None:  # e.g. a sweep's own SIGTERM handling
                    signal.signal(sig, previous)
            snapshots.cancel()
            if self.sessions is not None:
                await self.sessions.close()
            self.writer.close()
            health = await self.health.stop()
            self._snapshot()
        c = self.counters
        return WorkerResult(self.w, health, self.stop_reason or "done", self.stopped_ns,
                            self.message, c.done, c.failed)

    def _load(self) -> Coroutine[Any, Any, None]:
        """The arrival loop: of single requests, or of sessions (`sessions.SessionDriver`)."""
        driver = self.sessions
        if self.config.arrivals.open_loop:
            return driver.open_loop() if driver else self._open_loop()
        return driver.closed_loop() if driver else self._closed_loop()

    def interrupt(self) -> None:
        """Ctrl-C: stop scheduling and cancel what is in flight (recorded as cancelled)."""
        self._stop("interrupted", "interrupted: requests in flight were cancelled")
        for task in self.tasks:
            task.cancel()
        if self._main is not None:
            self._main.cancel()

    def _expire(self) -> None:
        """The run's end (--duration + --drain): what is still in flight is cancelled and
        recorded as unfinished, whatever the server is doing."""
        self._stop("duration")
        self._expired = True
        for task in self.tasks:
            task.cancel()
        if self._main is not None:
            self._main.cancel()

    def _stop(self, reason: str, message: str | None = None) -> None:
        if self.stop_reason is None:
            self.stop_reason, self.message, self.stopped_ns = reason, message, perf_counter_ns()

    async def _open_loop(self) -> None:
        limit = self.config.requests
        for index, offset in enumerate(arrival_times(self.config.arrivals)):
            if limit is not None and index >= limit:
                return self._stop("requests")
            scheduled = self.t0 + int(offset * 1e9)
            if self.end_ns is not None and scheduled >= self.end_ns:
                return self._stop("duration")
            if index % self.n != self.w:
                continue
            spec = self.workload.request(index)
            await sleep_until(scheduled)
            if self.stop_reason is not None:
                return
            self.health.note_dispatch(perf_counter_ns() - scheduled)
            if self._cap is not None:
                await self._cap.acquire()  # a full cap holds the schedule, not a task pile
            self._spawn(spec, scheduled)
        self._stop("trace")

    def _spawn(self, spec: RequestSpec, scheduled_ns: int) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._request(spec, scheduled_ns))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _closed_loop(self) -> None:
        starts = user_start_times(self.config.arrivals.users, self.config.arrivals.ramp_s)
        users = [self._user(start) for start in starts[self.w::self.n]]
        await asyncio.gather(*users)

    async def _user(self, start_s: float) -> None:
        scheduled = self.t0 + int(start_s * 1e9)
        while self.stop_reason is None:
            index = self._next_k * self.n + self.w
            if self.config.requests is not None and index >= self.config.requests:
                return self._stop("requests")
            if self.end_ns is not None and scheduled >= self.end_ns:
                return self._stop("duration")
            self._next_k += 1
            spec = self.workload.request(index)
            await sleep_until(scheduled)
            self.health.note_dispatch(perf_counter_ns() - scheduled)
            await self._spawn(spec, scheduled)
            scheduled = perf_counter_ns()

    async def _request(self, spec: RequestSpec, scheduled_ns: int
                       ) -> tuple[RequestTimeline, str | None]:
        """Send one request and record it; a session's request returns its answer too."""
        r = RequestTimeline(id=f"{self.plan.run_id}-{spec.index}", index=spec.index,
                            worker=self.w, api=self.config.workload.api,
                            prompt_tokens_planned=spec.prompt_tokens, max_tokens=spec.max_tokens,
                            fitted=spec.fitted, session=spec.session,
                            tenant=spec.tenant, priority=spec.priority, scheduled_ns=scheduled_ns)
        self.in_flight[spec.index] = r
        self.writer.begin(r)
        self.counters.dispatched += 1
        try:
            answer = await self.client.send(spec, r)
        except asyncio.CancelledError:
            if self._expired:
                r.outcome = Outcome.UNFINISHED
                r.error = (f"still in flight {self.config.drain_s:g} s after --duration "
                           "(--drain): cancelled")
            elif r.sent_ns is None:
                r.outcome, r.error = Outcome.CANCELLED, "cancelled before it was sent"
            r.done_ns = r.done_ns or perf_counter_ns()
            raise
        finally:
            if self._cap is not None and spec.session is None:  # a session holds its slot
                self._cap.release()
            del self.in_flight[spec.index]
            self.writer.write(r)
            self._finished(r)
        return r, answer

    def _finished(self, r: RequestTimeline) -> None:
        c = self.counters
        c.done += 1
        c.tokens_done += sum(r.token_counts)
        if r.ok:
            c.consecutive_failures = 0
            if r.first_token_ns is not None and r.sent_ns is not None:
                c.ttft_new.append(ms_between(r.first_token_ns, r.sent_ns))
            return
        c.failed += 1
        if r.outcome == Outcome.CANCELLED:
            return
        c.consecutive_failures += 1
        if c.failed == c.consecutive_failures == FIRST_FAILURES_ABORT and c.done == c.failed:
            self._abort(f"stopped early: the first {FIRST_FAILURES_ABORT} requests all failed; "
                        f"last: {r.outcome}: {r.error}")
        elif c.consecutive_failures == CONSECUTIVE_FAILURES_ABORT:
            self._abort(f"stopped early: {CONSECUTIVE_FAILURES_ABORT} requests in a row failed; "
                        f"last: {r.outcome}: {r.error}")

    def _abort(self, message: str) -> None:
        """Stop scheduling; requests in flight finish (closed-loop users stop after theirs)."""
        self._stop("aborted", message)
        if self._main is not None and self.config.arrivals.open_loop:
            self._main.cancel()

    async def _snapshots(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)
            self._snapshot()

    def _snapshot(self) -> None:
        if self.on_snapshot is None:
            return
        c = self.counters
        tokens = c.tokens_done + sum(len(r.token_ns) for r in self.in_flight.values())
        self.on_snapshot({"worker": self.w, "dispatched": c.dispatched, "done": c.done,
                          "failed": c.failed, "in_flight": len(self.in_flight),
                          "tokens": tokens, "ttft": c.ttft_new})
        c.ttft_new = []
