"""Real traffic: slices of two public production traces replayed against `latlab serve
--enable-prefix-caching`, measured against what the trace asked for, and predicted; and a
million-row trace read through with bounded memory.

    python benchmarks/trace_replay.py                   # about 10 minutes on 2 busy cores
    python benchmarks/trace_replay.py --llama-server /work/build/llama-server   # and llama.cpp
    python benchmarks/trace_replay.py --stream-only     # the million-row read alone

1. Stream: a generated Mooncake-format trace of --rows rows (hash ids, 1,000 to 30,000-token
   prompts) read through latlab's reader in a fresh process: rows per second and the
   process's peak RSS, against a tenth of the rows.
2. Replay each slice (`latlab bench --trace`, the embedded engine with --enable-prefix-caching,
   default preset): the Mooncake FAST'25 synthetic trace's first rows and the Azure 2023
   conversation trace's (tests/fixtures/traces/, real rows), each at a --length-scale and
   --trace-speed that a 2-core CPU serves. Measured against the trace:
   - prompt lengths: Pearson correlation of the server's prompt tokens (its usage) with the
     trace's lengths × scale, and the largest difference;
   - arrivals: the schedule against the trace's times (÷ speed); each request's send time
     against them (p50, p95, max), of which the connection's setup (a busy server accepts
     late) and the client's own delay (client wait: the rest);
   - the cached share (the server's cached prompt tokens over all) against what the trace's
     shared blocks allow: an unbounded prefix cache of the engine's 16-token blocks, a
     request's cached prefix its leading blocks seen in earlier requests (less its last
     token, which is always computed).
3. Predict the same slice (`latlab predict --trace`, latlab's engine calibrated with the same
   serve arguments, from the cache when it has one): measured and predicted p50 and p99 of
   TTFT and E2E, and the mean budget (queue & overhead, prefill, decode), side by side.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import orjson
from rich.console import Console

from latlab.analysis import analyze
from latlab.commands.options import parse_args
from latlab.load.target.launch import ServerLaunch, free_port, start_server
from latlab.load.workload.traces import BLOCK_TOKENS, replay_window, scaled
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.engine import ServeConfig
from latlab.records.folder import RunFolder
from latlab.records.predict import CalibrationSource
from latlab.records.simulation import Fleet
from latlab.services.bench import run_bench
from latlab.services.predict import predict_point, resolve_calibration, settings
from latlab.sim.workload import build

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "traces"
ENGINE_BLOCK = 16  # latlab serve's KV block (tokens)
SERVE = ["--enable-prefix-caching", "--max-model-len", "4096"]  # the preset's positions
SLICES = {  # name: trace, --length-scale, --trace-speed, --duration (s of replay)
    "mooncake": (FIXTURES / "mooncake.jsonl", 1 / 32, 0.25, 120.0),
    "azure": (FIXTURES / "azure_conv.csv", 0.25, 0.5, 90.0),
}


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + \
        f" on {os.cpu_count()} cores"


def stream(rows: int, folder: Path) -> None:
    """Write the trace, then read it in a child process (its own peak RSS), twice: all of it
    and a tenth of it."""
    path = folder / "big.jsonl"
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        t, next_id = 0.0, 0
        for _ in range(rows):
            t += rng.exponential(20.0)
            tokens = int(rng.integers(1_000, 30_000))
            blocks = -(-tokens // BLOCK_TOKENS)
            shared = min(blocks, int(rng.integers(0, 8)))
            ids = list(range(shared)) + list(range(next_id + 8, next_id + 8 + blocks - shared))
            next_id += blocks
            f.write(orjson.dumps({"timestamp": round(t), "input_length": tokens,
                                  "output_length": int(rng.integers(1, 800)),
                                  "hash_ids": ids}) + b"\n")
    print(f"\n1. streaming a {rows:,}-row Mooncake-format trace "
          f"({path.stat().st_size / 2**20:,.0f} MiB) · {load()}")
    for n in (rows // 10, rows):
        out = subprocess.run([sys.executable, __file__, "--read", str(path), str(n)],
                             capture_output=True, text=True, check=True).stdout
        print("   " + out.strip())


def read(path: Path, n: int) -> None:
    """(child process) Read the first `n` rows; print rows/s and the memory it took: the
    process's peak RSS over what it held before reading."""
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    count = sum(1 for _ in replay_window(ArrivalConfig(trace=path), requests=n)[1])
    wall = time.perf_counter() - start
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    print(f"{count:>9,} rows in {wall:5.1f} s ({count / wall:,.0f} rows/s) · peak RSS "
          f"{rss:.1f} MiB over the {base / 1024:.0f} MiB before reading")


