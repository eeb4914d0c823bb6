"""Is a gateway's own time recovered? `latlab serve` measured directly and through gateways.

    python benchmarks/gateway_hop.py                      # every gateway installed
    python benchmarks/gateway_hop.py --requests 30 --rate 1 --repeats 2

Starts `latlab serve` exporting its spans to a port each bench listens on (--otlp-port), then
runs the same open-loop workload against it directly and through each gateway, in turn
(`--repeats` rounds, the order rotated each round):

* `delay 20 ms`: benchmarks/delay_proxy.py holding every byte 20 ms each way, a gateway whose
  added delay is known: its intake and its tail should each come out at 20 ms (goal: within
  max(5 %, 2 ms));
* LiteLLM's proxy (tests/gateways.py starts it: its own venv, a master key, no outside call);
* nginx as a plain and as a TLS-terminating reverse proxy (a self-signed certificate).

For each it prints the mean request's time to first token split across the hop (gateway
intake + engine TTFT + forwarding), the gateway's tail after the engine finished, how many
requests joined their engine span and by what, and what the gateway added against the direct
runs: the intake, forwarding and tail around the engine's spans (a direct run has its own:
HTTP and loopback; the delay proxy's should each be the 20 ms it holds bytes), and the E2E,
whose difference also holds the engine's own variation between runs (printed beside it). The
1-minute load average is printed before each run. Every process it starts is stopped by its
PID.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]
from gateways import (  # noqa: E402
    LITELLM_KEY,
    litellm_binary,
    litellm_proxy,
    nginx_binary,
    nginx_proxy,
    openssl_binary,
)

from latlab.load.target.launch import ServerLaunch, embedded_engine, free_port, launched  # noqa: E402
from latlab.load.telemetry.otlp import read_spans  # noqa: E402
from latlab.load.telemetry.spans import is_model_span  # noqa: E402
from latlab.load.telemetry.upstream import join, with_hop  # noqa: E402
from latlab.records.arrivals import ArrivalConfig  # noqa: E402
from latlab.records.bench import BenchConfig  # noqa: E402
from latlab.records.folder import RunFolder  # noqa: E402
from latlab.records.lengths import LengthDistribution  # noqa: E402
from latlab.records.spans import SPANS  # noqa: E402
from latlab.records.timeline import ServerTiming  # noqa: E402
from latlab.records.workload import WorkloadConfig  # noqa: E402
from latlab.services.bench import run_bench  # noqa: E402

DELAY_MS = 20.0
WIRE = "wire.jsonl"  # the delay proxy's timestamps of every chunk
WIRE_SLACK_NS = 100_000_000  # a request's bytes reach the proxy within this of `sent`


@dataclass
class Side:
    name: str
    url: str
    options: dict
    expected_ms: float | None = None  # a known added delay each way


@dataclass
class Result:
    e2e_ms: float
    ttft_ms: float
    engine_ms: float  # the engine's own E2E (its span)
    outside_ms: float  # E2E less the engine's: the network and whatever is in between
    joined: str
    hop: object | None
    prefill_coverage: float
    load: float
    around: dict[str, float]  # mean intake, forward, tail around the engine (any side)
    wire: dict[str, float]  # what the delay proxy's timestamps say it added


@contextmanager
def delay_proxy(engine_url: str, delay_ms: float, folder: Path) -> Iterator[str]:
    """benchmarks/delay_proxy.py in a process of its own (in the load generator's it would
    share its interpreter)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = (sys.executable, str(ROOT / "benchmarks" / "delay_proxy.py"), "--listen",
               str(port), "--target", engine_url.removeprefix("http://"), "--delay-ms",
               f"{delay_ms:g}", "--wire", str(folder / WIRE))
    with launched(ServerLaunch(command, url, f"{url}/v1/models", "delay proxy"),
                  log_path=folder / "delay_proxy.log"):
        yield url


