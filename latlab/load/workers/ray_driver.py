"""`--ray ADDRESS`: the workers run as Ray actors spread over a cluster's nodes.

The driver (this process) connects to the cluster (`auto`: the one on this machine, started
for the run if none runs), places `config.workers` actors with Ray's SPREAD strategy, checks
that each node runs the same latlab, and estimates every node's clock offset (`clocks`).
The schedule's `t0` is fixed on the driver's clock and handed to each actor in its own;
every record comes back in the driver's time base, marked with its node, and is appended to
requests.jsonl as it arrives. A worker whose node dies is reported as aborted: its finished
requests are kept and those it had in flight are recorded as `client_error`. Ray is
imported only here, only when asked for (the `ray` extra).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rich.console import Console

from latlab import __version__
from latlab.load import BenchError
from latlab.load.workers.clocks import estimate_offset
from latlab.load.workers.ray_actor import LoadActor
from latlab.load.workers.snapshot import WorkerSnapshot
from latlab.load.workers.worker import WorkerPlan, WorkerResult
from latlab.records.bench import BenchConfig
from latlab.records.cluster import NodeClock, RayCluster
from latlab.records.folder import RunFolder
from latlab.records.health import WorkerHealth
from latlab.records.timeline import Outcome, RequestTimeline

PLACE_TIMEOUT_S = 120.0
POLL_WAIT_S = 0.2
START_LEAD_S = 0.5  # time for `run` to reach every actor before t0


def run_ray_workers(config: BenchConfig, plan: WorkerPlan, start_clock: Callable[[float], int],
                    update: Callable[[WorkerSnapshot], None] | None,
                    console: Console | None = None) -> tuple[list[WorkerResult], RayCluster]:
    """Run `config.workers` actors on the cluster at `config.ray`, starting together at
    `start_clock(lead_s)` (the driver's clock); return their results and the cluster's
    nodes with their clock offsets. `BenchError` when the cluster cannot be used."""
    ray = require_ray()
    with _connected(ray, config.ray or "auto", config.workers) as started:
        remote = ray.remote(num_cpus=1, max_concurrency=4)(LoadActor)
        actors = [remote.options(scheduling_strategy="SPREAD", name=actor_name(plan, w)).remote(
            config.model_dump(mode="json"), plan.__dict__ | {"worker": w})
            for w in range(config.workers)]
        try:
            cluster = RayCluster(address=config.ray or "auto", started=started,
                                 nodes=_place(ray, actors, plan.url))
            if console is not None:
                console.print(describe(cluster), style="dim", markup=False, highlight=False)
            node_of = {w: n for n in cluster.nodes for w in n.workers}
            t0 = start_clock(START_LEAD_S)
            for w, actor in enumerate(actors):  # each gets t0 in its own node's clock
                actor.run.remote(t0 + node_of[w].offset_ns, node_of[w].offset_ns, node_of[w].node)
            results, lost = _collect(ray, actors, {w: n.node for w, n in node_of.items()},
                                     RunFolder(Path(plan.run_path)), update)
            _measure_after(ray, actors, cluster, lost)
            return [results[w] for w in sorted(results)], cluster
        finally:
            for actor in actors:
                ray.kill(actor)


def actor_name(plan: WorkerPlan, worker: int) -> str:
    """The Ray name of a run's worker (`ray.get_actor(name)` finds it)."""
    return f"latlab-{plan.run_id}-worker-{worker}"


def describe(cluster: RayCluster) -> str:
    """The cluster's nodes and their clocks, in a few lines."""
    where = ("a local Ray cluster (started for this run)" if cluster.started
             else "the Ray cluster found on this machine" if cluster.address == "auto"
             else f"the Ray cluster at {cluster.address}")
    lines = [f"workers on {len(cluster.nodes)} node{'s' * (len(cluster.nodes) != 1)} of {where}; "
             "clock offsets against this machine:"]
    for n in cluster.nodes:
        lines.append(f"  {n.node}: workers {', '.join(map(str, n.workers))} · offset "
                     f"{n.offset_ns / 1e6:+.3f} ms ± {n.uncertainty_ns / 1e6:.3f}")
    return "\n".join(lines)


def require_ray() -> Any:
    """The `ray` module; `BenchError` saying how to install it when it is missing."""
    try:
        import ray
    except ImportError:
        raise BenchError("--ray needs Ray: pip install 'latlab[ray]'") from None
    return ray


@contextmanager
def _connected(ray: Any, address: str, workers: int) -> Iterator[bool]:
    """Connected to the cluster for the run; yields whether latlab started it. A connection
    this process already holds (`ray.init` by the caller) is used and left open."""
    if ray.is_initialized():
        yield False
        return
    quiet = {"log_to_driver": False, "logging_level": "ERROR", "include_dashboard": False}
    started = False
    try:
        if address == "auto":
            try:
                ray.init(address="auto", **quiet)
            except ConnectionError:
                ray.init(address="local", num_cpus=max(os.cpu_count() or 1, workers), **quiet)
                started = True
        else:
            ray.init(address=address, **quiet)
    except Exception as e:  # noqa: BLE001 - Ray raises many kinds; the user needs one line
        raise BenchError(f"--ray {address}: cannot use the cluster "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                         ) from None
    try:
        yield started
    finally:
        ray.shutdown()


def _place(ray: Any, actors: list, url: str) -> list[NodeClock]:
    """Wait until every actor is placed; check its node can run the load; name the nodes
    and estimate their clocks."""
    try:
        infos = ray.get([a.info.remote() for a in actors], timeout=PLACE_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise BenchError(f"the Ray cluster did not place {len(actors)} workers (one CPU each) in "
                         f"{PLACE_TIMEOUT_S:g} s: give fewer --workers or add nodes") from None
    for info in infos:
        if info["error"]:
            raise BenchError(info["error"])
        if info["version"] != __version__:
            raise BenchError(f"node {info['host']} runs latlab {info['version']}, this machine "
                             f"{__version__}: install the same version on every node")
    here = ray.get_runtime_context().get_node_id()
    if _loopback(url) and any(info["node_id"] != here for info in infos):
        raise BenchError(f"{url} is this machine's loopback address, which the cluster's other "
                         "nodes cannot reach: give a --url they can")
    names = _node_names(infos)
    nodes: dict[str, NodeClock] = {}
    for w, (actor, info) in enumerate(zip(actors, infos)):
        node = nodes.get(info["node_id"])
        if node is None:
            offset = estimate_offset(lambda actor=actor: ray.get(actor.clock.remote()))
            node = nodes[info["node_id"]] = NodeClock(
                node=names[info["node_id"]], node_id=info["node_id"], host=info["host"],
                workers=[], offset_ns=offset.offset_ns, uncertainty_ns=offset.uncertainty_ns)
        node.workers.append(w)
    return list(nodes.values())


def _node_names(infos: list[dict[str, Any]]) -> dict[str, str]:
    """Each node by its host name, with its id's start where two nodes share a host."""
    hosts: dict[str, set[str]] = {}
    for info in infos:
        hosts.setdefault(info["host"], set()).add(info["node_id"])
    return {info["node_id"]: info["host"] if len(hosts[info["host"]]) == 1
            else f"{info['host']}/{info['node_id'][:8]}" for info in infos}


def _loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _collect(ray: Any, actors: list, node_of: dict[int, str], run: RunFolder,
             update: Callable[[WorkerSnapshot], None] | None
             ) -> tuple[dict[int, WorkerResult], set[int]]:
    """Long-poll every actor until it is done or lost, appending records as they come;
    the results, and the workers that were lost."""
    results: dict[int, WorkerResult] = {}
    lost: set[int] = set()
    in_flight: dict[int, dict[str, tuple]] = {w: {} for w in range(len(actors))}
    polls = {actors[w].poll.remote(POLL_WAIT_S): w for w in range(len(actors))}
    with run.record_writer() as writer, _forward_interrupts(actors):
        while polls:
            ready, _ = ray.wait(list(polls), num_returns=1, timeout=1.0)
            for ref in ready:
                w = polls.pop(ref)
                try:
                    items = ray.get(ref)
                except ray.exceptions.RayError as e:
                    for record in _lost_records(w, node_of[w], in_flight[w]):
                        writer.write(record)
                    results[w] = _lost(w, node_of[w], len(in_flight[w]), e)
                    lost.add(w)
                    continue
                lines = []
                for kind, payload in items:
                    if kind == "begin":
                        in_flight[w][payload[0]] = payload
                    elif kind == "record":
                        in_flight[w].pop(payload[0], None)
                        lines.append(payload[1])
                    elif kind == "snapshot":
                        if update is not None:
                            update(payload)
                    elif kind == "done":
                        results[w] = WorkerResult.from_json(payload)
                    else:
                        results[w] = _failed(w, node_of[w], payload)
                writer.write_lines(lines)
                if w not in results:
                    polls[actors[w].poll.remote(POLL_WAIT_S)] = w
    return results, lost


@contextmanager
def _forward_interrupts(actors: list) -> Iterator[None]:
    """Ctrl-C on the driver interrupts every actor (each records its cancelled requests)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(_sig: int, _frame: Any) -> None:
        for actor in actors:
            actor.interrupt.remote()

    previous = signal.signal(signal.SIGINT, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _lost_records(worker: int, node: str, flying: dict[str, tuple]) -> list[RequestTimeline]:
    return [RequestTimeline(id=rid, index=index, worker=worker, node=node,
                            scheduled_ns=scheduled, outcome=Outcome.CLIENT_ERROR,
                            error=f"its load generator (worker {worker} on node {node}) was lost "
                                  "mid-request")
            for rid, index, scheduled in flying.values()]


def _lost(worker: int, node: str, flying: int, error: Exception) -> WorkerResult:
    return WorkerResult(worker, WorkerHealth(worker, node=node), "aborted", time.perf_counter_ns(),
                        f"worker {worker} on node {node} was lost ({type(error).__name__}); its "
                        f"finished requests are kept, its {flying} in flight are recorded as "
                        "client_error")


def _failed(worker: int, node: str, trace: str) -> WorkerResult:
    last = trace.strip().splitlines()[-1] if trace.strip() else "unknown error"
    return WorkerResult(worker, WorkerHealth(worker, node=node), "aborted", time.perf_counter_ns(),
                        f"worker {worker} on node {node} failed: {last}")


def _measure_after(ray: Any, actors: list, cluster: RayCluster, lost: set[int]) -> None:
    """Each surviving node's offset again after the run: the drift its records may carry."""
    for node in cluster.nodes:
        alive = [w for w in node.workers if w not in lost]
        if not alive:
            node.lost = True
            continue
        try:
            first = actors[alive[0]]
            after = estimate_offset(lambda first=first: ray.get(first.clock.remote(), timeout=5))
        except ray.exceptions.RayError:
            node.lost = True
            continue
        node.offset_after_ns, node.uncertainty_after_ns = after.offset_ns, after.uncertainty_ns