def allowed_share(arrivals: ArrivalConfig, duration_s: float) -> tuple[float, float]:
    """What the trace's shared blocks allow: cached tokens over prompt tokens for an
    unbounded cache at the trace's block size, and at the engine's (whole 16-token blocks,
    a request's last token always computed)."""
    seen: set[int] = set()
    block = scaled(BLOCK_TOKENS, arrivals.length_scale)
    prompt = trace_blocks = engine_blocks = 0
    for replayed in replay_window(arrivals, duration_s)[1]:
        row = replayed.row
        tokens = scaled(row.prompt_tokens, arrivals.length_scale)
        ids = row.hash_ids or []
        depth = 0
        while depth < len(ids) and ids[depth] in seen:
            depth += 1
        hit = min(depth * block, tokens)
        prompt += tokens
        trace_blocks += hit
        engine_blocks += min(hit, tokens - 1) // ENGINE_BLOCK * ENGINE_BLOCK
        seen.update(ids)
    return trace_blocks / prompt, engine_blocks / prompt


def replay_slice(name: str, folder: Path, url: str, server: str | None = None) -> Path:
    trace, scale, speed, duration = SLICES[name]
    arrivals = ArrivalConfig(trace=trace, length_scale=scale, trace_speed=speed)
    target = server or "latlab serve " + " ".join(SERVE)
    print(f"\n2. replaying {trace.name}: --length-scale {scale:g} --trace-speed {speed:g} "
          f"--duration {duration:g} against {target} · client priority "
          f"{os.getpriority(os.PRIO_PROCESS, 0)} · {load()}")
    config = BenchConfig(url=url, arrivals=arrivals, duration_s=duration, drain_s=120.0,
                         out=folder, name=f"{name}-{server or 'latlab'}")
    result = run_bench(config, console=Console(stderr=True))
    run = result.run
    t0 = run.read_config().clock.t0_ns
    records = [r for r in run.read_records() if r.trace is not None]
    asked = np.array([scaled(r.trace.prompt_tokens, scale) for r in records])
    got = np.array([r.prompt_tokens if r.prompt_tokens is not None else np.nan
                    for r in records], dtype=float)
    known = ~np.isnan(got)
    sent = [r for r in records if r.sent_ns is not None]
    error_ms = np.abs(np.array([(r.sent_ns - t0) / 1e6 - r.trace.time_s * 1e3 / speed
                                for r in sent]))
    schedule_ms = np.abs(np.array([(r.scheduled_ns - t0) / 1e6 - r.trace.time_s * 1e3 / speed
                                   for r in sent]))
    setup_ms = np.array([r.connection.setup_ns / 1e6 if r.connection else 0.0 for r in sent])
    cached = sum(r.cached_tokens or 0 for r in records if r.ok)
    prompts = sum(r.prompt_tokens or 0 for r in records if r.ok)
    trace_share, engine_share = allowed_share(arrivals, duration)
    ok = sum(r.ok for r in records)
    print(f"   {len(records)} requests ({ok} ok) · run folder {run.path}")
    print(f"   prompt lengths: correlation {np.corrcoef(asked[known], got[known])[0, 1]:.4f} "
          f"over {known.sum()} requests, largest difference "
          f"{int(np.max(np.abs(asked[known] - got[known]))) if known.any() else '–'} tokens")
    wait_ms = error_ms - setup_ms  # the client's own delay: what connecting leaves
    print(f"   the schedule against the trace: max {schedule_ms.max():.3f} ms")
    print(f"   sends against the trace: p50 {np.percentile(error_ms, 50):.2f} ms · p95 "
          f"{np.percentile(error_ms, 95):.2f} ms · max {error_ms.max():.2f} ms, of which "
          f"connecting ({sum(r.connection.new for r in sent if r.connection)} new "
          f"connections) p95 {np.percentile(setup_ms, 95):.2f} ms; the client's own delay "
          f"(client wait) p50 {np.percentile(wait_ms, 50):.2f} ms · p95 "
          f"{np.percentile(wait_ms, 95):.2f} ms · max {wait_ms.max():.2f} ms")
    health = result.summary.client
    print(f"   client: loop lag p99 {health.loop_lag_ms.p99:.1f} ms · "
          f"{'; '.join(health.reasons) or 'ok'}")
    print(f"   cached share: {cached / max(prompts, 1):.1%} of prompt tokens; the trace's shared "
          f"blocks allow {engine_share:.1%} in whole {ENGINE_BLOCK}-token blocks "
          f"({trace_share:.1%} at its own block size)")
    return run.path


