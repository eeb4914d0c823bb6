"""How many spans a second `latlab observe` takes on one core, and its memory, flat out and over
a steady run.

    .venv/bin/python benchmarks/observe_throughput.py          # 135 s flat out, 120 s steady
    .venv/bin/python benchmarks/observe_throughput.py --max-s 60 --steady-s 600 --rate 5000

`latlab observe` runs as its own process pinned to one CPU (`os.sched_setaffinity`); sender
processes POST OTLP/HTTP protobuf bodies to it on 127.0.0.1, each a batch of 512 spans (the
OpenTelemetry SDK's export batch) of a RAG application's traffic: per call its server span
(7 attributes), a retrieval span, the GenAI client span of
`opentelemetry-instrumentation-openai-v2` (9), the HTTP client span (4) and the model server's
`llm_request` (12 attributes, 4 events) — five spans a call, ids fresh, times the sender's
clock. The senders send as OTLP exporters do: a batch refused (503, observe's back-pressure
when --max-pending-spans spans wait; or 429) is sent again after its Retry-After, else a
backoff doubling from 1 s to 32 s, at most 6 times; what is given up is counted.

1. **Flat out** (`--max-s`, observe's defaults: 60 s windows unless `--window`, the trace
   wait learnt; after 15 s of warm-up): the senders send as fast as observe takes the
   batches; the measured stretch (120 s by default) is long enough for a whole window (a
   minute's calls, not the partial first one) to close in it, unless observe refuses exports
   meanwhile (the watermark then waits for them, up to --max-lateness past a window's end: a
   longer --max-s); the windows closed in the stretch are printed with their calls, so a peak
   without a window's analysis in it is seen as such. Spans per CPU second = the spans
   observe took / the CPU seconds its process used meanwhile (user + system, from /proc), so
   a busy machine's stolen time does not count against it; per wall second and the peak
   resident memory beside it (the kernel's high-water mark, VmHWM, read and reset each
   second: no peak falls between two samples), the most in each 20 s, the peak up to each
   close's write (its windows, and the intake since the close before), and the peak while
   observe ends (its last windows, the check over every call, summary and report: they read
   the whole run).
2. **Steady** (`--steady-s` at `--rate` spans/s, `--window 10`): the most resident memory of
   the observe process in each 10 s. It holds the spans of traces not yet complete (bounded
   by the trace wait and --max-pending-spans), the calls of the open windows (the window and
   the watermark's lag) and one line per closed window, so it levels off after the first
   windows whatever the run's length.

The load average before and after is printed with the numbers: the machine is shared.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import httpx
import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from latlab.records.files import read_json
from latlab.records.observe import OBSERVE_JSON, WINDOWS, ObserveRecord

BATCH_CALLS = 512 // 5 + 1  # about the SDK's batch of 512 spans
RETRIES, MAX_BACKOFF_S = 6, 32.0  # as the OTLP exporters retry a refused export
SPANS_PER_CALL = 5
MS = 1_000_000


def _attrs(span, **values) -> None:
    for key, value in values.items():
        key = key.replace("__", ".")
        if isinstance(value, str):
            v = AnyValue(string_value=value)
        elif isinstance(value, int):
            v = AnyValue(int_value=value)
        else:
            v = AnyValue(double_value=value)
        span.attributes.append(KeyValue(key=key, value=v))


def batch(now_ns: int, seq: int) -> bytes:
    """One export request of BATCH_CALLS calls, five spans each, ending around `now_ns`."""
    request = ExportTraceServiceRequest()
    app, model = request.resource_spans.add(), request.resource_spans.add()
    for rs, name in ((app, "rag_app"), (model, "latlab-serve")):
        rs.resource.attributes.append(KeyValue(key="service.name",
                                               value=AnyValue(string_value=name)))
    app_spans, model_spans = app.scope_spans.add().spans, model.scope_spans.add().spans
    for i in range(BATCH_CALLS):
        trace = os.urandom(16)
        ids = [os.urandom(8) for _ in range(5)]
        start = now_ns - 400 * MS
        rid = f"chatcmpl-{seq}-{i}"
        root = app_spans.add(trace_id=trace, span_id=ids[0], name="POST /v1/chat/completions",
                             kind=2, start_time_unix_nano=start, end_time_unix_nano=now_ns)
        _attrs(root, http__method="POST", http__route="/v1/chat/completions",
               http__status_code=200, http__scheme="http", net__host__port=8100,
               http__flavor="1.1", http__target="/v1/chat/completions")
        retrieval = app_spans.add(trace_id=trace, span_id=ids[1], parent_span_id=ids[0],
                                  name="retrieval", kind=1, start_time_unix_nano=start + MS,
                                  end_time_unix_nano=start + 60 * MS)
        _attrs(retrieval, rag__documents=5000)
        call = app_spans.add(trace_id=trace, span_id=ids[2], parent_span_id=ids[0],
                             name="chat tiny", kind=3, start_time_unix_nano=start + 70 * MS,
                             end_time_unix_nano=now_ns - MS)
        _attrs(call, gen_ai__operation__name="chat", gen_ai__provider__name="openai",
               gen_ai__request__model="tiny", gen_ai__request__max_tokens=32,
               gen_ai__response__model="tiny", gen_ai__response__id=rid,
               gen_ai__usage__input_tokens=480, gen_ai__usage__output_tokens=32,
               server__address="127.0.0.1")
        http = app_spans.add(trace_id=trace, span_id=ids[3], parent_span_id=ids[2],
                             name="POST", kind=3, start_time_unix_nano=start + 71 * MS,
                             end_time_unix_nano=start + 120 * MS)
        _attrs(http, http__method="POST", http__url="http://127.0.0.1:8000/v1/chat/completions",
               http__status_code=200, net__peer__name="127.0.0.1")
        llm = model_spans.add(trace_id=trace, span_id=ids[4], parent_span_id=ids[3],
                              name="llm_request", kind=2, start_time_unix_nano=start + 75 * MS,
                              end_time_unix_nano=now_ns - 5 * MS)
        _attrs(llm, gen_ai__request__id=rid, gen_ai__usage__prompt_tokens=480,
               gen_ai__usage__completion_tokens=32, gen_ai__usage__cached_tokens=0,
               latlab__latency__preprocess=0.002, latlab__latency__postprocess=0.001,
               gen_ai__latency__time_in_queue=0.004, gen_ai__latency__time_to_first_token=0.05,
               gen_ai__latency__time_in_model_prefill=0.044,
               gen_ai__latency__time_in_model_decode=0.266,
               gen_ai__latency__time_in_model_inference=0.31, gen_ai__latency__e2e=0.32)
        for name, at in (("enqueued", 77), ("scheduled", 81), ("first_token", 125),
                         ("last_token", 391)):
            llm.events.add(name=name, time_unix_nano=start + at * MS)
    return request.SerializeToString()


def export(client: httpx.Client, url: str, body: bytes, until: float) -> tuple[bool, int]:
    """POST one batch as an OTLP exporter does: on 429 or 503 (observe's back-pressure) wait
    (its Retry-After, else a backoff doubling from 1 s to 32 s, jittered) and send it again,
    at most `RETRIES` times and not past `until`. (Delivered?, refusals.)"""
    backoff, refused = 1.0, 0
    for _ in range(RETRIES + 1):
        answer = client.post(url, content=body)
        if answer.status_code not in (429, 503):
            answer.raise_for_status()
            return True, refused
        refused += 1
        after = answer.headers.get("Retry-After")
        wait = float(after) if after and after.isdigit() else backoff
        wait *= random.uniform(0.8, 1.2)
        if time.monotonic() + wait > until:
            break
        time.sleep(wait)
        backoff = min(2 * backoff, MAX_BACKOFF_S)
    return False, refused


def sender(url: str, until: float, rate: float | None, counters) -> None:
    """POST batches until `until` (monotonic), at `rate` spans/s shared by the senders, or
    as fast as the receiver takes them (retrying refused ones as exporters do)."""
    spans = BATCH_CALLS * SPANS_PER_CALL
    delivered, refusals, dropped = counters
    with httpx.Client(timeout=60, headers={"Content-Type": "application/x-protobuf"}) as client:
        seq, next_at = 0, time.monotonic()
        while time.monotonic() < until:
            if rate is not None:
                time.sleep(max(0.0, next_at - time.monotonic()))
                next_at += spans / rate
            ok, refused = export(client, url, batch(time.time_ns(), seq), until)
            seq += 1
            with delivered.get_lock():
                delivered.value += spans * ok
                refusals.value += refused
                dropped.value += spans * (not ok)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_mib(pid: int) -> float:
    """The most resident memory of `pid` since the last call (its high-water mark, reset)."""
    peak = rss_mib(pid, "VmHWM")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    return peak


def windows_written(out: Path) -> list[dict]:
    return [orjson.loads(line) for path in out.glob(f"*/{WINDOWS}")
            for line in path.read_bytes().splitlines()]


def start_observe(latlab: Path, out: Path, port: int, cpu: int, options: list[str]
                  ) -> subprocess.Popen:
    """`latlab observe` of the checkout `latlab`, pinned to `cpu`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "latlab", "observe", "--otlp-port", str(port), "--out", str(out),
         *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=latlab,
        env={**os.environ, "PYTHONPATH": str(latlab)}, start_new_session=True)
    os.sched_setaffinity(process.pid, {cpu})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.1)
    process.kill()
    raise SystemExit("latlab observe did not start listening")