def on_the_wire(run: RunFolder, wire: Path) -> dict[str, float]:
    """What the delay proxy's own timestamps say it added to `run`'s requests (means, ms):
    intake, from the client's send to the proxy writing the request on to the engine; tail,
    from the proxy reading the answer's last bytes to the client's end."""
    chunks = [json.loads(line) for line in wire.read_text().splitlines() if line.strip()]
    up = sorted((c for c in chunks if c["direction"] == "up"), key=lambda c: c["read_ns"])
    down = sorted((c for c in chunks if c["direction"] == "down"), key=lambda c: c["written_ns"])
    intake, tail = [], []
    for r in run.read_records(raw=True):
        if not r.ok:
            continue
        first = next((c for c in up if r.sent_ns <= c["read_ns"] <= r.sent_ns + WIRE_SLACK_NS),
                     None)
        last = [c for c in down if r.done_ns - WIRE_SLACK_NS <= c["written_ns"] <= r.done_ns]
        if first is not None and last:
            intake.append((first["written_ns"] - r.sent_ns) / 1e6)
            tail.append((r.done_ns - last[-1]["read_ns"]) / 1e6)
    return {"intake": float(np.mean(intake)), "tail": float(np.mean(tail)),
            "requests": len(intake)} if intake else {}


def hop_of(run: RunFolder) -> dict[str, float]:
    """The mean intake, forwarding and tail around the engine's spans of `run`'s requests,
    whatever answered them (a direct run's too: its HTTP and network around the engine)."""
    records = [r for r in run.read_records(raw=True) if r.ok]
    clock = run.read_config().clock
    anchor = int(clock.unix_time * 1e9) - clock.perf_counter_ns
    found = join(records, read_spans(run.path / SPANS), anchor)
    parts: dict[str, list[float]] = {"intake": [], "forward": [], "tail": []}
    for r in records:
        engine = next((s for s in found[r.id].spans if is_model_span(s)), None) \
            if r.id in found else None
        if engine is None:
            continue
        timing = with_hop(ServerTiming(), r, engine, anchor)
        for name in parts:
            parts[name].append(getattr(timing, f"gateway_{name}"))
    return {name: float(np.mean(v)) for name, v in parts.items() if v}


