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
clock, each call's lengths and stage times drawn afresh (`Call`: a run's columns vary as a
real service's do, so none is kept as one value). The senders send as OTLP exporters do: a
batch refused (503, observe's back-pressure when --max-pending-spans spans wait; or 429) is
sent again after its Retry-After, else a backoff doubling from 1 s to 32 s, at most 6 times;
what is given up is counted.

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
   observe ends, by step (its last windows; the check of the windows over every call and the
   summary; trace.jsonl, the run store and the report; printing and exit), each step told by
   the file it leaves in the run folder. `--keep DIR` moves the run folder there (to look
   into its end afterwards: `observe_end.py` measures the end alone).
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
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import httpx
import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from latlab.records.files import read_json
from latlab.records.folder import REPORT, SUMMARY
from latlab.records.observe import OBSERVE_JSON, WINDOWS, ObserveRecord
from latlab.services.observe_scratch import DIRECTORY

BATCH_CALLS = 512 // 5 + 1  # about the SDK's batch of 512 spans
RETRIES, MAX_BACKOFF_S = 6, 32.0  # as the OTLP exporters retry a refused export
SPANS_PER_CALL = 5
MS = 1_000_000
S_PER_NS = 1e-9


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


@dataclass(frozen=True, slots=True)
class Call:
    """One call's lengths and stage times, drawn afresh for each (as a real service's vary:
    no column of the records holds one value throughout)."""

    prompt: int
    output: int
    cached: int
    retrieval_ns: int
    pre_ns: int
    queue_ns: int
    prefill_ns: int
    decode_ns: int
    post_ns: int

    @classmethod
    def drawn(cls) -> Call:
        prompt, output = random.randint(64, 2048), random.randint(8, 256)
        return cls(prompt, output, random.randrange(0, prompt // 2, 16),
                   int(random.uniform(20, 80) * MS), int(random.uniform(1, 3) * MS),
                   int(random.expovariate(1 / 4) * MS), int(prompt * random.uniform(0.08, 0.1)
                                                            * MS),
                   int(output * random.uniform(7, 9) * MS), int(random.uniform(0.5, 1.5) * MS))

    @property
    def model_ns(self) -> int:
        return self.pre_ns + self.queue_ns + self.prefill_ns + self.decode_ns + self.post_ns

    @property
    def total_ns(self) -> int:
        """The application's request: retrieval, the model call and the gaps around them."""
        return MS + self.retrieval_ns + 9 * MS + 5 * MS + self.model_ns + 4 * MS + MS


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
        rid = f"chatcmpl-{seq}-{i}"
        call = Call.drawn()
        start = now_ns - call.total_ns
        root = app_spans.add(trace_id=trace, span_id=ids[0], name="POST /v1/chat/completions",
                             kind=2, start_time_unix_nano=start, end_time_unix_nano=now_ns)
        _attrs(root, http__method="POST", http__route="/v1/chat/completions",
               http__status_code=200, http__scheme="http", net__host__port=8100,
               http__flavor="1.1", http__target="/v1/chat/completions")
        retrieved = start + MS + call.retrieval_ns
        retrieval = app_spans.add(trace_id=trace, span_id=ids[1], parent_span_id=ids[0],
                                  name="retrieval", kind=1, start_time_unix_nano=start + MS,
                                  end_time_unix_nano=retrieved)
        _attrs(retrieval, rag__documents=5000)
        asked = retrieved + 9 * MS
        llm_start, llm_end = asked + 5 * MS, asked + 5 * MS + call.model_ns
        client = app_spans.add(trace_id=trace, span_id=ids[2], parent_span_id=ids[0],
                               name="chat tiny", kind=3, start_time_unix_nano=asked,
                               end_time_unix_nano=llm_end + 4 * MS)
        _attrs(client, gen_ai__operation__name="chat", gen_ai__provider__name="openai",
               gen_ai__request__model="tiny", gen_ai__request__max_tokens=call.output + 16,
               gen_ai__response__model="tiny", gen_ai__response__id=rid,
               gen_ai__usage__input_tokens=call.prompt, gen_ai__usage__output_tokens=call.output,
               server__address="127.0.0.1")
        http = app_spans.add(trace_id=trace, span_id=ids[3], parent_span_id=ids[2],
                             name="POST", kind=3, start_time_unix_nano=asked + MS,
                             end_time_unix_nano=llm_end + 2 * MS)
        _attrs(http, http__method="POST", http__url="http://127.0.0.1:8000/v1/chat/completions",
               http__status_code=200, net__peer__name="127.0.0.1")
        llm = model_spans.add(trace_id=trace, span_id=ids[4], parent_span_id=ids[3],
                              name="llm_request", kind=2, start_time_unix_nano=llm_start,
                              end_time_unix_nano=llm_end)
        _attrs(llm, gen_ai__request__id=rid, gen_ai__usage__prompt_tokens=call.prompt,
               gen_ai__usage__completion_tokens=call.output,
               gen_ai__usage__cached_tokens=call.cached,
               latlab__latency__preprocess=call.pre_ns * S_PER_NS,
               latlab__latency__postprocess=call.post_ns * S_PER_NS,
               gen_ai__latency__time_in_queue=call.queue_ns * S_PER_NS,
               gen_ai__latency__time_to_first_token=(call.pre_ns + call.queue_ns
                                                     + call.prefill_ns) * S_PER_NS,
               gen_ai__latency__time_in_model_prefill=call.prefill_ns * S_PER_NS,
               gen_ai__latency__time_in_model_decode=call.decode_ns * S_PER_NS,
               gen_ai__latency__time_in_model_inference=(call.prefill_ns + call.decode_ns)
               * S_PER_NS,
               gen_ai__latency__e2e=call.model_ns * S_PER_NS)
        at = llm_start + call.pre_ns
        for name, step in (("enqueued", 0), ("scheduled", call.queue_ns),
                           ("first_token", call.prefill_ns), ("last_token", call.decode_ns)):
            at += step
            llm.events.add(name=name, time_unix_nano=at)
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


# The steps of observe's end, each told by the file its finish leaves in the run folder.
END_STEPS = (
    ("the last windows", lambda run: not (run / DIRECTORY).exists()),  # scratch removed
    ("the check over every call and the summary", lambda run: (run / SUMMARY).exists()),
    ("trace, store and report", lambda run: (run / REPORT).exists()),
    ("printing and exit", lambda run: False),
)


def finish_peaks(observe: subprocess.Popen, out: Path, limit_s: float = 600
                 ) -> list[tuple[str, float, float]]:
    """Wait for observe to end (killed past `limit_s`); per step of its end (`END_STEPS`,
    told apart by the files it leaves), its peak resident memory (MiB) and seconds."""
    steps, step, peak = [], 0, 0.0
    started = deadline = time.monotonic()
    deadline += limit_s
    while observe.poll() is None and time.monotonic() < deadline:
        try:
            peak = max(peak, peak_mib(observe.pid))
        except OSError:  # it has just ended
            break
        runs = [p for p in out.iterdir() if p.is_dir()]
        while step < len(END_STEPS) - 1 and runs and END_STEPS[step][1](runs[0]):
            steps.append((END_STEPS[step][0], peak, time.monotonic() - started))
            step, peak, started = step + 1, 0.0, time.monotonic()
        time.sleep(0.1)
    steps.append((END_STEPS[step][0], peak, time.monotonic() - started))
    if observe.poll() is None:
        observe.kill()
        observe.wait(10)
    return steps


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
          steady: bool, window_s: float | None = None, keep: Path | None = None
          ) -> None:
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
        steps = finish_peaks(observe, out)
        print(f"  observe's end: peak resident {max(p for _, p, _ in steps):.0f} MiB; "
              "by step: " + ", ".join(f"{name} {p:.0f} MiB ({s:.0f} s)"
                                      for name, p, s in steps))
        for record in out.glob(f"*/{OBSERVE_JSON}"):
            r = read_json(record, ObserveRecord)
            print(f"  observe.json: {r.spans:,} spans, {r.calls:,} calls, {r.forced:,} traces "
                  f"explained early (memory bound), {r.rejected} rejected, {r.throttled:,} "
                  f"refused; trace wait {r.trace_wait_s} s, watermark lag {r.lag_s} s")
        if keep is not None and not steady:
            for run in (p for p in out.iterdir() if p.is_dir()):
                shutil.move(run, keep / run.name)
                print(f"  run folder kept: {keep / run.name}")
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
    parser.add_argument("--keep", type=Path, help="move the flat-out run's folder here")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; load average before: {os.getloadavg()}; observe from "
          f"{args.latlab}")
    if args.max_s:
        phase(args.latlab, args.max_s, None, args.senders, args.cpu, steady=False,
              window_s=args.window, keep=args.keep)
    if args.steady_s:
        phase(args.latlab, args.steady_s, args.rate, args.senders, args.cpu, steady=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
