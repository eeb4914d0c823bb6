"""Is the client the bottleneck? Event-loop lag, process CPU and send lateness per worker,
zero-gap token bursts over the run, and the rules that turn them into a verdict.

Loop lag is sampled every 10 ms as the larger of: how long a ready callback waits for its
turn (a `sleep(0)` round trip, precise) and how late the 10 ms timer fired beyond the event
loop's 1 ms timer resolution (catches long stalls). Dispatch lateness is how late the
arrival loop woke against the schedule (waits for a concurrency cap are not counted). The
verdict looks at the measurement window only, like the summary.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
import psutil

from latlab.metrics import Window, zero_gap_share
from latlab.records.timeline import RequestTimeline

SAMPLE_INTERVAL_S = 0.010
CPU_INTERVAL_S = 1.0
TIMER_RESOLUTION_NS = 1_000_000

MAX_LATENESS_P99_MS = 5.0
MAX_LOOP_LAG_P99_MS = 5.0
MAX_CPU_PERCENT = 85.0
MAX_ZERO_GAP_SHARE = 0.10
BUSY_LOOP_LAG_P99_MS = 1.0
BUSY_CPU_PERCENT = 60.0


@dataclass
class WorkerHealth:
    """What one worker process measured about itself."""

    worker: int
    loop_lag_ms: list[float] = field(default_factory=list)
    loop_lag_at_ns: list[int] = field(default_factory=list)
    dispatch_lateness_ms: list[float] = field(default_factory=list)
    dispatch_at_ns: list[int] = field(default_factory=list)
    cpu_mean: float = 0.0
    cpu_max: float = 0.0
    load_average: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerHealth:
        return cls(**data)


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


def client_section(workers: Sequence[WorkerHealth], records: Sequence[RequestTimeline],
                   window: Window | None = None) -> dict[str, Any]:
    """The `client` section of summary.json, with the bottleneck verdict and its reasons.
    Lag, lateness and bursts count inside the measurement `window` (start-up is not judged);
    CPU is over the whole run."""
    lags = _inside(window, [(w.loop_lag_at_ns, w.loop_lag_ms) for w in workers])
    late = _inside(window, [(w.dispatch_at_ns, w.dispatch_lateness_ms) for w in workers])
    lag = {"p50": _pct(lags, 50), "p99": _pct(lags, 99), "max": float(lags.max()) if lags.size else None}
    lateness_p99 = _pct(late, 99)
    zero_share = zero_gap_share(records, window)
    cpu_means = [w.cpu_mean for w in workers]
    reasons = []
    if lateness_p99 is not None and lateness_p99 > MAX_LATENESS_P99_MS:
        reasons.append(f"sends ran late against the schedule: lateness p99 {lateness_p99:.1f} ms "
                       f"(limit {MAX_LATENESS_P99_MS:g} ms)")
    cpus = os.cpu_count() or 1
    load = max((w.load_average for w in workers), default=0.0)
    if lag["p99"] is not None and lag["p99"] > MAX_LOOP_LAG_P99_MS:
        starved = max(cpu_means, default=0) < BUSY_CPU_PERCENT and load > cpus
        reasons.append(f"event-loop lag p99 {lag['p99']:.1f} ms (limit {MAX_LOOP_LAG_P99_MS:g} ms): "
                       "timestamps were taken late"
                       + (f"; the client was not busy itself but the machine was oversubscribed "
                          f"(load average {load:.1f} on {cpus} CPUs)" if starved else ""))
    for w in workers:
        if w.cpu_mean > MAX_CPU_PERCENT:
            reasons.append(f"worker {w.worker} used {w.cpu_mean:.0f}% of a CPU core "
                           f"(limit {MAX_CPU_PERCENT:g}%): add --workers")
    busy = (lag["p99"] or 0) > BUSY_LOOP_LAG_P99_MS or max(cpu_means, default=0) > BUSY_CPU_PERCENT
    if zero_share is not None and zero_share > MAX_ZERO_GAP_SHARE and busy:
        reasons.append(f"{100 * zero_share:.0f}% of token events arrived in zero-gap bursts "
                       "while the client was busy: it read them late, not as they came")
    return {
        "workers": len(workers),
        "loop_lag_ms": lag,
        "cpu_percent": {
            "mean": float(np.mean(cpu_means)) if cpu_means else None,
            "max": max((w.cpu_max for w in workers), default=None),
            "per_process": [{"worker": w.worker, "mean": w.cpu_mean, "max": w.cpu_max}
                            for w in workers],
        },
        "lateness_p99_ms": lateness_p99,
        "machine": {"cpus": cpus, "load_average_max": load},
        "zero_gap_share": zero_share,
        "bottleneck": bool(reasons),
        "reasons": reasons,
    }


def _inside(window: Window | None, series: list[tuple[list[int], list[float]]]) -> np.ndarray:
    values = [v for times, vs in series for t, v in zip(times, vs) if window is None or t in window]
    return np.asarray(values, dtype=float)


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None
