"""How much load can latlab's client generate and still time every token right?

    python benchmarks/client.py                 # the full run (about six minutes)
    python benchmarks/client.py --quick         # fewer, shorter configurations
    python benchmarks/client.py --aiperf .venv-clients/bin/aiperf   # and AIPerf's client

Local streaming servers run in their own processes (they must not steal the measured
client's CPU): a raw asyncio HTTP/1.1 server that either paces one token event per 10 ms per
stream, logging when it got each request and when it wrote each event on the shared
monotonic clock, or writes a whole stream at once.

The error a client adds: to ITL, the gap it measured between two events minus the gap
between the server's writes of them; to TTFT, its time to first token minus the server's
(its first write minus the request's arrival). Both clocks are the machine's CLOCK_MONOTONIC.
The TTFT error's two sides are shown apart at p99: `send` (the server's read of the request
minus the client's send stamp: the client's write and the server loop's own delay) and
`delivery` (the client's stamp of an event minus the server's write of it).

(1) capacity: closed-loop `latlab bench` runs against the paced server at rising concurrency
    with 1 and 2 worker processes: achieved token events/s against the ideal (concurrency x
    100/s), the added ITL and TTFT errors, the client's own loop lag and CPU.
(2) side by side, 256 streams of 100 tokens/s, one after another on the same servers:
    latlab (one process; the same with Python's garbage collector left on during the load,
    as before `latlab.load.workers.collector`; `--workers auto`), a minimal aiohttp + uvloop client
    that stamps each event as it reads its line, and AIPerf (`--aiperf PATH`: its raw
    records carry a monotonic stamp per event and the X-Request-Id the server logs); with
    `--rounds N` each client runs N times, interleaved, and the median is shown (3 by
    default, 1 with --quick). AIPerf must live in its own environment, with the same torch
    pin:
        python3 -m venv .venv-clients
        .venv-clients/bin/pip install -c benchmarks/clients-constraints.txt aiperf
(3) raw speed: token events/s on zero-delay streams (32 streams of 200 events) of latlab
    (one process, records written), the minimal aiohttp loop and AIPerf.
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
    return (_chunk(b"data: " + orjson.dumps(usage) + b"\n\n") + _chunk(b"data: [DONE]\n\n")
            + b"0\r\n\r\n")


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
        try:
            n = int(orjson.loads(body)["max_tokens"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):  # AIPerf's probes
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return
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

    def sends(self) -> dict[str, dict]:
        """Each finished stream by its X-Request-Id: when the server got the request (`r`)
        and when it wrote each token event (`t`)."""
        rows = [orjson.loads(line) for line in self.log.read_bytes().splitlines()]
        return {row["id"]: row for row in rows}

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(10)


ADDED = ("events_per_s", "itl_p50", "itl_p99", "ttft_p50", "ttft_p99", "send_p99",
         "delivery_p99")


# --- what a client added ----------------------------------------------------------------


def added_errors(streams: list[tuple[str, list[int], int | None]], sends: dict[str, dict],
                 start_ns: int, end_ns: int) -> dict:
    """ITL and TTFT errors (ms) of `streams` (request id, the client's token stamps, its
    send stamp), counting events and requests inside [start_ns, end_ns); and the TTFT
    error's two sides: `send` (the server's read of the request − the client's send stamp,
    which includes the server's own delay) and `delivery` (the client's stamp of an event −
    the server's write of it)."""
    itl, ttft, send, delivery, events = [], [], [], [], 0
    for rid, stamps, sent in streams:
        t = np.asarray(stamps, dtype=np.int64)
        inside = (t >= start_ns) & (t < end_ns)
        events += int(inside.sum())
        server = sends.get(rid)
        if server is None or len(server["t"]) != len(t) or not len(t):
            continue
        written = np.asarray(server["t"], dtype=np.int64)
        itl.extend(((np.diff(t) - np.diff(written)) / 1e6)[inside[1:]])
        delivery.extend(((t - written) / 1e6)[inside])
        if sent is not None and start_ns <= sent < end_ns:
            ttft.append(((t[0] - sent) - (written[0] - server["r"])) / 1e6)
            send.append((server["r"] - sent) / 1e6)
    out = {"events_per_s": events / ((end_ns - start_ns) / 1e9)}
    for name, values in (("itl", itl), ("ttft", ttft), ("send", send), ("delivery", delivery)):
        v = np.asarray(values) if values else np.asarray([np.nan])
        out[f"{name}_p50"], out[f"{name}_p99"] = np.percentile(v, 50), np.percentile(v, 99)
    return out


