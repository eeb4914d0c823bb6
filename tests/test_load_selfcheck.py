"""The client self-check: what it measures and when it calls the client the bottleneck."""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import numpy as np

from latlab.load.telemetry.host import HostSampler
from latlab.load.workers.selfcheck import HealthSampler
from latlab.metrics.client import client_check
from latlab.metrics.throughput import ZeroGaps, zero_gap_share, zero_gaps
from latlab.records.health import WorkerHealth
from latlab.records.summary import HostLoad, Usage
from latlab.records.timeline import RequestTimeline
from latlab.records.window import Window

MS = 1_000_000


def health(worker=0, lag=0.1, late=0.2, cpu=20.0, load=0.5) -> WorkerHealth:
    times = [i * 10 * MS for i in range(100)]  # one sample every 10 ms for a second
    return WorkerHealth(worker, loop_lag_ms=[lag] * 100, loop_lag_at_ns=times,
                        dispatch_lateness_ms=[late] * 100, dispatch_at_ns=times,
                        cpu_mean=cpu, cpu_max=cpu + 5, load_average=load)


def stream(gaps_ms: list[float], start_ms: float = 0) -> RequestTimeline:
    r = RequestTimeline(id="r", index=0)
    t = int(start_ms * MS)
    r.add_token_event(t)
    for gap in gaps_ms:
        t += int(gap * MS)
        r.add_token_event(t)
    return r


def test_a_healthy_client_is_not_the_bottleneck():
    c = client_check([health(0), health(1)], [stream([10, 10, 10])]).model_dump()
    assert c["bottleneck"] is False and c["reasons"] == []
    assert c["workers"] == 2 and c["loop_lag_ms"]["p99"] == 0.1
    assert c["lateness_p99_ms"] == 0.2 and c["zero_gap_share"] == 0.0
    assert [p["worker"] for p in c["cpu_percent"]["per_process"]] == [0, 1]


def test_each_rule_fires_with_its_numbers():
    late = client_check([health(late=12.0)], []).model_dump()
    assert late["bottleneck"] and "lateness p99 12.0 ms" in late["reasons"][0]
    lag = client_check([health(lag=9.0, cpu=70)], []).model_dump()
    assert "event-loop lag p99 9.0 ms" in lag["reasons"][0]
    assert "oversubscribed" not in lag["reasons"][0]
    cpu = client_check([health(cpu=97.0)], []).model_dump()
    assert "worker 0 used 97% of a CPU core" in cpu["reasons"][0]


def test_only_the_measurement_window_is_judged():
    h = health()
    h.loop_lag_ms[:10] = [50.0] * 10  # a start-up stall in the first 100 ms
    h.dispatch_lateness_ms[:10] = [30.0] * 10
    assert client_check([h], []).model_dump()["bottleneck"]
    c = client_check([h], [], Window(100 * MS, 1000 * MS)).model_dump()
    assert not c["bottleneck"] and c["loop_lag_ms"]["max"] == 0.1 and c["lateness_p99_ms"] == 0.2


def test_loop_lag_without_own_cpu_blames_the_oversubscribed_machine_not_the_client():
    c = client_check([health(lag=20.0, cpu=30.0, load=64.0)], [])
    assert not c.bottleneck and c.host_busy
    assert "oversubscribed: load average 64.0" in c.host_reasons[0]
    assert any("event-loop lag p99 20.0 ms" in r for r in c.host_reasons)


def host(client: float, other: float, server: float | None = None) -> HostLoad:
    def use(mean: float) -> Usage:
        return Usage(mean=mean, max=mean)
    return HostLoad(cpus=4, seconds=10, busy=use(client + other + (server or 0)),
                    client=use(client), server=use(server) if server is not None else None,
                    other=use(other))


def test_late_timestamps_on_a_busy_host_are_the_hosts_not_the_clients():
    """The issue's case: the client at 3% CPU, the host busy with other processes. The
    advice must not be --workers (it adds load)."""
    c = client_check([health(lag=20.0, cpu=3.0)], [], host=host(client=0.03, other=2.5,
                                                                  server=0.8))
    assert not c.bottleneck and c.host_busy
    assert "other processes used 2.5 of the host's 4 cores" in c.host_reasons[0]
    assert not any("--workers" in r for r in c.host_reasons)


def test_a_saturated_client_is_the_bottleneck_even_on_a_busy_host():
    c = client_check([health(lag=20.0, cpu=95.0)], [], host=host(client=0.95, other=2.0))
    assert c.bottleneck and any("add --workers" in r for r in c.reasons)
    assert any("event-loop lag" in r for r in c.reasons)


