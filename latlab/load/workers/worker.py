"""One load-generating process: its share of the schedule (`loop.ScheduleLoop`), its
connection pool, its records.

Each record is appended to requests.jsonl the moment its request ends, cancelled ones
included. A run is aborted when nearly all the requests it has sent so far failed (the share
counts those still in flight as not failed: a burst's fast 429s do not stop it while its
other requests are being served), or when many fail in a row.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from latlab.load import key_problem
from latlab.load.request.client import Client
from latlab.load.request.config import ClientConfig
from latlab.load.request.fields import Adaptations
from latlab.load.workers.collector import without_collector
from latlab.load.workers.loop import Runs, ScheduleLoop, SingleRequests
from latlab.load.workers.replay import TraceReplay
from latlab.load.workers.selfcheck import HealthSampler
from latlab.load.workers.sessions import Sessions
from latlab.load.workers.snapshot import WorkerSnapshot
from latlab.load.workload.requests import RequestSpec, Workload
from latlab.records.bench import BenchConfig
from latlab.records.folder import RecordSink, RunFolder
from latlab.records.health import WorkerHealth
from latlab.records.target import ServerKind
from latlab.records.timeline import Outcome, RequestTimeline, ms_between

SNAPSHOT_INTERVAL_S = 0.5
FAILURE_SHARE_ABORT = 0.9  # of the requests sent so far
FAILURES_ABORT_MIN = 10  # failures before the share may stop a run
CONSECUTIVE_FAILURES_ABORT = 200


@dataclass(kw_only=True)
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
    learned: Adaptations = field(default_factory=Adaptations)  # what its client learned

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "health": self.health.to_json(),
                "learned": self.learned.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerResult:
        return cls(**{**data, "health": WorkerHealth.from_json(data["health"]),
                      "learned": Adaptations.from_json(data.get("learned"))})


@dataclass
class _Counters:
    dispatched: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    tokens_done: int = 0
    consecutive_failures: int = 0
    ttft_new: list[float] = field(default_factory=list)


class Worker:
    """Runs one process's share of the load on its own event loop and connection pool."""

    def __init__(self, config: BenchConfig, plan: WorkerPlan, workload: Workload,
                 on_snapshot: Callable[[WorkerSnapshot], None] | None = None,
                 writer: RecordSink | None = None) -> None:
        """`writer` takes each record as it ends (default: the run folder's requests.jsonl)."""
        self.config = config
        self.plan = plan
        self.on_snapshot = on_snapshot
        self.worker = plan.worker
        self.health = HealthSampler(plan.worker)
        self.schedule = ScheduleLoop(config, plan.worker, plan.t0_ns, self.health)
        self.counters = _Counters()
        self.in_flight: dict[int, RequestTimeline] = {}
        self.writer = writer or RunFolder(Path(plan.run_path)).record_writer()
        self.client = Client(plan.url, plan.model, ClientConfig.of(
            config, api_key=plan.api_key, kind=ServerKind(plan.server_kind),
            pool_size=self.schedule.slots))
        self.runs: Runs = (
            Sessions(config, workload, self.schedule, self.request, plan.run_id)
            if config.workload.sessions
            else TraceReplay(workload, self.request, config.requests)
            if workload.trace is not None
            else SingleRequests(workload, self.request, config.requests))

    @without_collector  # its stalls would land in the measured gaps
    async def run(self) -> WorkerResult:
        loop = asyncio.get_running_loop()
        handled = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous = signal.getsignal(sig)
                loop.add_signal_handler(sig, self.interrupt, sig)
                handled[sig] = previous
            except (RuntimeError, ValueError):  # not the main thread
                pass
        snapshots = loop.create_task(self._snapshots())
        self.health.start()
        s = self.schedule
        expiry = (loop.call_later(max(0.0, (s.end_ns - perf_counter_ns()) / 1e9
                                      + self.config.drain_s), s.expire)
                  if s.end_ns is not None else None)
        try:
            async with self.client:
                await s.run(self.runs)
        finally:
            if expiry is not None:
                expiry.cancel()
            for sig, previous in handled.items():
                loop.remove_signal_handler(sig)
                if previous is not None:  # e.g. a sweep's own SIGTERM handling
                    signal.signal(sig, previous)
            snapshots.cancel()
            await self.runs.close()
            self.writer.close()
            health = await self.health.stop()
            self._snapshot()
        c = self.counters
        return WorkerResult(self.worker, health, s.stop_reason or "done", s.stopped_ns, s.message,
                            c.done, c.failed, self.client.learned)

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        """Ctrl-C or SIGTERM: stop scheduling and cancel what is in flight (recorded as
        cancelled)."""
        by = "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name
        self.schedule.cancel("interrupted", f"interrupted ({by}): requests in flight were "
                             "cancelled")

    async def request(self, spec: RequestSpec, scheduled_ns: int
                      ) -> tuple[RequestTimeline, str | None]:
        """Send one request and record it; a session's request returns its answer too."""
        r = RequestTimeline(id=f"{self.plan.run_id}-{spec.index}", index=spec.index,
                            worker=self.worker, api=self.config.workload.api,
                            prompt_tokens_planned=spec.prompt_tokens, max_tokens=spec.max_tokens,
                            fitted=spec.fitted, session=spec.session, trace=spec.trace,
                            tenant=spec.tenant, priority=spec.priority, scheduled_ns=scheduled_ns)
        self.in_flight[spec.index] = r
        self.writer.begin(r)
        self.counters.dispatched += 1
        try:
            answer = await self.client.send(spec, r)
        except asyncio.CancelledError:
            if self.schedule.expired:
                r.outcome = Outcome.UNFINISHED
                r.error = (f"still in flight {self.config.drain_s:g} s after --duration "
                           "(--drain): cancelled")
            elif r.sent_ns is None:
                r.outcome, r.error = Outcome.CANCELLED, "cancelled before it was sent"
            r.done_ns = r.done_ns or perf_counter_ns()
            raise
        finally:
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
            c.cancelled += 1
            return
        c.consecutive_failures += 1
        failures, sent = c.failed - c.cancelled, c.dispatched - c.cancelled
        if failures >= FAILURES_ABORT_MIN and failures >= FAILURE_SHARE_ABORT * sent:
            self.schedule.abort(f"stopped early: {failures} of the {sent} requests sent so far "
                                f"failed ({failures / sent:.0%}); {self._last(r)}")
        elif c.consecutive_failures == CONSECUTIVE_FAILURES_ABORT:
            self.schedule.abort(f"stopped early: {CONSECUTIVE_FAILURES_ABORT} requests in a row "
                                f"failed; {self._last(r)}")

    def _last(self, r: RequestTimeline) -> str:
        """The last failure, and what a refused key means."""
        problem = key_problem(r.status, self.plan.api_key is not None)
        return f"last: {r.outcome}: {r.error}" + (f" ({problem})" if problem else "")

    async def _snapshots(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)
            self._snapshot()

    def _snapshot(self) -> None:
        if self.on_snapshot is None:
            return
        c = self.counters
        tokens = c.tokens_done + sum(len(r.token_ns) for r in self.in_flight.values())
        self.on_snapshot(WorkerSnapshot(self.worker, c.dispatched, c.done, c.failed,
                                        len(self.in_flight), tokens, c.ttft_new))
        c.ttft_new = []
