"""Worker processes for `--workers N`: spawned, started together on one absolute schedule.

Each worker builds its own workload and connection pool, appends its records to the run's
requests.jsonl and sends progress snapshots and its final result through one queue. Ctrl-C
is forwarded to every worker, which cancels its requests in flight and reports.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue as queue_module
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from latlab.load import BenchError
from latlab.load.workers.snapshot import WorkerSnapshot
from latlab.load.workers.worker import Worker, WorkerPlan, WorkerResult
from latlab.load.workload.requests import Workload
from latlab.records.bench import BenchConfig
from latlab.records.health import WorkerHealth

WORKER_START_TIMEOUT_S = 120.0


def run_workers(config: BenchConfig, plan: WorkerPlan, start_clock: Callable[[], int],
                update: Callable[[WorkerSnapshot], None] | None) -> list[WorkerResult]:
    """Spawn `config.workers` worker processes, start them together at `start_clock()` once
    all are ready, relay their progress snapshots to `update`, and return their results."""
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    go = ctx.Event()
    t0 = ctx.Value("q", 0)
    procs = [ctx.Process(target=_worker_process, daemon=True,
                         args=(config.model_dump(mode="json"), plan.__dict__ | {"worker": w},
                               messages, go, t0))
             for w in range(config.workers)]
    interrupted = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def forward(sig: int, _frame: Any) -> None:  # Ctrl-C or SIGTERM, to every worker
            interrupted.set()
            for p in procs:
                if p.pid is not None and p.is_alive():
                    os.kill(p.pid, sig)
        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for p in procs:
            p.start()
        ready: set[int] = set()
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while len(ready) < len(procs):
            message = _next_message(messages, procs, deadline, interrupted)
            if message["type"] == "error":
                raise BenchError(message["error"])
            ready.add(message["worker"])
        t0.value = start_clock()
        go.set()
        results: dict[int, WorkerResult] = {}
        while len(results) < len(procs):
            try:
                message = messages.get(timeout=0.2)
            except queue_module.Empty:
                for w, p in enumerate(procs):
                    if not p.is_alive() and w not in results and messages.empty():
                        results[w] = _lost_worker(w, p.exitcode)
                continue
            if message["type"] == "snapshot" and update:
                update(message["snapshot"])
            elif message["type"] == "done":
                result = WorkerResult.from_json(message["result"])
                results[result.worker] = result
        return [results[w] for w in sorted(results)]
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _next_message(messages: Any, procs: list, deadline: float,
                  interrupted: threading.Event) -> dict[str, Any]:
    while time.monotonic() < deadline and not interrupted.is_set():
        try:
            return messages.get(timeout=0.2)
        except queue_module.Empty:
            dead = [p for p in procs if not p.is_alive()]
            if dead:
                raise BenchError(f"worker process exited with code {dead[0].exitcode} "
                                 "before the run started") from None
    raise BenchError("interrupted before the run started" if interrupted.is_set()
                     else f"worker processes not ready after {WORKER_START_TIMEOUT_S:g} s")


def _lost_worker(worker: int, exitcode: int | None) -> WorkerResult:
    return WorkerResult(worker, WorkerHealth(worker), "aborted", time.perf_counter_ns(),
                        f"worker {worker} died (exit code {exitcode}); its finished requests "
                        "are kept")


def _worker_process(config_json: dict[str, Any], plan_fields: dict[str, Any], messages: Any,
                    go: Any, t0: Any) -> None:
    import uvloop

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the event loop handles it
    plan = WorkerPlan(**plan_fields)
    config = BenchConfig.model_validate(config_json)
    try:
        workload = Workload(config.workload, config.arrivals, config.duration_s)
    except ValueError as e:
        messages.put({"type": "error", "worker": plan.worker, "error": str(e)})
        return
    messages.put({"type": "ready", "worker": plan.worker})
    if not go.wait(WORKER_START_TIMEOUT_S):
        return
    plan.t0_ns = t0.value
    worker = Worker(config, plan, workload,
                    lambda s: messages.put({"type": "snapshot", "snapshot": s}))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(worker.run())
    messages.put({"type": "done", "result": result.to_json()})
