"""How much load can latlab's client generate and still time every token right?

    python benchmarks/client.py            # the full run (about a minute)
    python benchmarks/client.py --quick    # fewer, shorter configurations

Local streaming servers run in their own processes (they must not steal the measured
client's CPU): a raw asyncio HTTP/1.1 server that either paces one token event per 10 ms per
stream, logging the moment it wrote each event on the shared monotonic clock, or writes a
whole stream at once.

(1) capacity: closed-loop `latlab bench` runs against the paced server at rising concurrency
    with 1 and 2 worker processes: achieved token events/s against the ideal (concurrency ×
    100/s), the client's added ITL error (the gap latlab measured between two events minus
    the gap between the server's writes of them), the gap minus the intended 10 ms, and the
    client's own loop lag and CPU.
(2) raw speed: token events/s of latlab (one process, records written) against a minimal
    aiohttp + uvloop loop that parses the same streams, both against the zero-delay server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

INTERVAL_S = 0.010
EVENT = (b'data: {"id":"cmpl-bench","object":"text_completion","created":0,"model":"bench",'
         b'"choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":null}],'
         b'"usage":null}\n\n')


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _tail(n: int) -> bytes:
    usage = {"id": "cmpl-bench", "choices": [],
             "usage": {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}}
    return _chunk(b"data: " + orjson.dumps(usage) + b"\n\n") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")
MODELS = b'{"object":"list","data":[{"id":"bench"}]}'


# --- the servers (run as `client.py serve PORT LOG`) ------------------------------------


class StreamServer(asyncio.Protocol):
    """HTTP/1.1 keep-alive: `/paced/...` streams an event per 10 ms, `/fast/...` all at once."""

    log_fd = -1
    fast_bodies: dict[int, bytes] = {}

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.buf = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data: bytes) -> None:
        if not self.buf:
            self.received = time.perf_counter_ns()
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
            length = int(headers.get("content-length", 0))
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
            method, path, _ = lines[0].split(" ", 2)
            self.route(method, path, headers, body)

    def route(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        if method == "GET":
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
            return
        n = int(orjson.loads(body)["max_tokens"])
        if path.startswith("/fast"):
            if n not in self.fast_bodies:
                self.fast_bodies[n] = HEAD + _chunk(EVENT) * n + _tail(n)
            self.transport.write(self.fast_bodies[n])
            return
        self.transport.write(HEAD)
        self.rid, self.n, self.sent = headers.get("x-request-id", ""), n, []
        self.arrived = self.received
        self.start = asyncio.get_running_loop().time()
        self._schedule()

    def _schedule(self) -> None:
        due = self.start + (len(self.sent) + 1) * INTERVAL_S
        self.timer = asyncio.get_running_loop().call_at(due, self._tick)

    def _tick(self) -> None:
        self.transport.write(_chunk(EVENT))
        self.sent.append(time.perf_counter_ns())
        if len(self.sent) < self.n:
            return self._schedule()
        self.timer = None
        self.transport.write(_tail(self.n))
        os.write(self.log_fd, orjson.dumps({"id": self.rid, "r": self.arrived, "t": self.sent})
                 + b"\n")


def serve(port: int, log: str) -> None:
    import uvloop

    StreamServer.log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(StreamServer, sock=sock,
                                                                backlog=4096)
        await server.serve_forever()

    uvloop.run(main())


class Servers:
    """`count` server processes sharing one port (SO_REUSEPORT)."""

    def __init__(self, count: int, folder: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = folder / "server-sends.jsonl"
        self.procs = [subprocess.Popen([sys.executable, __file__, "serve", str(self.port),
                                        str(self.log)]) for _ in range(count)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    time.sleep(0.5)  # let every process bind
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("benchmark servers did not start")

    def url(self, kind: str) -> str:
        return f"http://127.0.0.1:{self.port}/{kind}"

    def sends(self) -> dict[str, list[int]]:
        rows = [orjson.loads(line) for line in self.log.read_bytes().splitlines()]
        return {row["id"]: row["t"] for row in rows}

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(10)


# --- (1) capacity ---------------------------------------------------------------------


def bench_config(url: str, folder: Path, **kw):
    from latlab.records.config import BenchConfig
    from latlab.records.workload import ArrivalConfig, LengthDistribution, WorkloadConfig

    users, output = kw.pop("users"), kw.pop("output")
    workload = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=16),
                              output_tokens=LengthDistribution(kind="fixed", a=output))
    return BenchConfig(url=url, model="bench", workload=workload, out=folder,
                       arrivals=ArrivalConfig(users=users, ramp_s=kw.pop("ramp_s", 0.0)),
                       continuous_usage=False, **kw)


def capacity(servers: Servers, folder: Path, users: int, workers: int, duration: float) -> dict:
    from latlab.commands.bench import run_bench
    from latlab.records.window import run_window

    config = bench_config(servers.url("paced"), folder, users=users, output=50,
                          duration_s=duration, warmup_s=2.0, cooldown_s=0.5, ramp_s=1.0,
                          workers=workers)
    result = run_bench(config)
    records = result.run.read_records()
    window = run_window(result.run.read_config(), records)
    sends = servers.sends()
    events = 0
    added, versus_intended = [], []
    for r in records:
        t = np.asarray(r.token_ns, dtype=np.int64)
        inside = (t >= window.start_ns) & (t < window.end_ns)
        events += int(inside.sum())
        server_t = sends.get(r.id)
        if not r.ok or server_t is None or len(server_t) != len(t):
            continue
        keep = inside[1:]
        client_gaps = np.diff(t)[keep]
        added.extend((client_gaps - np.diff(np.asarray(server_t, dtype=np.int64))[keep]) / 1e6)
        versus_intended.extend(client_gaps / 1e6 - INTERVAL_S * 1e3)
    added_ms, intended_ms = np.asarray(added), np.asarray(versus_intended)
    client = result.summary.client
    return {"users": users, "workers": workers, "events_per_s": events / window.duration_s,
            "ideal_per_s": users / INTERVAL_S,
            "added_p50": float(np.percentile(added_ms, 50)), "added_p99": float(np.percentile(added_ms, 99)),
            "vs10_p50": float(np.percentile(intended_ms, 50)), "vs10_p99": float(np.percentile(intended_ms, 99)),
            "lag_p99": client.loop_lag_ms.p99, "lag_max": client.loop_lag_ms.max,
            "cpu": client.cpu_percent.mean, "failed": sum(not r.ok for r in records),
            "bottleneck": client.bottleneck}


# --- (2) raw speed ---------------------------------------------------------------------


async def minimal_loop(url: str, users: int, requests: int, output: int) -> tuple[int, float]:
    """The baseline: aiohttp, one session, each user streams and parses its requests."""
    import aiohttp

    body = orjson.dumps({"model": "bench", "prompt": "x", "max_tokens": output, "stream": True})
    events = 0
    remaining = requests

    async def user(session: aiohttp.ClientSession) -> None:
        nonlocal events, remaining
        while remaining > 0:
            remaining -= 1
            async with session.post(url + "/v1/completions", data=body) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                        chunk = orjson.loads(line[6:])
                        if chunk["choices"] and chunk["choices"][0]["text"]:
                            events += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=users)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(user(session) for _ in range(users)))
        return events, time.perf_counter() - start


def raw_speed(servers: Servers, folder: Path, users: int, requests: int, output: int,
              rounds: int) -> dict:
    import uvloop

    from latlab.commands.bench import run_bench

    best_raw = best_latlab = 0.0
    for _ in range(rounds):
        events, seconds = uvloop.run(minimal_loop(servers.url("fast"), users, requests, output))
        best_raw = max(best_raw, events / seconds)
        config = bench_config(servers.url("fast"), folder, users=users, output=output,
                              duration_s=None, requests=requests)
        result = run_bench(config)
        records = result.run.read_records()
        start = min(r.sent_ns for r in records)
        end = max(r.done_ns for r in records)
        latlab_events = sum(len(r.token_ns) for r in records)
        best_latlab = max(best_latlab, latlab_events / ((end - start) / 1e9))
    return {"raw": best_raw, "latlab": best_latlab, "ratio": best_latlab / best_raw}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter configurations")
    parser.add_argument("--servers", type=int, default=2, help="server processes")
    args = parser.parse_args()
    levels = (64, 256) if args.quick else (64, 256, 1024)
    duration = 5.0 if args.quick else 8.0
    print(f"latlab client benchmark · {os.cpu_count()} CPUs · {args.servers} server processes")
    with tempfile.TemporaryDirectory(prefix="latlab-bench-") as tmp:
        folder = Path(tmp)
        servers = Servers(args.servers, folder)
        try:
            print("\n(1) capacity: one token event per 10 ms per stream, closed loop")
            print(f"{'streams':>8} {'workers':>7} {'events/s':>10} {'of ideal':>8} "
                  f"{'added p50':>9} {'p99':>7} {'gap-10ms p50':>12} {'p99':>7} "
                  f"{'loop lag p99':>12} {'max':>6} {'CPU%':>5}  failed")
            for workers in (1, 2):
                for users in levels:
                    c = capacity(servers, folder, users, workers, duration)
                    print(f"{c['users']:>8} {c['workers']:>7} {c['events_per_s']:>10,.0f} "
                          f"{100 * c['events_per_s'] / c['ideal_per_s']:>7.1f}% "
                          f"{c['added_p50']:>9.3f} {c['added_p99']:>7.3f} {c['vs10_p50']:>12.3f} "
                          f"{c['vs10_p99']:>7.3f} {c['lag_p99']:>12.2f} {c['lag_max']:>6.1f} "
                          f"{c['cpu']:>5.0f}  {c['failed']}" + ("  (client bottleneck)"
                                                                if c["bottleneck"] else ""))
            print("   (ms; added = latlab's gap between two events − the server's gap between "
                  "writing them)")
            print("\n(2) raw speed: zero-delay streams of 200 events, 32 streams, one process")
            r = raw_speed(servers, folder, users=32, requests=150 if args.quick else 300,
                          output=200, rounds=2 if args.quick else 3)
            print(f"   minimal aiohttp loop {r['raw']:>10,.0f} events/s")
            print(f"   latlab bench         {r['latlab']:>10,.0f} events/s   "
                  f"ratio {r['ratio']:.2f}x")
        finally:
            servers.stop()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        main()
