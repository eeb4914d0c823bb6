"""Is an injected network delay recovered in the network component, request by request?

    python benchmarks/network_delay.py                       # latlab serve (tiny)
    python benchmarks/network_delay.py --llama-server BIN --gguf MODEL.gguf   # and llama.cpp

For each target, runs the same small closed-loop bench directly and through
`delay_proxy.py` adding D ms each way (D = 20, 50): the extra round trip is 2·D. Prints, per
delay, how far each request's network component moved against the direct run's median
(goal: every request within max(5 %, 1 ms) of 2·D), and where the rest of the time went.
latlab serve reports a total, so the network is the transit beyond it; llama.cpp does not,
so the network is the round trip of a null request measured before the run.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from delay_proxy import DelayProxy  # noqa: E402

from latlab.load.target.launch import embedded_engine, responds_ok  # noqa: E402
from latlab.records.arrivals import ArrivalConfig
from latlab.records.config import BenchConfig  # noqa: E402
from latlab.records.lengths import LengthDistribution
from latlab.records.workload import WorkloadConfig  # noqa: E402
from latlab.services.bench import run_bench  # noqa: E402

DELAYS_MS = (20.0, 50.0)
WORKLOAD = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=64),
                          output_tokens=LengthDistribution(kind="fixed", a=16))


class ProxyThread:
    def __init__(self, port: int, delay_ms: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxy = DelayProxy("127.0.0.1", port, delay_ms / 1000)
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.port = asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def network_per_request(url: str, out: Path, requests: int) -> tuple[np.ndarray, dict]:
    result = run_bench(BenchConfig(url=url, workload=WORKLOAD, requests=requests,
                                   duration_s=None, out=out, arrivals=ArrivalConfig(users=2)))
    rows = result.analysis.decomposed
    network = np.array([r.parts.ms("network") for r in rows])
    buckets = {b: v for b, v in result.analysis.mean.buckets().items()}
    return network, buckets


def measure(name: str, port: int, out: Path, requests: int) -> None:
    base, _ = network_per_request(f"http://127.0.0.1:{port}", out, requests)
    print(f"\n{name}: direct network median {np.median(base):.2f} ms ({len(base)} requests)")
    print(f"{'delay':>8} {'expected':>9} {'median':>8} {'max err':>8} {'within':>8}  rest of "
          "the mean E2E (ms)")
    for delay in DELAYS_MS:
        proxy = ProxyThread(port, delay)
        try:
            network, buckets = network_per_request(f"http://127.0.0.1:{proxy.port}", out,
                                                   requests)
        finally:
            proxy.stop()
        expected = 2 * delay
        moved = network - np.median(base)
        error = np.abs(moved - expected)
        ok = error <= np.maximum(0.05 * expected, 1.0)
        rest = " ".join(f"{b} {v:.1f}" for b, v in buckets.items() if b != "network")
        print(f"{delay:>6g}ms {expected:>7g}ms {np.median(moved):>6.2f}ms "
              f"{error.max():>6.2f}ms {ok.sum():>3}/{len(ok):<4}  {rest}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    parser.add_argument("--gguf", type=Path, help="the model for llama-server")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="latlab-netdelay-"))
    with embedded_engine(["--model", "tiny"]) as engine:
        measure("latlab serve (tiny)", int(engine.url.rsplit(":", 1)[1]), out, args.requests)
    if args.llama_server and args.gguf:
        port = 18291
        server = subprocess.Popen([str(args.llama_server), "-m", str(args.gguf), "--host",
                                   "127.0.0.1", "--port", str(port), "-t", "1", "-np", "2"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not responds_ok(f"http://127.0.0.1:{port}/health"):
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("llama-server did not start")
                time.sleep(0.2)
            measure("llama.cpp llama-server", port, out, args.requests)
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
