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
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from client_errors import ADDED
from client_runs import (
    aiperf_paced,
    collector_on,
    gc_pauses,
    latlab_run,
    minimal_run,
    parse_ns,
    raw_speed,
)
from client_servers import INTERVAL_S, Servers


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
    main()
