"""The stall metric through a gateway: does each stream's longest pause (mean ITL per-request
max, what the decode_stalls advice is decided on) survive the hop, and does an A/B of the
advice's setting through the gateway point the way it does directly?

    python benchmarks/gateway_stalls.py --gateway nginx --case hop
    python benchmarks/gateway_stalls.py --gateway litellm --case setting

* `hop`: one llama-server (`-np 4`); `latlab ab` of the server directly (A) against the same
  server through the gateway (B), decided on the longest pause: what the gateway adds.
* `setting`: two llama-servers, `-np 4` and `-np 4 -b 512 -ub 512` (the advice's), each
  behind its own gateway; `latlab ab` of one gateway against the other.

Gateways: `nginx` (proxy_buffering off), `nginx-buffered` (proxy_buffering on, the server's
X-Accel-Buffering: no ignored), `nginx-gzip` (buffering on and event streams gzipped),
`litellm` (its proxy, one worker). tests/gateways.py starts them; every process is stopped
by its PID.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
from gateways import LITELLM_KEY, litellm_proxy, nginx_proxy  # noqa: E402

from latlab.commands.common import console  # noqa: E402
from latlab.load.target.launch import ServerLaunch, free_port, launched  # noqa: E402
from latlab.records.ab import ABConfig  # noqa: E402
from latlab.records.bench import BenchConfig  # noqa: E402
from latlab.services.ab import compare_sides, run_ab  # noqa: E402

KEY = "mean_itl_max"
LLAMA = "/work/build/llama-server"


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


@contextmanager
def llama(args: argparse.Namespace, extra: str, folder: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [args.llama_server, "-m", args.model, "-t", "1", "-c", "8192", "--host",
               "127.0.0.1", "--port", str(port), "--metrics", *extra.split()]
    with launched(ServerLaunch(tuple(command), url, f"{url}/health", "llama-server"),
                  log_path=folder / f"llama-{port}.log"):
        yield url


@contextmanager
def gateway(kind: str, url: str, folder: Path) -> Iterator[str]:
    if kind == "litellm":
        with litellm_proxy(url, folder) as through:
            yield through
        return
    with nginx_proxy(url, folder, buffering=kind != "nginx", gzip=kind == "nginx-gzip") as (
            plain, _, _):
        yield plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", choices=("nginx", "nginx-buffered", "nginx-gzip",
                                              "litellm"), default="nginx")
    parser.add_argument("--case", choices=("hop", "setting"), default="hop")
    parser.add_argument("--llama-server", default=LLAMA)
    parser.add_argument("--model", required=True, help="a GGUF model (latlab model export)")
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("runs"))
    args = parser.parse_args()
    started, before = time.monotonic(), load()
    folder = Path(tempfile.mkdtemp(prefix="gateway-stalls-"))
    with ExitStack() as stack:
        start = stack.enter_context(llama(args, "-np 4", folder))
        if args.case == "hop":
            a = start
            b = stack.enter_context(gateway(args.gateway, start, folder / "b"))
        else:
            other = stack.enter_context(llama(args, "-np 4 -b 512 -ub 512", folder))
            a = stack.enter_context(gateway(args.gateway, start, folder / "a"))
            b = stack.enter_context(gateway(args.gateway, other, folder / "b"))
        bench = BenchConfig.model_validate({
            "duration_s": args.duration, "out": args.out, "arrivals": {"users": 4},
            "workload": {"prompt_tokens": "1024", "output_tokens": "fixed:64"},
            "api_key": LITELLM_KEY if args.gateway == "litellm" else None,
            "model": "default" if args.gateway == "litellm" else None})
        config = ABConfig(a=a, b=b, rounds=args.rounds, max_rounds=args.max_rounds,
                          bench=bench, decide_on=(KEY,))
        done = run_ab(config, console(stderr=True))
        comparison = compare_sides(done)
    print(f"{args.case} through {args.gateway}: A {a}, B {b}; {done.folder}")
    for key in (KEY, "p99_itl", "p50_ttft", "p99_ttft", "p50_tpot", "p99_e2e",
                "output_tokens_per_s"):
        c = comparison.change(key)
        if c is None:
            continue
        span = (f" [{100 * c.interval.low:+.0f}%, {100 * c.interval.high:+.0f}%] at "
                f"{100 * c.interval.confidence:.3g}%") if c.interval else ""
        a_, b_ = ("–" if v is None else f"{v:,.1f}" for v in (c.a, c.b))
        decided = done.sequential.decided_at(key)
        print(f"  {c.label}: {a_} → {b_}{span}: {c.verdict}"
              + (f" (round {decided})" if decided else "") + (f" ({c.why})" if c.why else ""))
    for line in comparison.conditions:
        print(f"  condition: {line}")
    rounds = min(len(done.analyses[s]) for s in ("A", "B"))
    print(f"  {rounds} rounds a side; {time.monotonic() - started:.0f} s; load {before} "
          f"before, {load()} after")


if __name__ == "__main__":
    main()
