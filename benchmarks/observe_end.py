"""The end of a `latlab observe` run on a run of N calls: its memory, step by step.

    .venv/bin/python benchmarks/observe_end.py --calls 1000000
    .venv/bin/python benchmarks/observe_end.py --calls 500000 1000000 --latlab /tmp/before

Writes an observed run folder of `--calls` calls (the records `latlab observe` makes of a RAG
application's spans: server timings and two application spans, ids and trace ids; lengths
and stage times drawn afresh for each call, as a real service's vary, so that no column holds
one value throughout; 3,333 calls a second, so a million calls are five minutes) and its
windows (60 s), then runs, for each checkout (this one, and each `--latlab`), in a process of
its own, the steps `services.observe_end.finish` takes once the last window has closed (or
`services.observe._finish` in a checkout before it): read
the calls; check the windows over every call; fit the workload; the summary; trace.jsonl;
the run store; the report's analysis and report.html. Each step's peak resident memory (the
kernel's high-water mark, reset before each step) and its resident memory after, split into
anonymous memory and file pages (the run's columns mapped from `requests.columns/`, which the
kernel can drop and read again), and seconds.

It measures the end alone, not the intake before it (`observe_throughput.py` measures both,
at whatever number of calls its stretch reaches); the process starts at what its imports
take (~110 MiB), where observe's end starts at what the intake left.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

RATE = 3333.0  # calls a second
WINDOW_NS = 60 * 10**9
T0 = 1_795_873_020_000_000_000
MS = 1_000_000
STEP = "--step-run"  # the child's mode: run the end's steps on a folder


def call(i: int) -> dict:
    """The record `latlab observe` makes of the i-th call of the benchmark's RAG application."""
    sent = T0 + int(i / RATE * 1e9) + random.randrange(0, MS)
    prompt, output = random.randint(64, 2048), random.randint(8, 256)
    pre, queue = random.uniform(1, 3), random.expovariate(1 / 4)
    prefill, decode = prompt * random.uniform(0.08, 0.1), output * random.uniform(7, 9)
    post, retrieval = random.uniform(0.5, 1.5), random.uniform(20, 80)
    model = pre + queue + prefill + decode + post
    first = sent + int((retrieval + 15 + pre + queue + prefill) * MS)
    rid = f"chatcmpl-{i // 103}-{i % 103}"
    return {"id": rid, "index": i, "worker": 0, "api": "chat", "max_tokens": output + 16,
            "tenant": "rag_app", "scheduled_ns": sent, "sent_ns": sent,
            "first_token_ns": first, "last_token_ns": first + int(decode * MS),
            "done_ns": sent + int((retrieval + 21 + model) * MS), "token_ns": [],
            "token_counts": [], "outcome": "ok", "prompt_tokens": prompt,
            "cached_tokens": random.randrange(0, prompt // 2, 16), "completion_tokens": output,
            "tokens_from_usage": True,
            "server": {"preprocess": round(pre, 3), "queue": round(queue, 3),
                       "prefill": round(prefill, 3), "decode": round(decode, 3),
                       "postprocess": round(post, 3), "total": round(model, 3),
                       "source": "otlp:rag_app+latlab-serve",
                       "application": {"retrieval": round(retrieval, 3),
                                       "other": round(random.uniform(18, 22), 3)}},
            "server_request_id": rid, "trace_id": random.randbytes(16).hex(), "retries": 0}


def write_folder(path: Path, calls: int) -> None:
    """An observed run folder of `calls` calls: config.json, observe.json, requests.jsonl and
    windows.jsonl (each window with its calls, as observe wrote it before the end)."""
    from latlab.records.config import RunConfig
    from latlab.records.files import write_json
    from latlab.records.observe import ObserveConfig, ObservedWindow, ObserveRecord

    path.mkdir(parents=True)
    write_json(path / "config.json", RunConfig(kind="observed", name=path.name,
                                               observe=ObserveConfig(otlp_port=4318)))
    write_json(path / "observe.json", ObserveRecord(source="benchmark", spans=5 * calls,
                                                    traces=calls, calls=calls))
    per_window: dict[int, int] = {}
    with open(path / "requests.jsonl", "wb") as f:
        for start in range(0, calls, 10_000):
            records = [call(i) for i in range(start, min(start + 10_000, calls))]
            f.write(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in records))
            for r in records:
                key = r["sent_ns"] // WINDOW_NS
                per_window[key] = per_window.get(key, 0) + 1
    with open(path / "windows.jsonl", "wb") as f:
        for key, n in sorted(per_window.items()):
            window = ObservedWindow(start_ns=key * WINDOW_NS, end_ns=(key + 1) * WINDOW_NS,
                                    calls=n, failed=0, rate=n / 60)
            f.write(orjson.dumps(window.model_dump(mode="json"), option=orjson.OPT_APPEND_NEWLINE))


def status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return float("nan")