def predict_slice(name: str, measured: Path, folder: Path) -> None:
    trace, scale, speed, duration = SLICES[name]
    arrivals = ArrivalConfig(trace=trace, length_scale=scale, trace_speed=speed)
    err = Console(stderr=True)
    serve = parse_args(ServeConfig, SERVE, "--serve-args")
    cal, where = resolve_calibration(CalibrationSource(), None, SERVE, serve.engine, err)
    bench = BenchConfig(serve_args=SERVE, arrivals=arrivals, duration_s=duration,
                        out=folder, name=f"{name}-predicted")
    workload = build(bench.workload, arrivals, None, duration)
    point = predict_point(cal, workload, Fleet(), settings(bench, cal, where, Fleet()), folder,
                          bench.name)
    real = analyze(measured_run(measured))
    print(f"\n3. {name}: measured and predicted (calibration: {cal.headline()}) · {load()}")
    print(f"   {'':24}{'measured':>12}{'predicted':>12}")
    for metric in ("ttft", "e2e"):
        for q in ("p50", "p99"):
            a, b = (s.percentile(metric, q) for s in (real.summary, point.summary))
            print(f"   {metric.upper() + ' ' + q:<24}{a:>9.0f} ms{b:>9.0f} ms")
    for bucket in ("queue & overhead", "prefill", "decode"):
        a, b = (x.mean.bucket(bucket) if x.mean else float("nan")
                for x in (real, point.analysis))
        print(f"   {'mean ' + bucket:<24}{a:>9.0f} ms{b:>9.0f} ms")
    print(f"   predicted run folder {point.run.path}")


def measured_run(path: Path) -> RunFolder:
    return RunFolder.open(path)


@contextmanager
def served(name: str, folder: Path, llama: Path | None = None) -> Iterator[str]:
    """latlab serve with SERVE, or llama.cpp's server on the `default` preset exported as
    GGUF (as scripts/llamacpp.sh serves it: one thread, 4 slots of 4,096 tokens, its prompt
    cache on), started before the client raises its priority, stopped after."""
    log = folder / f"{name}-server.log"
    if llama is None:
        server = start_server(ServerLaunch.embedded(SERVE), log_path=log)
    else:
        gguf = folder / "gguf"
        if not (gguf / "model.gguf").is_file():
            subprocess.run([sys.executable, "-m", "latlab", "model", "export", str(gguf),
                            "--model", "default", "--gguf"], check=True, capture_output=True)
        port = free_port("127.0.0.1")
        url = f"http://127.0.0.1:{port}"
        server = start_server(ServerLaunch(
            (str(llama), "-m", str(gguf / "model.gguf"), "--host", "127.0.0.1", "--port",
             str(port), "-t", "1", "-c", "16384", "-np", "4", "--metrics"), url, url + "/health",
            "llama-server"), log_path=log)
    try:
        yield server.url
    finally:
        server.stop()


AUTOGROUP = Path("/proc/self/autogroup")  # Linux: CPU shares go by session group first


@contextmanager
def priority(niceness: int) -> Iterator[None]:
    """This process (the client, not the server started before it in a session of its own)
    at `niceness` while the load runs, its session's scheduling group too where the kernel
    groups by session: a load generator on a machine others load needs the CPU on time,
    not much of it (2% of a core here)."""
    if not niceness:
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    group = AUTOGROUP.read_text().split()[-1] if AUTOGROUP.is_file() else None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
        if group is not None:
            AUTOGROUP.write_text(str(niceness))
    except OSError as e:
        print(f"   (cannot raise the client's priority to {niceness}: {e})")
    try:
        yield
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, before)
            if group is not None:
                AUTOGROUP.write_text(group)
        except OSError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="0: skip the read")
    parser.add_argument("--stream-only", action="store_true")
    parser.add_argument("--llama-server", type=Path, help="also replay against llama.cpp")
    parser.add_argument("--out", type=Path, help="keep the run folders here")
    parser.add_argument("--client-nice", type=int, default=0,
                        help="the client's priority while the load runs (-5: ahead of the "
                             "machine's other work; the server stays at 0)")
    parser.add_argument("--read", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:
        return read(Path(args.read[0]), int(args.read[1]))
    print(f"machine: {os.cpu_count()} cores · {load()}")
    if args.rows:
        with tempfile.TemporaryDirectory() as scratch:
            stream(args.rows, Path(scratch))
    if args.stream_only:
        return
    folder = args.out or Path(tempfile.mkdtemp(prefix="trace-replay-"))
    folder.mkdir(parents=True, exist_ok=True)
    targets = [(name, None) for name in SLICES]
    if args.llama_server:
        targets.append(("mooncake", args.llama_server))
    for name, llama in targets:
        with served(name, folder, llama) as url, priority(args.client_nice):
            measured = replay_slice(name, folder, url, "llama-server" if llama else None)
        if llama is None:
            predict_slice(name, measured, folder)
    print(f"\nrun folders: {folder} · {load()}")


if __name__ == "__main__":
    main()
