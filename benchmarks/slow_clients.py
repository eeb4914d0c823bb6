"""Do 1,100 stalled clients disturb real traffic? The slow-client figures of
docs/performance/reliability.md, side by side in one run.

    python benchmarks/slow_clients.py                # about five minutes
    python benchmarks/slow_clients.py --stalled 200 --seconds 15 --rounds 1   # a short one

`latlab serve --model tiny` (its defaults: --header-timeout 5, --body-timeout 5, --min-rate
1024, --max-reading 2048, --max-connections 4096) on 127.0.0.1:
(1) capacity: what `latlab bench` gets done with 32 closed-loop users;
(2) undisturbed: `latlab bench` at half of that rate, open loop: its p99 TTFT;
(3) the same beside N stalled clients (1,100 by default), half of them sending half their
    headers, half their headers and half a body, then nothing, from 11 other loopback
    addresses (127.0.0.2 to .12); each one closed by the server connects and stalls again,
    so N stay stalled throughout, from 20 s before the real traffic starts. Beside the real
    traffic's p99 TTFT (its ratio to (2)): how long a stalled socket stayed open after its last byte
    (p50, p99, max), how the server ended them (408, 503, reset), the server's RSS over the run
    (start, peak, end) and its CPU (beside the undisturbed run's: what the stalled clients cost it).
(2) and (3) alternate for --rounds rounds; the p99s compared are the medians.
The stalled clients run in their own process, so they take no time from the measuring
client's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil

SERVE = ["--model", "tiny", "--max-model-len", "512"]
WORKLOAD = ["--prompt-tokens", "64", "--output-tokens", "32"]
ADDRESSES = [f"127.0.0.{i}" for i in range(2, 13)]
# The stalled clients run this long before the real traffic: past their first few rounds,
# which all start together, to the steady state of a long attack.
LEAD_S = 20.0
HEADERS = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
BODY = (HEADERS + b"Content-Length: 2000\r\n\r\n" + b'{"prompt": "' + b"x" * 988)


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "latlab", "serve", *SERVE, "--port",
                                str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = process.stdout.readline()
    if not line.startswith("latlab serve: ready"):
        process.kill()
        sys.exit(f"slow_clients: latlab serve did not start: {line.strip()}")
    return process, f"http://127.0.0.1:{port}"


def bench(url: str, out: Path, *args: str, server: int | None = None) -> dict:
    """`latlab bench` against `url`: its summary.json, with the CPU the `server` process
    used meanwhile (`server_cores`: its CPU seconds over the wall-clock seconds)."""
    cpu = psutil.Process(server).cpu_times() if server else None
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "latlab", "bench", "--url", url, *WORKLOAD,
                          *args, "--out", str(out), "--json"], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"slow_clients: latlab bench failed: {run.stderr[-2000:]}")
    summary = json.loads(run.stdout)
    if cpu is not None:
        now = psutil.Process(server).cpu_times()
        summary["server_cores"] = ((now.user + now.system - cpu.user - cpu.system)
                                   / (time.monotonic() - started))
    return summary


def stall_forever(port: int, count: int, stop: mp.Event, results: mp.Queue) -> None:
    """`count` stalled clients until `stop`: each sends its half, waits for the server to
    end the connection, then connects again. Puts (seconds open after the last byte, how it
    ended) for each ending."""
    async def client(i: int) -> None:
        data = HEADERS if i % 2 else BODY
        source = (ADDRESSES[i % len(ADDRESSES)], 0)
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                               local_addr=source)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            try:
                writer.write(data)
                await writer.drain()
                sent = time.monotonic()
                head = await reader.read(64)
                how = head.split(b" ")[1].decode() if head else "closed"
                while await reader.read(4096):
                    pass
            except (ConnectionError, asyncio.IncompleteReadError):
                how = "reset"
            finally:
                writer.close()
            if not stop.is_set():
                results.put((time.monotonic() - sent, how))

    async def main() -> None:
        tasks = [asyncio.create_task(client(i)) for i in range(count)]
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def sample_rss(pid: int, stop: threading.Event, series: list[float]) -> None:
    process = psutil.Process(pid)
    while not stop.is_set():
        series.append(process.memory_info().rss / 2**20)
        stop.wait(1.0)


def p99_ttft(summary: dict) -> float:
    return summary["latency"]["ttft"]["percentiles"]["p99"]["value"]


def attacked(url: str, pid: int, out: Path, real: list[str], stalled: int
             ) -> tuple[dict, list[tuple[float, str]], list[float], float]:
    """`latlab bench` beside `stalled` stalled clients: its summary, how each stalled socket
    ended, the server's (`pid`) RSS each second, the load average at its end."""
    port = int(url.rsplit(":", 1)[1])
    stop, results = mp.Event(), mp.Queue()
    stallers = mp.Process(target=stall_forever, args=(port, stalled, stop, results))
    rss: list[float] = []
    sampling = threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(pid, sampling, rss))
    sampler.start()
    stallers.start()
    time.sleep(LEAD_S)
    summary = bench(url, out, *real, server=pid)
    load = os.getloadavg()[0]
    stop.set()
    ends = []
    deadline = time.monotonic() + 30
    while stallers.is_alive() and time.monotonic() < deadline:
        while not results.empty():
            ends.append(results.get())
        time.sleep(0.1)
    stallers.join(5)
    while not results.empty():
        ends.append(results.get())
    sampling.set()
    sampler.join()
    return summary, ends, rss, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stalled", type=int, default=1100)
    parser.add_argument("--seconds", type=float, default=30.0, help="of each measured run")
    parser.add_argument("--rounds", type=int, default=2, help="undisturbed and attacked runs, "
                        "alternating (the machine's other work lands on both alike)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep the run folders there (default: a temporary folder)")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    server, url = start_server()
    calm_p99, attacked_p99, ends, rss = [], [], [], []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            out = args.keep or scratch
            capacity = bench(url, Path(out), "--users", "32", "--duration", "15")
            rate = capacity["throughput"]["achieved_rate"] / 2
            print(f"capacity: {2 * rate:.1f} req/s (32 closed-loop users); real traffic at "
                  f"{rate:.1f} req/s, open loop, {args.seconds:g} s per run", flush=True)
            real = ["--rate", f"{rate:.2f}", "--duration", f"{args.seconds:g}"]
            for round in range(1, args.rounds + 1):
                calm = bench(url, Path(out), *real, server=server.pid)
                calm_p99.append(p99_ttft(calm))
                print(f"round {round} undisturbed: p99 TTFT {calm_p99[-1]:.1f} ms, "
                      f"{calm['ok']} ok, failures {calm['failures'] or 0}, server CPU "
                      f"{calm['server_cores']:.2f} cores, load average "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
                summary, round_ends, round_rss, load = attacked(url, server.pid, Path(out),
                                                                real, args.stalled)
                attacked_p99.append(p99_ttft(summary))
                ends += round_ends
                rss += round_rss
                print(f"round {round} beside {args.stalled} stalled clients: p99 TTFT "
                      f"{attacked_p99[-1]:.1f} ms, {summary['ok']} ok, failures "
                      f"{summary['failures'] or 0}, server CPU {summary['server_cores']:.2f} "
                      f"cores, load average {load:.2f}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    calm_median, attacked_median = np.median(calm_p99), np.median(attacked_p99)
    print(f"p99 TTFT, median of {args.rounds} rounds: undisturbed {calm_median:.1f} ms, beside "
          f"{args.stalled} stalled clients {attacked_median:.1f} ms "
          f"({attacked_median / calm_median:.2f}x)")
    open_s = np.array([s for s, _ in ends])
    print(f"stalled sockets: {len(ends)} ended by the server, open after their last byte "
          f"p50 {np.percentile(open_s, 50):.1f} s, p99 {np.percentile(open_s, 99):.1f} s, "
          f"max {open_s.max():.1f} s; how: {dict(Counter(how for _, how in ends))}")
    print(f"server RSS while attacked: first {rss[0]:.0f} MiB, peak {max(rss):.0f}, "
          f"last {rss[-1]:.0f}")


if __name__ == "__main__":
    main()