# --- latlab -------------------------------------------------------------------------------


def bench_config(url: str, folder: Path, **kw):
    from latlab.records.arrivals import ArrivalConfig
    from latlab.records.bench import BenchConfig
    from latlab.records.lengths import LengthDistribution
    from latlab.records.workload import WorkloadConfig

    users, output = kw.pop("users"), kw.pop("output")
    workload = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=16),
                              output_tokens=LengthDistribution(kind="fixed", a=output))
    return BenchConfig(url=url, model="bench", workload=workload, out=folder,
                       arrivals=ArrivalConfig(users=users, ramp_s=kw.pop("ramp_s", 0.0)),
                       continuous_usage=False, **kw)


def latlab_run(servers: Servers, folder: Path, users: int, workers, duration: float) -> dict:
    from latlab.records.window import run_window
    from latlab.services.bench import run_bench

    config = bench_config(servers.url("paced"), folder, users=users, output=50,
                          duration_s=duration, warmup_s=2.0, cooldown_s=0.5, ramp_s=1.0,
                          workers=workers)
    result = run_bench(config)
    records = result.run.read_records()
    window = run_window(result.run.read_config(), records)
    out = added_errors([(r.id, r.token_ns, r.sent_ns) for r in records if r.ok],
                       servers.sends(), window.start_ns, window.end_ns)
    client = result.summary.client
    return out | {"users": users, "workers": client.workers,
                  "window": (window.start_ns, window.end_ns),
                  "lag_p99": client.loop_lag_ms.p99, "cpu": client.cpu_percent.mean,
                  "failed": sum(not r.ok for r in records), "bottleneck": client.bottleneck}


GC_PAUSES: list[tuple[int, float]] = []  # (generation, ms of CPU) in the collector-on windows


def collector_on(run):
    """`run` with Python's garbage collector left on during the load, as before
    `latlab.load.workers.collector` (the one process runs in this one); each collection's CPU time
    goes to GC_PAUSES."""
    import contextlib
    import gc

    from latlab.load.workers import collector

    started: list[int] = []
    pauses: list[tuple[int, int, float]] = []

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.thread_time_ns())
        elif started:
            pauses.append((time.perf_counter_ns(), info["generation"],
                           (time.thread_time_ns() - started.pop()) / 1e6))

    paused = collector.collector_paused
    collector.collector_paused = contextlib.nullcontext
    gc.callbacks.append(timed)
    try:
        result = run()
    finally:
        gc.callbacks.remove(timed)
        collector.collector_paused = paused
    start, end = result["window"]
    GC_PAUSES.extend((g, ms) for t, g, ms in pauses if start <= t < end)
    return result


def gc_pauses() -> str:
    lines = []
    for gen in sorted({g for g, _ in GC_PAUSES}):
        ms = [p for g, p in GC_PAUSES if g == gen]
        lines.append(f"generation {gen}: {len(ms)} collections, median {np.median(ms):.2f} ms, "
                     f"max {max(ms):.1f} ms")
    return "; ".join(lines)


# --- a minimal aiohttp client -------------------------------------------------------------


async def minimal_loop(url: str, users: int, requests: int | None, output: int,
                       duration: float | None = None) -> list[tuple[str, list[int], int]]:
    """The baseline: aiohttp + uvloop, one session; each user streams requests one after
    another, parsing each line, and stamps each token event as its line is read."""
    import aiohttp

    body = orjson.dumps({"model": "bench", "prompt": "x", "max_tokens": output, "stream": True})
    streams: list[tuple[str, list[int], int]] = []
    remaining = requests if requests is not None else 1 << 30
    stop = time.perf_counter() + duration if duration else float("inf")

    async def user(session: aiohttp.ClientSession, u: int) -> None:
        nonlocal remaining
        k = 0
        while remaining > 0 and time.perf_counter() < stop:
            remaining -= 1
            rid, stamps, k = f"min-{u}-{k}", [], k + 1
            sent = time.perf_counter_ns()
            async with session.post(url + "/v1/completions", data=body,
                                    headers={"X-Request-Id": rid}) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                        t = time.perf_counter_ns()
                        chunk = orjson.loads(line[6:])
                        if chunk["choices"] and chunk["choices"][0]["text"]:
                            stamps.append(t)
            streams.append((rid, stamps, sent))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=users)) as session:
        await asyncio.gather(*(user(session, u) for u in range(users)))
    return streams


