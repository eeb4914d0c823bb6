"""One worker of a `--ray` run, on whichever node Ray placed it (`latlab.load.workers.ray_driver`
drives it).

It runs an ordinary `Worker` on its own uvloop, in the node's time base, and hands every
record to the driver as the request ends: each is moved into the driver's time base, marked
with its node and queued; the driver long-polls the queue (`poll`), so a record is on the
driver's disk within milliseconds of its end and a node that dies takes only its requests
in flight with it. Each request's start is queued too, so the driver knows which were in
flight. Nothing here imports Ray but `info`: the driver wraps the class with `ray.remote`.
"""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import traceback
from time import perf_counter_ns
from typing import Any

import orjson

from latlab import __version__
from latlab.load.workers.clocks import shift_health, shift_record
from latlab.load.workers.worker import Worker, WorkerPlan
from latlab.load.workload.requests import Workload
from latlab.records.bench import BenchConfig
from latlab.records.timeline import RequestTimeline

# ("begin", (id, index, scheduled_ns)) | ("record", (id, line)) | ("snapshot", WorkerSnapshot)
# | ("done", WorkerResult json) | ("error", traceback)
Item = tuple[str, Any]


class _Forward:
    """A worker's record sink that queues each record for the driver, in its time base."""

    def __init__(self, items: queue.SimpleQueue, delta_ns: int, node: str) -> None:
        self.items, self.delta_ns, self.node = items, delta_ns, node

    def begin(self, r: RequestTimeline) -> None:
        scheduled = None if r.scheduled_ns is None else r.scheduled_ns + self.delta_ns
        self.items.put(("begin", (r.id, r.index, scheduled)))

    def write(self, r: RequestTimeline) -> None:
        r.node = self.node
        shift_record(r, self.delta_ns)
        line = orjson.dumps(r.to_json(), option=orjson.OPT_APPEND_NEWLINE)
        self.items.put(("record", (r.id, line)))

    def close(self) -> None:
        pass


class LoadActor:
    """Builds its workload when placed; `run` runs the load, `poll` hands over what is done."""

    def __init__(self, config_json: dict[str, Any], plan_fields: dict[str, Any]) -> None:
        self.config = BenchConfig.model_validate(config_json)
        self.plan = WorkerPlan(**plan_fields)
        self.items: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self.worker: Worker | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.delta_ns = 0
        try:
            self.workload: Workload | None = Workload(self.config.workload, self.config.arrivals,
                                                      self.config.duration_s)
            self.error = None
        except ValueError as e:
            self.workload, self.error = None, str(e)

    def info(self) -> dict[str, Any]:
        """Where it runs: the Ray node, the host, latlab's version there, a workload error."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "version": __version__, "pid": os.getpid(), "error": self.error}

    def clock(self) -> int:
        return perf_counter_ns()

    def run(self, t0_ns: int, offset_ns: int, node: str) -> None:
        """Run the worker with the schedule starting at `t0_ns` (this node's clock); every
        stamp it hands over is moved by `-offset_ns` into the driver's time base."""
        import uvloop

        self.plan.t0_ns, self.delta_ns = t0_ns, -offset_ns
        try:
            worker = Worker(self.config, self.plan, self.workload,
                            lambda s: self.items.put(("snapshot", s)),
                            _Forward(self.items, self.delta_ns, node))
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                self.loop, self.worker = runner.get_loop(), worker
                result = runner.run(worker.run())
        except Exception:  # noqa: BLE001 - the driver reports it with the worker's node
            self.items.put(("error", traceback.format_exc(limit=5)))
            return
        result.health.node = node
        shift_health(result.health, self.delta_ns)
        result.stopped_ns += self.delta_ns
        self.items.put(("done", result.to_json()))

    def poll(self, wait_s: float) -> list[Item]:
        """What is ready: waits up to `wait_s` for the first item, then takes every other."""
        try:
            out = [self.items.get(timeout=wait_s)]
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self.items.get_nowait())
            except queue.Empty:
                return out

    def interrupt(self) -> None:
        """Ctrl-C on the driver: cancel what is in flight (recorded as cancelled)."""
        if self.loop is not None and self.worker is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.worker.interrupt)