class Steps:
    """Each step's peak (the kernel's high-water mark, reset after each) and memory after."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        Path("/proc/self/clear_refs").write_text("5")

    def done(self, name: str) -> None:
        print(f"  {name:34s} peak {status('VmHWM:'):6.0f} MiB   after {status('VmRSS:'):5.0f} "
              f"(anonymous {status('RssAnon:'):4.0f}, files {status('RssFile:'):4.0f})   "
              f"{time.monotonic() - self.started:5.1f} s", flush=True)
        Path("/proc/self/clear_refs").write_text("5")
        self.started = time.monotonic()


def opened(path: Path):
    """The folder `path` as the end finds it: its run, settings and closed windows (the
    imports' step timed first)."""
    from latlab.records.folder import RunFolder
    from latlab.records.observe import WINDOWS, ObservedWindow
    from latlab.services.observe_windows import Windows

    steps = Steps()
    steps.done("imports")
    run = RunFolder(path)
    settings = run.read_config()
    windows = Windows(run, settings, WINDOW_NS, 0)
    windows.kept = [ObservedWindow.model_validate_json(line)
                    for line in (path / WINDOWS).read_bytes().splitlines()]
    return steps, run, settings, windows


def run_end(path: Path) -> None:
    """The end's steps on the folder `path`, once its last window closed: this checkout's
    `services.observe_end.finish` itself, told each step's end; a checkout from before it,
    the same steps as its `services.observe._finish` took them."""
    try:
        from latlab.services.observe_end import finish
    except ImportError:
        return run_end_before(path)
    from latlab.records.observe import ObserveRecord
    from latlab.records.spans import SpanJoin

    steps, run, settings, windows = opened(path)
    record = ObserveRecord.model_validate_json((path / "observe.json").read_bytes())
    join = SpanJoin(spans=record.spans, requests_joined=record.calls,
                    requests_with_trace=record.calls)
    finish(run, settings, settings.observe, windows, record, join, None, "duration",
           path.parent, step=steps.done)


def run_end_before(path: Path) -> None:
    """`services.observe._finish`'s steps, as a checkout before `observe_end` took them."""
    from itertools import islice

    from latlab.analysis import analyze
    from latlab.metrics.summary import RunContext, summarize
    from latlab.metrics.workload_fit import fit_workload
    from latlab.records.columns import present
    from latlab.records.config import Clock
    from latlab.records.observe import trace_rows
    from latlab.records.window import run_window
    from latlab.report.html import write_html
    from latlab.services.observe import _line
    from latlab.services.observe_memory import release
    from latlab.store import RunStore, key_numbers

    steps, run, settings, windows = opened(path)
    release()
    table = run.read_table()
    steps.done("read the calls")
    windows.check(table)
    steps.done("check the windows")
    starts, ends = table.origin_ns[present(table.origin_ns)], table.end_ns[present(table.end_ns)]
    t0, end = int(starts.min()), int(max(ends.max(initial=0), starts.max())) + 1
    settings.clock = Clock(perf_counter_ns=t0, unix_time=t0 / 1e9, t0_ns=t0, end_ns=end)
    settings.duration_s = (end - t0) / 1e9
    fit_workload(table, max(1.0, round(settings.duration_s)), "bench")
    steps.done("fit the workload")
    summary = summarize(table, run_window(settings, table), None,
                        context=RunContext(stop_reason="duration"))
    run.write_summary(summary)
    steps.done("summary")
    rows = trace_rows(table)
    with open(path / "trace.jsonl", "wb") as f:
        while chunk := list(islice(rows, 2000)):
            f.write(b"".join([_line(row) for row in chunk]))
    steps.done("trace.jsonl")
    with RunStore(path.parent) as runs:
        runs.register(path, "observed", settings, key_numbers(summary), summary)
    del table, starts, ends, rows
    release()
    steps.done("run store")
    analysis = analyze(run)
    steps.done("report's analysis")
    write_html(run, analysis)
    steps.done("report.html")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == STEP:
        run_end(Path(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[1_000_000],
                        help="the run's calls; several: a run of each, the peaks side by side")
    parser.add_argument("--latlab", type=Path, action="append", default=[],
                        help="another checkout to run the end of (e.g. the commit before)")
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[1]
    checkouts = [here, *args.latlab]
    peaks: dict[tuple[int, Path], float] = {}
    for calls in args.calls:
        scratch = Path(tempfile.mkdtemp(prefix="latlab-observe-end-"))
        try:
            source = scratch / "source" / "observed"
            started = time.monotonic()
            write_folder(source, calls)
            print(f"{calls:,} calls, {(source / 'requests.jsonl').stat().st_size / 1e6:,.0f} "
                  f"MB of requests.jsonl, written in {time.monotonic() - started:.0f} s")
            for checkout in checkouts:
                print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()}; observe's end "
                      f"from {checkout}", flush=True)
                run = scratch / "runs" / "observed"
                shutil.rmtree(run.parent, ignore_errors=True)
                shutil.copytree(source, run)
                out = subprocess.run([sys.executable, __file__, STEP, str(run)], cwd=checkout,
                                     check=True, capture_output=True, text=True,
                                     env={**os.environ, "PYTHONPATH": str(checkout)}).stdout
                print(out, end="", flush=True)
                peaks[calls, checkout] = max(float(line.split("peak")[1].split()[0])
                                             for line in out.splitlines() if " peak " in line)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"load average at the end {os.getloadavg()}")
    print("the end's peak resident memory (MiB), the most of its steps':")
    print(f"  {'calls':>10s}  " + "  ".join(f"{str(c)[-28:]:>28s}" for c in checkouts))
    for calls in args.calls:
        print(f"  {calls:10,d}  " + "  ".join(f"{peaks[calls, c]:28,.0f}" for c in checkouts))


if __name__ == "__main__":
    main()
