"""Does `latlab serve` stay up whatever its clients do? The numbers of
docs/performance/reliability.md.

    python benchmarks/server_reliability.py            # about four minutes
    python benchmarks/server_reliability.py --quick    # fewer cases, shorter overload

`latlab serve --model tiny` on 127.0.0.1, twice:
(1) fuzzing, with a 64-token context so valid cases end fast: schemathesis with every check
    (its coverage and fuzzing phases, valid and invalid cases from /openapi.json): how many
    cases, and which checks failed;
(2) overload: the capacity of closed-loop clients, then an open loop at 3x that rate: the
    waiting queue's peak against --max-waiting, 429s with and without Retry-After (and the
    range of its values: the time to serve the queue), the server's RSS growth;
(3) aborted streams: streams closed after 0-3 events: KV blocks still held once idle;
(4) half-sent bodies: 3x --max-waiting connections that never finish their body: none is
    turned away for the queue (429), each gets 408 when --body-timeout ends, none left open.
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
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from schema_fuzz import check_all  # noqa: E402  (the test suite's driver, shared)

MAX_WAITING = 16
MAX_NUM_SEQS = 8
BODY_TIMEOUT_S = 5  # latlab serve's default --body-timeout (plus up to 50%)
FUZZ_SERVE = ["--model", "tiny", "--max-model-len", "64", "--block-size", "8",
              "--num-kv-blocks", "64", "--max-num-seqs", "4", "--max-num-batched-tokens", "64"]
LOAD_SERVE = ["--model", "tiny", "--max-model-len", "512", "--block-size", "16",
              "--num-kv-blocks", "512", "--max-num-seqs", str(MAX_NUM_SEQS),
              "--max-waiting", str(MAX_WAITING)]
# Long enough that the server, not this client, is what runs out at 3x.
WORK = {"prompt": "hello " * 8, "max_tokens": 256, "ignore_eos": True}


def start_server(options: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "latlab", "serve", *options,
                                "--port", str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = process.stdout.readline()
    if not line.startswith("latlab serve: ready"):
        process.kill()
        sys.exit(f"server_reliability: latlab serve did not start: {line.strip()}")
    return process, f"http://127.0.0.1:{port}"


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise RuntimeError(f"{name} is not in /metrics")


async def capacity(session: aiohttp.ClientSession, url: str, seconds: float) -> float:
    """Requests/s that MAX_NUM_SEQS closed-loop clients get done."""
    done = 0
    end = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < end:
            async with session.post(url + "/v1/completions", json=WORK) as r:
                await r.read()
                done += r.status == 200
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(MAX_NUM_SEQS)))
    return done / (time.perf_counter() - started)


async def overload(session: aiohttp.ClientSession, url: str, rate: float,
                   seconds: float) -> dict:
    statuses: Counter = Counter()
    without_retry_after = 0
    retry_after: list[int] = []
    peak_waiting = 0.0

    async def one() -> None:
        nonlocal without_retry_after
        async with session.post(url + "/v1/completions", json=WORK) as r:
            await r.read()
            statuses[r.status] += 1
            without_retry_after += r.status == 429 and "Retry-After" not in r.headers
            if r.status == 429 and "Retry-After" in r.headers:
                retry_after.append(int(r.headers["Retry-After"]))

    async def watch() -> None:
        nonlocal peak_waiting
        while True:
            waiting = await metric(session, url, "latlab_num_requests_waiting")
            peak_waiting = max(peak_waiting, waiting)
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch())
    tasks = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(one()))
    sent_rate = len(tasks) / (time.perf_counter() - start)
    await asyncio.gather(*tasks)
    watcher.cancel()
    return {"statuses": dict(statuses), "without_retry_after": without_retry_after,
            "retry_after": (min(retry_after), max(retry_after)) if retry_after else None,
            "peak_waiting": peak_waiting, "sent_rate": sent_rate}


async def aborted_streams(session: aiohttp.ClientSession, url: str, count: int) -> None:
    gate = asyncio.Semaphore(32)
    rng = random.Random(0)

    async def one(events: int) -> None:
        async with gate, session.post(url + "/v1/completions", json={
                **WORK, "stream": True}) as r:
            for _ in range(events):
                await r.content.readline()
            r.close()

    await asyncio.gather(*(one(rng.randrange(4)) for _ in range(count)))


async def idle_blocks(session: aiohttp.ClientSession, url: str) -> float:
    """KV blocks held once nothing runs or waits any more (at most 30 s of waiting)."""
    for _ in range(300):
        running = await metric(session, url, "latlab_num_requests_running")
        waiting = await metric(session, url, "latlab_num_requests_waiting")
        if running == waiting == 0:
            break
        await asyncio.sleep(0.1)
    return await metric(session, url, "latlab_kv_cache_used_blocks")


async def half_sent_bodies(url: str, count: int) -> Counter:
    host, port = url.removeprefix("http://").split(":")

    async def one() -> str:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b'application/json\r\nContent-Length: 4000000\r\n\r\n{"prompt": "')
        await writer.drain()
        try:
            head = await asyncio.wait_for(reader.readline(), BODY_TIMEOUT_S + 30)
            return head.split(b" ")[1].decode() if head else "closed"
        except TimeoutError:
            return "still open"
        finally:
            writer.close()

    return Counter(await asyncio.gather(*(one() for _ in range(count))))


async def measure(url: str, pid: int, quick: bool) -> None:
    process = psutil.Process(pid)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        rss_before = process.memory_info().rss
        rate = await capacity(session, url, 5 if quick else 10)
        print(f"capacity: {rate:.1f} req/s ({MAX_NUM_SEQS} closed-loop clients, "
              f"{WORK['max_tokens']} tokens each)", flush=True)
        result = await overload(session, url, 3 * rate, 10 if quick else 30)
        rss_after = process.memory_info().rss
        print(f"overload at 3x ({3 * rate:.1f} req/s asked, {result['sent_rate']:.1f} "
              f"sent): statuses {result['statuses']}, "
              f"429s without Retry-After {result['without_retry_after']}, Retry-After "
              f"{result['retry_after']} s (min, max), peak waiting "
              f"{result['peak_waiting']:.0f} (--max-waiting {MAX_WAITING}), RSS "
              f"{rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB "
              f"({(rss_after - rss_before) / 2**20:+.1f})", flush=True)
        count = 200 if quick else 2000
        await aborted_streams(session, url, count)
        print(f"aborted streams: {count}, KV blocks still held once idle: "
              f"{await idle_blocks(session, url):.0f}", flush=True)
        if not quick:
            ends = await half_sent_bodies(url, 3 * MAX_WAITING)
            print(f"half-sent bodies: {3 * MAX_WAITING}, answers {dict(ends)} (408 after "
                  f"{BODY_TIMEOUT_S} s)", flush=True)
        async with session.get(url + "/health") as r:
            print(f"health afterwards: {r.status} {await r.text()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases, shorter runs")
    parser.add_argument("--examples", type=int, default=None,
                        help="schemathesis examples per operation and phase (default 200, 50 "
                             "with --quick)")
    args = parser.parse_args()
    examples = args.examples or (50 if args.quick else 200)
    server, url = start_server(FUZZ_SERVE)
    try:
        started = time.perf_counter()
        run = check_all(url, examples, timeout_s=3600)
        cases = next((line.strip() for line in run.stdout.splitlines()
                      if "generated" in line), "no case count")
        print(f"fuzzing: schemathesis with every check, up to {examples} examples per "
              f"operation and phase, in {time.perf_counter() - started:.0f} s: {cases}; "
              f"{'no issues' if run.returncode == 0 else 'FAILURES'}", flush=True)
        if run.returncode != 0:
            print(run.stdout[-6000:])
        health = urllib.request.urlopen(url + "/health", timeout=30).read().decode()
        print(f"health after fuzzing: {health}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    server, url = start_server(LOAD_SERVE)
    try:
        asyncio.run(measure(url, server.pid, args.quick))
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
