"""The clients `client.py` compares, each against the local servers: latlab's (`latlab_run`,
with the garbage collector on as before: `collector_on`), a minimal aiohttp + uvloop loop, and
AIPerf; and their raw speed on zero-delay streams."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import numpy as np
import orjson
from client_errors import added_errors
from client_servers import Servers


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