def test_a_quiet_host_is_not_busy():
    c = client_check([health()], [], host=host(client=0.1, other=0.2, server=1.5))
    assert not c.host_busy and not c.bottleneck


def test_zero_gap_bursts_count_only_while_the_client_is_busy():
    bursty = [stream([0, 0, 10, 0, 10])]
    assert zero_gap_share(bursty) == 0.6
    quiet = client_check([health()], bursty).model_dump()
    assert quiet["zero_gap_share"] == 0.6 and not quiet["bottleneck"]
    busy = client_check([health(lag=2.0)], bursty).model_dump()
    assert busy["bottleneck"]
    assert "60% of token events arrived in zero-gap bursts" in busy["reasons"][0]


def test_zero_gaps_count_within_each_chosen_request_only():
    """The one count of zero gaps (the self-check's share, analysis's bursts): a request's
    first event shares no read with the request before it, and unchosen rows are left out."""
    # the second starts at the first's last stamp
    first, second, third = stream([0, 10]), stream([0, 0], start_ms=10), stream([10])
    records = [first, second, third]
    assert zero_gaps(records) == ZeroGaps(zero=3, gaps=5)
    assert zero_gaps(records, np.array([False, True, True])) == ZeroGaps(zero=2, gaps=3)
    assert zero_gaps(records, np.array([False, False, False])).share is None


async def test_the_sampler_sees_a_blocked_loop():
    sampler = HealthSampler(3)
    sampler.start()
    await asyncio.sleep(0.1)
    end = time.perf_counter() + 0.06
    while time.perf_counter() < end:  # block the event loop, busy, for 60 ms
        pass
    await asyncio.sleep(0.05)
    h = await sampler.stop()
    assert h.worker == 3 and len(h.loop_lag_ms) >= 5
    assert max(h.loop_lag_ms) > 30
    assert h.cpu_mean > 0


def test_a_node_that_falls_behind_is_named():
    a, b, c = (health(0), health(1, late=12.0, lag=7.0), health(2))
    a.node, b.node, c.node = "gen-a", "gen-b", "gen-b"
    check = client_check([a, b, c], []).model_dump()
    named = [r for r in check["reasons"] if r.startswith("node ")]
    assert named == ["node gen-b (workers 1, 2) fell behind: lateness p99 12.0 ms, "
                     "loop lag p99 7.0 ms"]
    assert check["bottleneck"]
    assert not any(r.startswith("node ") for r in client_check([a], []).reasons)


def test_the_host_sampler_tells_other_processes_from_the_client():
    """A process that is not the client's (orphaned at once) burns a core: it counts as
    other work; a busy thread of this process counts as the client."""
    burner = f'{sys.executable} -c "import time\nt = time.time()\nwhile time.time() - t < 3: pass"'
    started = subprocess.run(["sh", "-c", f"{burner} > /dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True)
    pid = int(started.stdout.strip())
    try:
        stop = time.monotonic() + 2.6
        with HostSampler() as sampler:
            while time.monotonic() < stop:  # the client's own work
                sum(range(1000))
        result = sampler.result
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert result is not None and result.seconds >= 2
    assert result.other.mean >= 0.4 and result.client.mean >= 0.1  # shares of a busy host
    assert result.server is None


GATEWAY = """
import socket, sys, time
if len(sys.argv) > 1:  # a gateway holds a connection to its backend, as a pool would
    backend = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
front = socket.socket()
front.bind(("127.0.0.1", 0))
front.listen()
print(front.getsockname()[1], flush=True)
time.sleep(60)
"""


def test_a_gateways_backend_counts_as_the_server_not_other_work(tmp_path):
    """A gateway on the target's port forwarding to an engine on another loopback port: the
    engine's process is the server too (its CPU is not the host's 'other work')."""
    import subprocess
    import sys

    from latlab.load.telemetry.host import HostSampler

    backend = subprocess.Popen([sys.executable, "-c", GATEWAY], stdout=subprocess.PIPE,
                               text=True)
    gateway = None
    try:
        backend_port = backend.stdout.readline().strip()
        gateway = subprocess.Popen([sys.executable, "-c", GATEWAY, backend_port],
                                   stdout=subprocess.PIPE, text=True)
        gateway_port = gateway.stdout.readline().strip()
        sampler = HostSampler(url=f"http://127.0.0.1:{gateway_port}")
        assert sampler.server_found == f"process {gateway.pid} listening on :{gateway_port}"
        sampler._find_backends()
        assert backend.pid in sampler._serving() and gateway.pid in sampler._serving()
        assert f"with its backend process {backend.pid}" in sampler.server_found
    finally:
        for p in (backend, gateway):
            if p is not None:
                p.kill()
                p.wait()