def finish_peak(observe: subprocess.Popen, limit_s: float = 600) -> float:
    """Wait for observe to end (killed past `limit_s`); its peak resident memory meanwhile."""
    peak, deadline = 0.0, time.monotonic() + limit_s
    while observe.poll() is None and time.monotonic() < deadline:
        try:
            peak = max(peak, rss_mib(observe.pid))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.2)
    if observe.poll() is None:
        observe.kill()
        observe.wait(10)
    return peak


def close_peaks(samples: list[tuple[float, int, float, int]], before: int
                ) -> list[tuple[float, int]]:
    """Per write of windows.jsonl during `samples` (the windows written so far when
    sampled): the peak memory since the write before it, and how many windows it wrote (a
    close analyses every window the watermark passed, one after the other, and writes them
    together)."""
    peaks, since, written = [], 0.0, before
    for _, _, peak, count in samples:
        since = max(since, peak)
        if count > written:
            peaks.append((since, count - written))
            since, written = 0.0, count
    return peaks


WARMUP_S = 15.0


def phase(latlab: Path, seconds: float, rate: float | None, senders: int, cpu: int,
          steady: bool, window_s: float | None = None) -> None:
    out = Path(tempfile.mkdtemp(prefix="latlab-observe-bench-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    window = ["--window", f"{window_s:g}"] if window_s else []
    observe = start_observe(latlab, out, port, cpu, ["--window", "10"] if steady else window)
    counters = (mp.Value("q", 0), mp.Value("q", 0), mp.Value("q", 0))
    counter = counters[0]
    try:
        warmup = 0.0 if steady else WARMUP_S
        until = time.monotonic() + warmup + seconds
        workers = [mp.Process(target=sender, args=(f"http://127.0.0.1:{port}/v1/traces", until,
                                                   rate / senders if rate else None, counters))
                   for _ in range(senders)]
        for w in workers:
            w.start()
        time.sleep(warmup)
        cpu0, t0, sent0 = cpu_s(observe.pid), time.monotonic(), counter.value
        samples, before = [], len(windows_written(out))
        peak_mib(observe.pid)
        while time.monotonic() < until:
            time.sleep(10 if steady else 1)
            samples.append((time.monotonic() - t0, counter.value, peak_mib(observe.pid),
                            len(windows_written(out))))
        used, wall, sent = cpu_s(observe.pid) - cpu0, time.monotonic() - t0, counter.value - sent0
        closed = windows_written(out)[before:]
        for w in workers:
            w.join(60)
        if steady:
            print(f"steady {rate:,.0f} spans/s for {seconds:.0f} s (window 10 s): resident memory")
            for at, n, rss, _ in samples:
                print(f"  {at:6.0f} s  {n:>10,} spans  {rss:7.1f} MiB")
        else:
            print(f"flat out for {seconds:.0f} s: {sent:,} spans taken in {used:.1f} CPU s of "
                  f"observe -> {sent / used:,.0f} spans per CPU second ({sent / wall:,.0f} per "
                  f"wall second); peak resident "
                  f"{max((r for _, _, r, _ in samples), default=0):.0f} MiB; "
                  f"{counters[1].value:,} exports refused (503) and retried, "
                  f"{counters[2].value:,} spans given up")
        print("  windows analysed meanwhile (calls): " + ", ".join(
            f"{w['calls']:,}{' partial' if w['partial'] else ''}" for w in closed))
        if not steady:
            print("  resident memory, the most in each 20 s (MiB): " + ", ".join(
                f"{max((r for a, _, r, _ in samples if lo <= a < lo + 20), default=0):.0f}"
                for lo in range(0, int(seconds), 20)))
            written, closes = iter(closed), []
            for peak, count in close_peaks(samples, before):
                calls = " + ".join(f"{w['calls']:,}" for w in islice(written, count))
                closes.append(f"{peak:.0f} ({calls})")
            print("  the peak up to each close's write (MiB, the calls of its windows): "
                  + ", ".join(closes))
    finally:
        observe.send_signal(signal.SIGINT)
        print(f"  observe's end (the last windows, the check over every call, summary, "
              f"report): peak resident {finish_peak(observe):.0f} MiB")
        for record in out.glob(f"*/{OBSERVE_JSON}"):
            r = read_json(record, ObserveRecord)
            print(f"  observe.json: {r.spans:,} spans, {r.calls:,} calls, {r.forced:,} traces "
                  f"explained early (memory bound), {r.rejected} rejected, {r.throttled:,} "
                  f"refused; trace wait {r.trace_wait_s} s, watermark lag {r.lag_s} s")
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-s", type=float, default=120.0)
    parser.add_argument("--steady-s", type=float, default=120.0)
    parser.add_argument("--window", type=float, default=None,
                        help="observe's --window flat out (default: observe's own, 60 s)")
    parser.add_argument("--rate", type=float, default=5000.0, help="spans/s of the steady phase")
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--cpu", type=int, default=0, help="the CPU observe is pinned to")
    parser.add_argument("--latlab", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose observe runs (default: this one)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; load average before: {os.getloadavg()}; observe from "
          f"{args.latlab}")
    if args.max_s:
        phase(args.latlab, args.max_s, None, args.senders, args.cpu, steady=False,
              window_s=args.window)
    if args.steady_s:
        phase(args.latlab, args.steady_s, args.rate, args.senders, args.cpu, steady=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
