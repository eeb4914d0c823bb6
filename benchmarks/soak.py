"""Does `latlab serve` hold its memory over 100,000 requests of every kind? The soak figure of
docs/performance/reliability.md.

    python benchmarks/soak.py                    # 100,000 requests (about 15 minutes here)
    python benchmarks/soak.py --requests 5000    # a short one
    python benchmarks/soak.py --onednn-cache 8   # the server's oneDNN cache kept small

`latlab serve --model tiny` on 127.0.0.1, and a mix drawn per request from a fixed seed:
ordinary requests (streamed, and whole), aborted streams (closed after 0 to 3 events), failing
ones (invalid JSON, an unknown model, a context overflow, an unsupported field, not JSON) and
hostile ones (half the headers, half the body: cut off by the deadlines; a body over 4 MiB
announced; bytes that are not HTTP). The server's RSS is sampled every second with the count
of requests done; the figure is its growth after the warm-up (the first 10%), in total and
per 10,000 requests. Most of it is oneDNN's primitive cache: one primitive (its kernel and
scratch memory) per matrix shape, and an engine step's shape is its token count, so new
shapes keep coming until every step size has been seen (at most 1,024 are kept); with
`--onednn-cache 8` the server keeps eight, which shows how much of the growth they were.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter

import aiohttp
import psutil

SERVE = ["--model", "tiny", "--max-model-len", "256", "--max-num-seqs", "32",
         "--header-timeout", "2", "--body-timeout", "2"]
CONCURRENCY = 32  # ordinary, aborted and failing requests in flight
HOSTILE_AT_ONCE = 16  # hostile connections open at once (each waits out a deadline)
MIX = {"stream": 0.60, "whole": 0.15, "abort": 0.10, "fail": 0.10, "hostile": 0.05}
WORK = {"prompt": "the soak goes on ", "max_tokens": 8}
FAILING = [  # (body, content type): each gets a 4xx
    (b'{"prompt": "x"', "application/json"),
    (b'{"prompt": "x", "model": "nobody"}', "application/json"),
    (b'{"prompt": "x", "max_tokens": 100000}', "application/json"),
    (b'{"prompt": "x", "n": 3}', "application/json"),
    (b'prompt=x', "text/plain"),
]
HOSTILE = [
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b'Content-Length: 400\r\n\r\n{"prompt": "',
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 5000000\r\n\r\n{",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n",
]


def start_server(onednn_cache: int | None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if onednn_cache is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(onednn_cache)
    process = subprocess.Popen([sys.executable, "-m", "latlab", "serve", *SERVE, "--port",
                                str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, env=env)
    line = process.stdout.readline()
    if not line.startswith("latlab serve: ready"):
        process.kill()
        sys.exit(f"soak: latlab serve did not start: {line.strip()}")
    return process, f"http://127.0.0.1:{port}"


class Soak:
    def __init__(self, url: str, total: int, seed: int) -> None:
        self.url, self.total = url, total
        self.rng = random.Random(seed)
        self.kinds, self.statuses = Counter(), Counter()
        self.done = 0
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)

    def draw(self) -> str:
        return self.rng.choices(list(MIX), weights=list(MIX.values()))[0]

    async def run(self) -> None:
        gate, hostile_gate = asyncio.Semaphore(CONCURRENCY), asyncio.Semaphore(HOSTILE_AT_ONCE)
        connector = aiohttp.TCPConnector(limit=CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=120)) as session:
            pending: set[asyncio.Task] = set()
            for _ in range(self.total):
                kind = self.draw()
                one = self.hostile(hostile_gate) if kind == "hostile" else self.one(
                    session, gate, kind)
                await (hostile_gate if kind == "hostile" else gate).acquire()
                task = asyncio.create_task(one)
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*pending)

    async def one(self, session: aiohttp.ClientSession, gate: asyncio.Semaphore,
                  kind: str) -> None:
        try:
            if kind == "fail":
                body, content_type = self.rng.choice(FAILING)
                async with session.post(self.url + "/v1/completions", data=body,
                                        headers={"Content-Type": content_type}) as r:
                    await r.read()
            else:
                body = {**WORK, "stream": kind != "whole"}
                async with session.post(self.url + "/v1/completions", json=body) as r:
                    if kind == "abort":
                        for _ in range(self.rng.randrange(4)):
                            await r.content.readline()
                        r.close()
                    else:
                        await r.read()
            self.statuses[str(r.status)] += 1
        except (aiohttp.ClientError, TimeoutError) as e:
            self.statuses[type(e).__name__] += 1
        finally:
            self.kinds[kind] += 1
            self.done += 1
            gate.release()

    async def hostile(self, gate: asyncio.Semaphore) -> None:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            writer.write(self.rng.choice(HOSTILE))
            head = await asyncio.wait_for(reader.readline(), 30)
            self.statuses[head.split(b" ")[1].decode() if head else "closed"] += 1
            writer.close()
        except (OSError, TimeoutError) as e:
            self.statuses[type(e).__name__] += 1
        finally:
            self.kinds["hostile"] += 1
            self.done += 1
            gate.release()


async def sample(soak: Soak, process: psutil.Process, series: list[tuple[int, float]]) -> None:
    while True:
        series.append((soak.done, process.memory_info().rss / 2**20))
        await asyncio.sleep(1.0)


def rss_at(series: list[tuple[int, float]], done: int) -> float:
    """The RSS sampled when `done` requests had been done (the first sample at or after)."""
    return next(rss for count, rss in series if count >= done)


async def main_async(url: str, pid: int, total: int, seed: int) -> None:
    process = psutil.Process(pid)
    soak = Soak(url, total, seed)
    series: list[tuple[int, float]] = []
    sampler = asyncio.create_task(sample(soak, process, series))
    started = time.monotonic()
    await soak.run()
    took = time.monotonic() - started
    await asyncio.sleep(2.5)  # a last sample once idle
    sampler.cancel()
    series.append((soak.done, process.memory_info().rss / 2**20))
    warm = total // 10
    start, after_warmup, end = series[0][1], rss_at(series, warm), series[-1][1]
    peak = max(rss for _, rss in series)
    print(f"soak: {soak.done} requests in {took:.0f} s ({soak.done / took:.0f}/s), kinds "
          f"{dict(soak.kinds)}", flush=True)
    print(f"statuses: {dict(sorted(soak.statuses.items()))}")
    print(f"server RSS: {start:.0f} MiB at the start, {after_warmup:.0f} after {warm} requests "
          f"(warm-up), {end:.0f} at the end, peak {peak:.0f}; growth after the warm-up "
          f"{end - after_warmup:+.1f} MiB ({(end - after_warmup) / (total - warm) * 1e4:+.2f} "
          "MiB per 10,000 requests)")
    tenth = max(1, total // 10)
    print("RSS by requests done: " + ", ".join(
        f"{n // 1000}k {rss_at(series, n):.0f}" for n in range(tenth, total + 1, tenth)))
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/health") as r:
            print(f"health afterwards: {r.status} {await r.text()}")
        async with session.get(url + "/metrics") as r:
            lines = [line for line in (await r.text()).splitlines()
                     if line.startswith(("latlab_kv_cache_used_blocks ",
                                         "latlab_requests_cut_off_total",
                                         "latlab_connections_open "))]
        print("metrics afterwards: " + "; ".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--onednn-cache", type=int, default=None, metavar="N",
                        help="the server's oneDNN primitive cache capacity "
                             "(ONEDNN_PRIMITIVE_CACHE_CAPACITY; default: oneDNN's, 1024)")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start"
          + (f"; oneDNN primitive cache {args.onednn_cache}" if args.onednn_cache is not None
             else ""), flush=True)
    server, url = start_server(args.onednn_cache)
    try:
        asyncio.run(main_async(url, server.pid, args.requests, args.seed))
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