def measure(side: Side, engine_url: str, otlp: int, out: Path, args: argparse.Namespace
            ) -> Result:
    load = os.getloadavg()[0]
    workload = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=args.prompt),
                              output_tokens=LengthDistribution(kind="fixed", a=args.output))
    direct = side.url == engine_url
    result = run_bench(BenchConfig(
        url=side.url, server_url=None if direct else engine_url, otlp_port=otlp,
        requests=args.requests, workload=workload, span_wait_s=5, out=out,
        arrivals=ArrivalConfig(process="poisson", rate=args.rate, seed=args.seed),
        **side.options))
    a = result.analysis
    t, ok = a.table, a.ok
    e2e = (t.done_ns[ok] - t.sent_ns[ok]) / 1e6
    ttft = (t.first_token_ns[ok] - t.sent_ns[ok]) / 1e6
    engine = t.server["total"][ok]
    timed = ~np.isnan(engine)
    spans = result.summary.spans
    joined = (f"{spans.requests_joined}/{int(ok.sum())} by "
              + ", ".join(f"{k} {v}" for k, v in spans.joined_by.items())) if spans else "none"
    return Result(float(e2e.mean()), float(ttft.mean()), float(engine[timed].mean()),
                  float((e2e[timed] - engine[timed]).mean()), joined, a.hop,
                  a.mean.coverage.get("prefill", 0.0), load, hop_of(result.run),
                  on_the_wire(result.run, out / WIRE) if side.expected_ms else {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--rate", type=float, default=1.0, help="requests/s (Poisson)")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--output", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve-args", default="--model tiny")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="latlab-gateways-"))
    otlp = free_port()
    serve = [*args.serve_args.split(), "--otlp-endpoint", f"http://127.0.0.1:{otlp}/v1/traces"]
    results: dict[str, list[Result]] = {}
    with ExitStack() as stack:
        engine = stack.enter_context(embedded_engine(serve, log_path=out / "serve.log"))
        sides = [Side("direct", engine.url, {}),
                 Side(f"delay {DELAY_MS:g} ms", stack.enter_context(
                     delay_proxy(engine.url, DELAY_MS, out)), {}, DELAY_MS)]
        model = args.serve_args.split("--model")[-1].split()[0] if "--model" in args.serve_args \
            else "default"
        if litellm_binary() is not None:
            url = stack.enter_context(litellm_proxy(engine.url, out / "litellm", model=model))
            sides.append(Side("LiteLLM", url, {"model": model, "api_key": LITELLM_KEY}))
        else:
            print("LiteLLM is not installed: left out")
        if nginx_binary() is not None and openssl_binary() is not None:
            plain, tls, cert = stack.enter_context(nginx_proxy(engine.url, out / "nginx"))
            sides += [Side("nginx", plain, {}), Side("nginx TLS", tls, {"ca_cert": cert})]
        else:
            print("nginx or openssl is not installed: left out")
        for round_ in range(args.repeats):
            turn = round_ % len(sides)
            for side in sides[turn:] + sides[:turn]:
                r = measure(side, engine.url, otlp, out, args)
                results.setdefault(side.name, []).append(r)
                print(f"round {round_ + 1}: {side.name:<12} load {r.load:.1f}  "
                      f"E2E {r.e2e_ms:.1f} ms  joined {r.joined}", flush=True)
    report(results, {s.name: s.expected_ms for s in sides})
    print(f"run folders: {out}")


def report(results: dict[str, list[Result]], expected: dict[str, float | None]) -> None:
    """Each gateway's hop, and what it added against the direct runs: the intake, the
    forwarding and the tail around the engine's spans (a direct run has its own: HTTP and
    loopback), and the E2E, whose difference also holds the engine's own variation."""
    direct = results["direct"]
    base = {k: float(np.mean([r.around[k] for r in direct])) for k in direct[0].around}
    base_e2e = float(np.mean([r.e2e_ms for r in direct]))
    base_engine = float(np.mean([r.engine_ms for r in direct]))
    print(f"\ndirect ({len(direct)} runs; load {', '.join(f'{r.load:.1f}' for r in direct)}): "
          f"E2E {base_e2e:.1f} ms, the engine's own {base_engine:.1f} ms; around the engine: "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in base.items()))
    for name, runs in results.items():
        if name == "direct":
            continue
        print(f"\n{name} ({len(runs)} runs; load {', '.join(f'{r.load:.1f}' for r in runs)})")
        for r in runs:
            h = r.hop
            if h is None:
                print(f"  no hop: joined {r.joined}")
                continue
            print(f"  TTFT {h.client_ttft_ms:.1f} = intake {h.intake_ms:.1f} + engine "
                  f"{h.engine_ttft_ms:.1f} + forwarding {h.forward_ms:.1f}; tail {h.tail_ms:.1f}"
                  f"; joined {r.joined}; prefill for {100 * r.prefill_coverage:.0f}%")
            added = {k: r.around[k] - base[k] for k in base}
            print(f"  against direct: E2E {r.e2e_ms - base_e2e:+.1f} ms (the engine's own "
                  f"{r.engine_ms - base_engine:+.1f} of it); the hop added intake "
                  f"{added['intake']:+.2f}, forwarding {added['forward']:+.2f}, tail "
                  f"{added['tail']:+.2f} ms")
            if r.wire:
                for part in ("intake", "tail"):
                    wire = r.wire[part]
                    error = added[part] - wire
                    within = abs(error) <= max(0.05 * wire, 2.0)
                    print(f"  {part}: the hop says +{added[part]:.2f} ms, the proxy's wire "
                          f"timestamps {wire:.2f} ms ({r.wire['requests']} requests; the "
                          f"{expected[name]:g} ms it holds bytes and its own scheduling): "
                          f"{error:+.2f} ms, {'within' if within else 'NOT within'} "
                          "max(5 %, 2 ms)")


if __name__ == "__main__":
    main()