def minimal_run(servers: Servers, users: int, duration: float) -> dict:
    import uvloop

    start = time.perf_counter_ns()
    streams = uvloop.run(minimal_loop(servers.url("paced"), users, None, 50, duration))
    return added_errors(streams, servers.sends(), start + int(2e9),
                        start + int((duration - 0.5) * 1e9))


# --- AIPerf -------------------------------------------------------------------------------


def aiperf_run(aiperf: str, url: str, folder: Path, concurrency: int, requests: int,
               output: int) -> tuple[list[tuple[str, list[int], int]], float]:
    """AIPerf's streams from its raw records (its own per-event monotonic stamps), and how
    long its run took."""
    out = folder / f"aiperf-{time.monotonic_ns()}"
    tokenizer = folder / "tokenizer"
    tokenizer.mkdir(exist_ok=True)
    (tokenizer / "tokenizer.json").write_bytes(
        (Path(__file__).parents[1] / "latlab/tokenizer/tokenizer.json").read_bytes())
    (tokenizer / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast"}')
    subprocess.run([aiperf, "profile", "--model", "bench", "--url", url, "--endpoint-type",
                    "completions", "--streaming", "--tokenizer", str(tokenizer),
                    "--concurrency", str(concurrency), "--request-count", str(requests),
                    "--prompt-input-tokens-mean", "16", "--prompt-output-tokens-mean",
                    str(output), "--extra-inputs", "ignore_eos:true", "--output-artifact-dir",
                    str(out), "--export-level", "raw", "--no-auto-plot"],
                   check=True, capture_output=True, timeout=600)
    streams, first, last = [], None, None
    for line in (out / "profile_export_raw.jsonl").read_bytes().splitlines():
        row = orjson.loads(line)
        stamps = [r["perf_ns"] for r in row["responses"]
                  if any('"text":" token"' in p.get("value", "") for p in r["packets"])]
        streams.append((row["request_headers"]["X-Request-ID"], stamps, row["start_perf_ns"]))
        if stamps:
            first = min(first or row["start_perf_ns"], row["start_perf_ns"])
            last = max(last or 0, stamps[-1])
    return streams, (last - first) / 1e9 if first and last else float("nan")


def aiperf_paced(aiperf: str, servers: Servers, folder: Path, users: int,
                 duration: float) -> dict:
    start = time.perf_counter_ns()
    streams, _ = aiperf_run(aiperf, servers.url("paced"), folder, users,
                            int(users * 2 * duration), 50)
    starts = sorted(s for _, _, s in streams)
    begin = starts[0] if starts else start
    return added_errors(streams, servers.sends(), begin + int(2e9),
                        begin + int((duration - 0.5) * 1e9))


# --- raw speed ----------------------------------------------------------------------------


def raw_speed(servers: Servers, folder: Path, users: int, requests: int, output: int,
              rounds: int, aiperf: str | None) -> dict:
    import uvloop

    from latlab.services.bench import run_bench

    best = {"minimal": 0.0, "latlab": 0.0, "aiperf": 0.0}
    for _ in range(rounds):
        start = time.perf_counter()
        streams = uvloop.run(minimal_loop(servers.url("fast"), users, requests, output))
        best["minimal"] = max(best["minimal"], sum(len(s) for _, s, _ in streams)
                              / (time.perf_counter() - start))
        config = bench_config(servers.url("fast"), folder, users=users, output=output,
                              duration_s=None, requests=requests)
        records = run_bench(config).run.read_records()
        seconds = (max(r.done_ns for r in records) - min(r.sent_ns for r in records)) / 1e9
        best["latlab"] = max(best["latlab"], sum(len(r.token_ns) for r in records) / seconds)
        if aiperf:
            streams, seconds = aiperf_run(aiperf, servers.url("fast"), folder, users,
                                          requests, output)
            best["aiperf"] = max(best["aiperf"], sum(len(s) for _, s, _ in streams) / seconds)
    return best


def parse_ns() -> float:
    from latlab.load.workers.auto import parse_ns_per_event

    return min(parse_ns_per_event() for _ in range(5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter configurations")
    parser.add_argument("--servers", type=int, default=2, help="server processes")
    parser.add_argument("--aiperf", help="AIPerf's `aiperf` command, to compare its client")
    parser.add_argument("--rounds", type=int, help="rounds of the side-by-side comparison")
    args = parser.parse_args()
    levels = (64, 256) if args.quick else (64, 256, 1024)
    duration = 5.0 if args.quick else 8.0
    print(f"latlab client benchmark · {os.cpu_count()} CPUs · {args.servers} server processes · "
          f"load average {os.getloadavg()[0]:.1f} · self-check parse {parse_ns():,.0f} ns/event")
    with tempfile.TemporaryDirectory(prefix="latlab-bench-") as tmp:
        folder = Path(tmp)
        servers = Servers(args.servers, folder)
        try:
            print("\n(1) capacity: one token event per 10 ms per stream, closed loop")
            print(f"{'streams':>8} {'workers':>7} {'events/s':>10} {'of ideal':>8} "
                  f"{'ITL added p50':>13} {'p99':>7} {'TTFT added p50':>14} {'p99':>7} "
                  f"{'send p99':>8} {'deliv. p99':>10} {'loop lag p99':>12} {'CPU%':>5}  failed")
            for workers in (1, 2):
                for users in levels:
                    c = latlab_run(servers, folder, users, workers, duration)
                    print(f"{users:>8} {workers:>7} {c['events_per_s']:>10,.0f} "
                          f"{100 * c['events_per_s'] / (users / INTERVAL_S):>7.1f}% "
                          f"{c['itl_p50']:>13.3f} {c['itl_p99']:>7.3f} {c['ttft_p50']:>14.3f} "
                          f"{c['ttft_p99']:>7.3f} {c['send_p99']:>8.3f} {c['delivery_p99']:>10.3f} "
                          f"{c['lag_p99']:>12.2f} {c['cpu']:>5.0f}  "
                          f"{c['failed']}" + ("  (client bottleneck)" if c["bottleneck"] else ""))
            print("   (ms)")
            users = 256
            print(f"\n(2) side by side: {users} streams of 100 tokens/s, {duration:g} s each "
                  f"(2 s warm-up and 0.5 s left out), median of "
                  f"{args.rounds or (1 if args.quick else 3)} interleaved rounds")
            print(f"{'client':<28} {'events/s':>10} {'ITL added p50':>13} {'p99':>7} "
                  f"{'TTFT added p50':>14} {'p99':>7} {'send p99':>8} {'deliv. p99':>10}")
            rows = [("latlab, 1 process", lambda: latlab_run(servers, folder, users, 1, duration)),
                    ("  the same, collector on", lambda: collector_on(
                        lambda: latlab_run(servers, folder, users, 1, duration))),
                    ("latlab, --workers auto", lambda: latlab_run(servers, folder, users, "auto",
                                                                 duration)),
                    ("minimal aiohttp + uvloop", lambda: minimal_run(servers, users, duration))]
            if args.aiperf:
                rows.append(("AIPerf " + _version(args.aiperf),
                             lambda: aiperf_paced(args.aiperf, servers, folder, users, duration)))
            rounds = args.rounds or (1 if args.quick else 3)
            results: dict[str, list[dict]] = {name: [] for name, _ in rows}
            for _ in range(rounds):
                for name, run in rows:
                    results[name].append(run())
            for name, runs in results.items():
                c = {k: float(np.median([r[k] for r in runs])) for k in ADDED}
                label = name + (f" ({runs[0]['workers']})" if "auto" in name else "")
                print(f"{label:<28} {c['events_per_s']:>10,.0f} {c['itl_p50']:>13.3f} "
                      f"{c['itl_p99']:>7.3f} {c['ttft_p50']:>14.3f} {c['ttft_p99']:>7.3f} "
                      f"{c['send_p99']:>8.3f} {c['delivery_p99']:>10.3f}")
            print("   (ms)")
            print(f"   the collector's pauses in those runs' windows (CPU time): "
                  f"{gc_pauses()}")
            print("\n(3) raw speed: zero-delay streams of 200 events, 32 streams")
            r = raw_speed(servers, folder, users=32, requests=150 if args.quick else 300,
                          output=200, rounds=2 if args.quick else 3, aiperf=args.aiperf)
            print(f"   minimal aiohttp loop {r['minimal']:>10,.0f} events/s")
            print(f"   latlab bench         {r['latlab']:>10,.0f} events/s   "
                  f"ratio {r['latlab'] / r['minimal']:.2f}x")
            if args.aiperf:
                print(f"   AIPerf               {r['aiperf']:>10,.0f} events/s   "
                      f"ratio {r['aiperf'] / r['minimal']:.2f}x")
        finally:
            servers.stop()
        print(f"load average at the end {os.getloadavg()[0]:.1f}")


def _version(aiperf: str) -> str:
    python = Path(aiperf).parent / "python"
    found = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                            "print(m.version('aiperf'))"], capture_output=True, text=True)
    return found.stdout.strip()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        main()
