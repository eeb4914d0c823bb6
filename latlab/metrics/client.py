"""The client self-check's verdict: is the load generator itself the bottleneck, or was the
host busy with other work?

From each worker's `WorkerHealth` (event-loop lag sampled every 10 ms, dispatch lateness,
CPU), the records' zero-gap token bursts and the host's load over the run (`HostLoad`: the
client's cores, the server's when it runs here, every other process's, steal). Lag,
lateness and bursts count inside the measurement window only (start-up is not judged); CPU
is over the whole run. Late timestamps are the client's fault only while the client is busy
itself; while it idles and others fill the host, the host is the cause, and more client
workers would only add load: the advice is to rerun on a quiet host.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from latlab.metrics.stats import tail_exceeds
from latlab.metrics.throughput import zero_gap_share
from latlab.records.health import WorkerHealth
from latlab.records.summary import ClientCheck, CpuPercent, HostLoad, LoopLag, Machine, WorkerCpu
from latlab.records.timeline import RequestTimeline
from latlab.records.window import Window

MAX_LATENESS_P99_MS = 5.0
MAX_LOOP_LAG_P99_MS = 5.0
MAX_CPU_PERCENT = 85.0
MAX_ZERO_GAP_SHARE = 0.10
BUSY_LOOP_LAG_P99_MS = 1.0
BUSY_CPU_PERCENT = 60.0
HOST_OTHER_SHARE = 0.25  # of the host's cores, used by neither client nor server: busy
HOST_OTHER_MIN_CORES = 0.5
HOST_STEAL = 0.10
STALL_MS = 20.0  # an event-loop lag this long delays every stream's stamps at once
MAX_STALLS = 1000


def client_check(workers: Sequence[WorkerHealth], records: Sequence[RequestTimeline],
                 window: Window | None = None, host: HostLoad | None = None) -> ClientCheck:
    """The `client` section of summary.json: the numbers, the verdicts and their reasons."""
    lags = _inside(window, [(w.loop_lag_at_ns, w.loop_lag_ms) for w in workers])
    late = _inside(window, [(w.dispatch_at_ns, w.dispatch_lateness_ms) for w in workers])
    lag = LoopLag(p50=_pct(lags, 50), p99=_pct(lags, 99),
                  max=float(lags.max()) if lags.size else None)
    lateness_p99 = _pct(late, 99)
    zero_share = zero_gap_share(records, window)
    cpu_means = [w.cpu_mean for w in workers]
    cpus = os.cpu_count() or 1
    load = max((w.load_average for w in workers), default=0.0)
    busy_client = max(cpu_means, default=0) >= BUSY_CPU_PERCENT
    host_reasons = host_busy(host)
    if not busy_client and not host_reasons and load > cpus:
        host_reasons.append(f"the machine was oversubscribed: load average {load:.1f} on "
                            f"{cpus} CPUs")
    symptoms = []
    if tail_exceeds(late.tolist(), 99, MAX_LATENESS_P99_MS):
        symptoms.append(f"sends ran late against the schedule: lateness p99 {lateness_p99:.1f} "
                        f"ms (limit {MAX_LATENESS_P99_MS:g} ms)")
    if tail_exceeds(lags.tolist(), 99, MAX_LOOP_LAG_P99_MS):
        symptoms.append(f"event-loop lag p99 {lag.p99:.1f} ms (limit {MAX_LOOP_LAG_P99_MS:g} "
                        "ms): timestamps were taken late")
    reasons = [f"worker {w.worker} used {w.cpu_mean:.0f}% of a CPU core (limit "
               f"{MAX_CPU_PERCENT:g}%): add --workers" for w in workers
               if w.cpu_mean > MAX_CPU_PERCENT]
    if busy_client or not host_reasons:
        reasons += symptoms
    elif symptoms:
        host_reasons += [f"{s}, while the client itself used {max(cpu_means, default=0):.0f}% "
                         "of a core" for s in symptoms]
    reasons += _nodes_behind(workers, window)
    busy = (lag.p99 or 0) > BUSY_LOOP_LAG_P99_MS or max(cpu_means, default=0) > BUSY_CPU_PERCENT
    if zero_share is not None and zero_share > MAX_ZERO_GAP_SHARE and busy:
        (host_reasons if host_reasons and not busy_client else reasons).append(
            f"{100 * zero_share:.0f}% of token events arrived in zero-gap bursts while the "
            "client was late: it read them late, not as they came")
    cpu = CpuPercent(mean=float(np.mean(cpu_means)) if cpu_means else None,
                     max=max((w.cpu_max for w in workers), default=None),
                     per_process=[WorkerCpu(worker=w.worker, mean=w.cpu_mean, max=w.cpu_max)
                                  for w in workers])
    return ClientCheck(workers=len(workers), loop_lag_ms=lag, cpu_percent=cpu,
                       lateness_p99_ms=lateness_p99,
                       machine=Machine(cpus=cpus, load_average_max=load),
                       zero_gap_share=zero_share, bottleneck=bool(reasons), reasons=reasons,
                       host=host, host_busy=bool(host_reasons), host_reasons=host_reasons,
                       stalls=_stalls(workers))


def _stalls(workers: Sequence[WorkerHealth]) -> list[tuple[int, float]]:
    """When each worker's event loop was held up STALL_MS or more (the longest kept): every
    stream's stamps were taken late then, which looks like a server that paused."""
    found = [(at - int(lag * 1e6), lag) for w in workers
             for at, lag in zip(w.loop_lag_at_ns, w.loop_lag_ms) if lag >= STALL_MS]
    return sorted(sorted(found, key=lambda s: -s[1])[:MAX_STALLS])


def host_busy(host: HostLoad | None) -> list[str]:
    """Why the host was too busy with other work for the run's timings to be trusted."""
    if host is None:
        return []
    out = []
    limit = max(HOST_OTHER_MIN_CORES, HOST_OTHER_SHARE * host.cpus)
    if host.other.mean >= limit:
        out.append(f"other processes used {host.other.mean:.1f} of the host's {host.cpus} "
                   f"cores on average (at most {host.other.max:.1f}) besides the client"
                   + (" and the server" if host.server is not None else ""))
    if host.steal is not None and host.steal.mean >= HOST_STEAL:
        out.append(f"the hypervisor took {100 * host.steal.mean:.0f}% of the CPU time (steal)")
    return out


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
