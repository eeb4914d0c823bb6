"""The client self-check's verdict: is the load generator itself the bottleneck?

From each worker's `WorkerHealth` (event-loop lag sampled every 10 ms, dispatch lateness,
CPU) and the records' zero-gap token bursts. Lag, lateness and bursts count inside the
measurement window only (start-up is not judged); CPU is over the whole run.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from latlab.metrics.stats import tail_exceeds
from latlab.metrics.throughput import zero_gap_share
from latlab.records.health import WorkerHealth
from latlab.records.summary import ClientCheck, CpuPercent, LoopLag, Machine, WorkerCpu
from latlab.records.timeline import RequestTimeline
from latlab.records.window import Window

MAX_LATENESS_P99_MS = 5.0
MAX_LOOP_LAG_P99_MS = 5.0
MAX_CPU_PERCENT = 85.0
MAX_ZERO_GAP_SHARE = 0.10
BUSY_LOOP_LAG_P99_MS = 1.0
BUSY_CPU_PERCENT = 60.0


def client_check(workers: Sequence[WorkerHealth], records: Sequence[RequestTimeline],
                 window: Window | None = None) -> ClientCheck:
    """The `client` section of summary.json: the numbers, the verdict and its reasons."""
    lags = _inside(window, [(w.loop_lag_at_ns, w.loop_lag_ms) for w in workers])
    late = _inside(window, [(w.dispatch_at_ns, w.dispatch_lateness_ms) for w in workers])
    lag = LoopLag(p50=_pct(lags, 50), p99=_pct(lags, 99),
                  max=float(lags.max()) if lags.size else None)
    lateness_p99 = _pct(late, 99)
    zero_share = zero_gap_share(records, window)
    cpu_means = [w.cpu_mean for w in workers]
    reasons = []
    if tail_exceeds(late.tolist(), 99, MAX_LATENESS_P99_MS):
        reasons.append(f"sends ran late against the schedule: lateness p99 {lateness_p99:.1f} ms "
                       f"(limit {MAX_LATENESS_P99_MS:g} ms)")
    cpus = os.cpu_count() or 1
    load = max((w.load_average for w in workers), default=0.0)
    if tail_exceeds(lags.tolist(), 99, MAX_LOOP_LAG_P99_MS):
        starved = max(cpu_means, default=0) < BUSY_CPU_PERCENT and load > cpus
        reasons.append(f"event-loop lag p99 {lag.p99:.1f} ms (limit {MAX_LOOP_LAG_P99_MS:g} ms): "
                       "timestamps were taken late"
                       + (f"; the client was not busy itself but the machine was oversubscribed "
                          f"(load average {load:.1f} on {cpus} CPUs)" if starved else ""))
    for w in workers:
        if w.cpu_mean > MAX_CPU_PERCENT:
            reasons.append(f"worker {w.worker} used {w.cpu_mean:.0f}% of a CPU core "
                           f"(limit {MAX_CPU_PERCENT:g}%): add --workers")
    reasons += _nodes_behind(workers, window)
    busy = (lag.p99 or 0) > BUSY_LOOP_LAG_P99_MS or max(cpu_means, default=0) > BUSY_CPU_PERCENT
    if zero_share is not None and zero_share > MAX_ZERO_GAP_SHARE and busy:
        reasons.append(f"{100 * zero_share:.0f}% of token events arrived in zero-gap bursts "
                       "while the client was busy: it read them late, not as they came")
    cpu = CpuPercent(mean=float(np.mean(cpu_means)) if cpu_means else None,
                     max=max((w.cpu_max for w in workers), default=None),
                     per_process=[WorkerCpu(worker=w.worker, mean=w.cpu_mean, max=w.cpu_max)
                                  for w in workers])
    return ClientCheck(workers=len(workers), loop_lag_ms=lag, cpu_percent=cpu,
                       lateness_p99_ms=lateness_p99,
                       machine=Machine(cpus=cpus, load_average_max=load),
                       zero_gap_share=zero_share, bottleneck=bool(reasons), reasons=reasons)


def _nodes_behind(workers: Sequence[WorkerHealth], window: Window | None) -> list[str]:
    """In a run spread over a cluster's nodes (`--ray`), each node whose own send lateness
    or loop lag p99, or a worker's CPU, passed its limit: by name, with its workers."""
    nodes: dict[str, list[WorkerHealth]] = {}
    for w in workers:
        if w.node is not None:
            nodes.setdefault(w.node, []).append(w)
    out = []
    for node, group in nodes.items():
        late = _inside(window, [(w.dispatch_at_ns, w.dispatch_lateness_ms) for w in group])
        lags = _inside(window, [(w.loop_lag_at_ns, w.loop_lag_ms) for w in group])
        signs = []
        if tail_exceeds(late.tolist(), 99, MAX_LATENESS_P99_MS):
            signs.append(f"lateness p99 {_pct(late, 99):.1f} ms")
        if tail_exceeds(lags.tolist(), 99, MAX_LOOP_LAG_P99_MS):
            signs.append(f"loop lag p99 {_pct(lags, 99):.1f} ms")
        cpu = max(w.cpu_mean for w in group)
        if cpu > MAX_CPU_PERCENT:
            signs.append(f"CPU {cpu:.0f}% of a core")
        if signs:
            out.append(f"node {node} (workers {', '.join(str(w.worker) for w in group)}) fell "
                       f"behind: {', '.join(signs)}")
    return out


def _inside(window: Window | None, series: list[tuple[list[int], list[float]]]) -> np.ndarray:
    values = [v for times, vs in series for t, v in zip(times, vs) if window is None or t in window]
    return np.asarray(values, dtype=float)


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None
