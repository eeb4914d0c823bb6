"""The host during a run, sampled four times a second in a thread: its busy CPU cores, the steal
the hypervisor took, the load average, and which processes used the cores — the load
generator's own (this process and its children), the target's server when it runs on this
host (the embedded engine, or whoever listens on the target's loopback port, with the
loopback backends it forwards to: a gateway's engine is the server too), and every other
process. What lets the self-check tell a saturated client from a busy host."""

from __future__ import annotations

import os
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import psutil

from latlab.records.summary import HostLoad, Usage

INTERVAL_S = 0.25
BACKENDS_EVERY_S = 2.0  # a gateway opens its connections to the backend once requests flow
LOOPBACK = {"127.0.0.1", "::1", "localhost"}


class HostSampler:
    """`with HostSampler(server_pid) as host: ...; host.result` (None under a second)."""

    def __init__(self, server_pid: int | None = None, url: str | None = None) -> None:
        self._server_root, self._found_how = self._server(server_pid, url)
        self._backends: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="latlab-host", daemon=True)
        self._samples: list[tuple[float, float, float, float, float, float | None]] = []
        self._load = 0.0
        self.result: HostLoad | None = None

    def __enter__(self) -> HostSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.result = self._summary()

    @staticmethod
    def _server(pid: int | None, url: str | None) -> tuple[psutil.Process | None, str | None]:
        if pid is not None:
            try:
                return psutil.Process(pid), "the embedded engine"
            except psutil.Error:
                return None, None
        parts = urlsplit(url or "")
        if parts.hostname not in LOOPBACK or parts.port is None:
            return None, None
        try:
            for c in psutil.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN and c.laddr.port == parts.port and c.pid:
                    return psutil.Process(c.pid), f"process {c.pid} listening on :{parts.port}"
        except (psutil.Error, OSError):  # not allowed to see other users' sockets
            pass
        return None, None

    def _tree(self, root: psutil.Process | None) -> dict[int, psutil.Process]:
        if root is None:
            return {}
        try:
            return {p.pid: p for p in [root, *root.children(recursive=True)]}
        except psutil.Error:
            return {}

    def _serving(self) -> dict[int, psutil.Process]:
        """The server's process tree and its backends' trees."""
        found = self._tree(self._server_root)
        for backend in self._backends.values():
            found |= self._tree(backend)
        return found

    def _find_backends(self) -> None:
        """Add the processes listening on loopback ports that the serving processes hold
        connections to (a gateway's engine; its own backends in turn)."""
        if self._server_root is None:
            return
        try:
            connections = psutil.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return
        listeners = {c.laddr.port: c.pid for c in connections
                     if c.status == psutil.CONN_LISTEN and c.pid}
        serving = set(self._serving())
        me = os.getpid()  # latlab's own listeners (an OTLP receiver) are not a backend
        for _ in range(4):  # gateway → router → engine, at most
            added = {listeners[c.raddr.port] for c in connections
                     if c.pid in serving and c.raddr and c.raddr.ip in LOOPBACK
                     and c.status == psutil.CONN_ESTABLISHED and c.raddr.port in listeners
                     and listeners[c.raddr.port] not in serving
                     and listeners[c.raddr.port] != me}
            if not added:
                return
            for pid in added:
                try:
                    self._backends[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
            serving |= set(self._serving())

    @property
    def server_found(self) -> str | None:
        """How the server's processes were found."""
        if not self._backends or self._found_how is None:
            return self._found_how
        return (f"{self._found_how}, with its backend{'s' if len(self._backends) > 1 else ''} "
                + ", ".join(f"process {pid}" for pid in self._backends))

    def _run(self) -> None:
        me = psutil.Process()
        seen: dict[int, float] = {}
        self._find_backends()
        _spent({**self._tree(me), **self._serving()}, seen)
        last = (psutil.cpu_times(), time.perf_counter())
        looked = last[1]
        while True:
            stopping = self._stop.wait(INTERVAL_S)
            if last[1] - looked >= BACKENDS_EVERY_S:
                self._find_backends()
                looked = last[1]
            last = self._sample(me, seen, *last)
            if stopping:  # the last, shorter interval too: a short run gets a sample
                return

    def _sample(self, me: psutil.Process, seen: dict[int, float], last_host: Any,
                last_time: float) -> tuple[Any, float]:
        host, now = psutil.cpu_times(), time.perf_counter()
        wall = now - last_time
        server = self._serving()
        client = {pid: p for pid, p in self._tree(me).items() if pid not in server}
        used = [_spent(procs, seen) / wall for procs in (client, server)]
        total = sum(host) - sum(last_host)
        idle = (host.idle + getattr(host, "iowait", 0.0)
                - last_host.idle - getattr(last_host, "iowait", 0.0))
        busy = max(0.0, (total - idle) / wall)
        steal = ((host.steal - last_host.steal) / total
                 if hasattr(host, "steal") and total > 0 else None)
        self._samples.append((wall, busy, used[0], used[1], max(0.0, busy - sum(used)), steal))
        self._load = max(self._load, psutil.getloadavg()[0])
        return host, now

    def _summary(self) -> HostLoad | None:
        if not self._samples:
            return None
        weights, *columns = (list(c) for c in zip(*self._samples))
        seconds = sum(weights)

        def usage(values: list) -> Usage:
            return Usage(mean=sum(v * w for v, w in zip(values, weights)) / seconds,
                         max=max(values))

        steal = columns[4] if all(v is not None for v in columns[4]) else None
        return HostLoad(cpus=psutil.cpu_count() or 1, seconds=seconds, busy=usage(columns[0]),
                        client=usage(columns[1]),
                        server=usage(columns[2]) if self._server_root else None,
                        server_found=self.server_found, other=usage(columns[3]),
                        steal=usage(steal) if steal else None, load_average_max=self._load)


def _spent(processes: dict[int, psutil.Process], seen: dict[int, float]) -> float:
    """CPU seconds `processes` spent since the last call (one first seen: nothing yet)."""
    spent = 0.0
    for pid, p in processes.items():
        try:
            times = p.cpu_times()
        except psutil.Error:
            continue
        now = times.user + times.system
        spent += now - seen.get(pid, now)  # a process first seen counts from then on
        seen[pid] = now
    return spent
