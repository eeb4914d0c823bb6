"""How many of the calls `latlab observe` counts land in its windows, live and from the same
spans' file: the production set-up the windows have to survive.

    .venv/bin/python benchmarks/observe_windows.py --window 10 --seconds 120
    .venv/bin/python benchmarks/observe_windows.py --window 60 --seconds 300 --client-only
    .venv/bin/python benchmarks/observe_windows.py --latlab /path/to/other/checkout   # before

examples/rag_app (FastAPI, a retrieval step, the `openai` client traced by OpenTelemetry's
GenAI instrumentation `opentelemetry-instrumentation-openai-v2`) in front of latlab serve,
its spans sent by a BatchSpanProcessor with the SDK's default 5 s delay; latlab serve's too
(0.5 s), or none with `--client-only` (the model server exports nothing). A 4-thread client
(half the calls streamed) with a burst of 12 threads in the middle third. `latlab observe
--keep-spans` takes the spans live (from the checkout `--latlab` names: another version, to
compare), is stopped 30 s after the load, and then reads its own spans.jsonl (`--from`, the
same spans in the order they arrived).

Printed: the calls in requests.jsonl, those in windows.jsonl (and the % missing), live and
from the file, and whether the two gave the same windows (calls per window) and findings.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson

from latlab.load.target.launch import ServerLaunch, embedded_engine, free_port, launched

APP = Path(__file__).resolve().parents[1] / "examples" / "rag_app" / "app.py"
SETTLE_S = 30.0  # after the load: the last windows
EXPORT_S = 7.0  # the SDK's 5 s batch delay, and some


def load(url: str, seconds: float, threads: int, burst: int) -> int:
    """Calls from `threads` threads for `seconds`, `burst` more in the middle third; the
    calls answered 200."""
    stop_at = time.monotonic() + seconds
    third = seconds / 3
    burst_from, burst_to = stop_at - 2 * third, stop_at - third
    sent = [0]
    lock = threading.Lock()

    def user(i: int, start: float, end: float) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            time.sleep(max(0.0, start - time.monotonic()))
            n = 0
            while time.monotonic() < end:
                n += 1
                r = client.post("/v1/chat/completions", json={
                    "model": "tiny", "max_tokens": 8 + n % 16, "stream": n % 2 == 0,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": f"question {i}.{n}: where is it?"}]})
                with lock:
                    sent[0] += r.status_code == 200

    workers = [threading.Thread(target=user, args=(i, 0.0, stop_at)) for i in range(threads)]
    workers += [threading.Thread(target=user, args=(threads + i, burst_from, burst_to))
                for i in range(burst)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sent[0]


def observe(latlab: Path, args: list[str], out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(latlab)}
    return subprocess.Popen([sys.executable, "-m", "latlab", "observe", "--out", str(out),
                             *args], env=env, cwd=latlab, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def windows_of(folder: Path) -> tuple[int, list[dict]]:
    calls = len((folder / "requests.jsonl").read_bytes().splitlines())
    windows = [orjson.loads(line) for line in (folder / "windows.jsonl").read_bytes()
               .splitlines()]
    return calls, windows


def describe(label: str, calls: int, windows: list[dict]) -> None:
    windowed = sum(w["calls"] for w in windows)
    missing = calls - windowed
    print(f"  {label}: {calls} calls, {windowed} in {len(windows)} windows: "
          f"{missing} missing ({100 * missing / max(calls, 1):.1f} %)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=120.0, help="of load")
    parser.add_argument("--client-only", action="store_true",
                        help="the model server exports no spans")
    parser.add_argument("--latlab", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose observe runs (default: this one)")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--burst", type=int, default=12)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; load average before: {os.getloadavg()}")
    work = Path(tempfile.mkdtemp(prefix="latlab-observe-windows-"))
    port, app_port = free_port(), free_port()
    app_url = f"http://127.0.0.1:{app_port}"
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    live = observe(args.latlab, ["--otlp-port", str(port), "--window", str(args.window),
                                 "--keep-spans"], work / "live")
    try:
        time.sleep(5)  # listening (its imports)
        serve = ["--model", "tiny"] + ([] if args.client_only else ["--otlp-endpoint", endpoint])
        with embedded_engine(serve) as engine, \
                launched(ServerLaunch((sys.executable, str(APP), "--llm-url", engine.url,
                                       "--port", str(app_port), "--docs", "2000", "--lookup-ms",
                                       "50", "--otlp-endpoint", endpoint, "--export-delay-ms",
                                       "5000"), app_url, f"{app_url}/health", "rag_app"),
                         ready_timeout_s=120):
            sent = load(app_url, args.seconds, args.threads, args.burst)
            time.sleep(EXPORT_S)  # the exporters' last batches, before the servers stop
        time.sleep(SETTLE_S)  # the servers flushed their spans as they stopped
        live.send_signal(signal.SIGINT)
        out, err = live.communicate(timeout=600)
    finally:
        if live.poll() is None:
            live.kill()
            live.wait(10)
    if live.returncode != 0:
        raise SystemExit(err.decode()[-3000:])
    (folder,) = [p for p in (work / "live").iterdir() if p.is_dir()]
    replay = observe(args.latlab, ["--from", str(folder / "spans.jsonl"), "--window",
                                   str(args.window)], work / "from")
    replay.communicate(timeout=600)
    (again,) = [p for p in (work / "from").iterdir() if p.is_dir()]
    mode = "client only" if args.client_only else "client and model server"
    print(f"{args.window:g} s windows, {args.seconds:g} s of load ({mode}), {sent} calls sent, "
          f"observe from {args.latlab}")
    calls, windows = windows_of(folder)
    describe("live", calls, windows)
    calls_from, windows_from = windows_of(again)
    describe("--from", calls_from, windows_from)
    record = orjson.loads((folder / "observe.json").read_bytes())
    print(f"  observe.json: late {record.get('late', 'not counted')}, lag "
          f"{record.get('lag_s', '–')} s, trace wait {record.get('trace_wait_s', '–')} s; "
          f"config: {orjson.loads((folder / 'config.json').read_bytes())['command'][:60]}")
    same = [(w["start_ns"], w["calls"]) for w in windows] == \
        [(w["start_ns"], w["calls"]) for w in windows_from]
    findings = [sorted(f["title"] for f in w["findings"]) for w in windows] == \
        [sorted(f["title"] for f in w["findings"]) for w in windows_from]
    print(f"  live and --from: same windows {same}, same findings {findings}")
    live_notes = [line for line in out.decode().splitlines() if "peak hours" in line]
    print(f"  peak-hours lines (live): {live_notes or 'none'}")
    print(f"load average after: {os.getloadavg()}; folders in {work}")


if __name__ == "__main__":
    main()
