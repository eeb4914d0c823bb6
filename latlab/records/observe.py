"""`latlab observe`: what it is asked (`ObserveConfig`: where the spans come from, the window,
how long a trace may take to arrive) and what it writes besides a run's own files:
`windows.jsonl` (one `ObservedWindow` per window, appended as each closes), `observe.json`
(`ObserveRecord`: what arrived, what became of it, the fitted workload) and `trace.jsonl` (the
calls as latlab's trace rows, `trace_rows`: what `--trace` replays).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import model_validator

from latlab.records.bench import OutputConfig, SloConfig
from latlab.records.columns import present
from latlab.records.settings import OBSERVE, TELEMETRY, derive, setting
from latlab.records.summary import Record
from latlab.records.table import RequestTable

WINDOWS = "windows.jsonl"
MIN_WINDOW_CALLS = 20  # a window with fewer calls is summed up, but no rule judges it
OBSERVE_JSON = "observe.json"
TRACE_JSONL = "trace.jsonl"
TRACE_BLOCK = 65_536  # calls made into trace rows at a time


class ObserveConfig(SloConfig, OutputConfig):
    """Spans from an OTLP/HTTP port (`otlp_port`) or a file (`from_file`), joined per trace
    into one record per LLM call; statistics and findings per window of `window_s`."""

    otlp_port: int | None = setting(None, "Receive OTLP/HTTP traces (protobuf or JSON) on this "
                                    "port (4318 is OTLP's; 0: a free one).", group=OBSERVE,
                                    ge=0, le=65535)
    host: str = setting("127.0.0.1", "Address to listen on (0.0.0.0: every interface, for "
                        "exporters on other machines).", group=OBSERVE)
    from_file: Path | None = setting(None, "Read exported spans from this file instead (OTLP/JSON "
                                     "lines as an OpenTelemetry Collector's file exporter "
                                     "writes them, or a span file of latlab's).", "--from",
                                     group=OBSERVE)
    duration_s: float | None = setting(None, "Stop after this many seconds (default: until "
                                       "Ctrl-C, or the file's end).", group=OBSERVE, gt=0)
    window_s: float = setting(60.0, "Seconds of each window: the live view's rolling window "
                              "and the windows the folder keeps, each with its findings.",
                              "--window", group=OBSERVE, gt=0)
    trace_wait_s: float | None = setting(
        None, "A trace is complete once quiet this many seconds (no span of it arrived). "
        "Default: learnt, twice the longest gap seen between two arrivals of a trace's spans "
        "(1 to 30 s; 10 s over the first traces, twice the OpenTelemetry SDK's 5 s batch "
        "delay, which splits traces when waited exactly), lengthened when a trace's spans "
        "arrive after it was explained (counted).", group=TELEMETRY, ge=0,
        show_default=False)
    max_lateness_s: float = setting(120.0, "A window waits for its late calls (how late calls "
                                    "arrive is measured: their first span's arrival after "
                                    "their start, at least 5 s) at most this many seconds past "
                                    "its end; a call later than that is counted late, "
                                    "in requests.jsonl but in no window.", "--max-lateness",
                                    group=TELEMETRY, gt=0)
    max_pending_spans: int = setting(100_000, "Spans held for traces not yet complete (about "
                                     "0.5 KB each); at it, exporters are asked to retry later "
                                     "(503), and a file's oldest traces are explained with the "
                                     "spans they have (counted).", group=TELEMETRY, ge=1)
    keep_spans: bool = setting(False, "Also keep every span in the folder (spans.jsonl; it "
                               "grows with the traffic).", group=TELEMETRY)

    @model_validator(mode="after")
    def _source(self) -> ObserveConfig:
        if (self.otlp_port is None) == (self.from_file is None):
            raise ValueError("give --otlp-port PORT (live spans) or --from FILE (exported "
                             "spans), one of the two")
        if self.name is None:
            derive(self, name="observe")
        return self


class Quantiles(Record):
    p50: float | None = None
    p99: float | None = None


class WindowFinding(Record):
    rule: str
    severity: str
    title: str


class ObservedWindow(Record):
    """One window of observed calls (those that started in it, on the services' clocks),
    written once every call that started in it is in (the watermark passed its end): their
    rate, TTFT and E2E, the budget (each bucket's share of the mean E2E) and the findings that
    held in it. `partial`: the window holds the first or the last call observed, or began
    before observe did, so its count may be cut by where the observation began or ended: its
    rate is not compared with other windows'. A window with fewer than `MIN_WINDOW_CALLS`
    calls has no findings (`findings_skipped`). At the end each window is checked against
    every call observed: `late`, the calls that started in it but came after it was written
    (in requests.jsonl, in no window); `unsupported`, its findings that the same rules over
    all its calls do not find (moved out of `findings`)."""

    start_ns: int
    end_ns: int
    calls: int
    failed: int
    rate: float  # calls per second
    ttft: Quantiles = Quantiles()
    e2e: Quantiles = Quantiles()
    shares: dict[str, float] = {}
    findings: list[WindowFinding] = []
    partial: bool = False
    findings_skipped: bool = False
    late: int = 0
    unsupported: list[WindowFinding] = []


class ObserveRecord(Record):
    """`observe.json`: what arrived and what became of it.

    `traces_without_call`: traces with no LLM call in them (an application's other
    requests); `forced`: traces explained before they were quiet, to keep memory bounded;
    `unseen_model`: calls whose model server's spans never came (their model time is the
    client's, unsplit); `rejected`: request bodies or file lines that held no spans latlab
    could read, with the first reason; `throttled`: export requests refused (503, retried by
    the exporter) while --max-pending-spans spans waited; `late`: calls that arrived after
    their window was written (later than the calls before them had been, or than
    --max-lateness); `lag_s`: how long the last window waited past its end for late spans."""

    source: str
    spans: int = 0
    traces: int = 0
    calls: int = 0
    traces_without_call: int = 0
    forced: int = 0
    late: int = 0  # calls that arrived after their window was written: in no window
    unseen_model: int = 0
    malformed: int = 0  # calls whose span ends before it starts (or has no time): left out
    rejected: int = 0
    first_rejection: str | None = None
    throttled: int = 0
    streamed: int = 0  # calls whose spans say they streamed
    not_streamed: int = 0
    stream_unknown: int = 0  # calls whose spans do not say (not counted as either)
    windows: int = 0
    lag_s: float | None = None
    trace_wait_s: float | None = None  # the trace wait at the end (learnt, or --trace-wait)
    split_traces: int = 0  # spans that arrived for a trace already explained
    sources: dict[str, int] = {}  # calls by what explained them (`otlp:SERVICE[+SERVICE]`)
    workload_flags: list[str] = []  # `latlab bench` flags of the fitted workload
    notes: list[str] = []


def trace_rows(t: RequestTable, block: int = TRACE_BLOCK) -> Iterator[dict[str, Any]]:
    """The calls as latlab's trace rows, in start order: `timestamp` (s from the first call),
    `prompt_tokens` (the server's count: a chat call's includes its chat template),
    `output_tokens` (generated; a failed call's max_tokens), `api` (the count is the server's:
    a replay through a chat API does not add its template to it again), and `session`,
    `turn`, `tenant` where known. Calls without both lengths are left out.

    What it holds at once besides the start order (8 bytes a call) is one `block` of calls:
    their values are taken, and made Python numbers, a block at a time."""
    order = np.argsort(t.origin_ns, kind="stable")
    first: int | None = None
    for at in range(0, len(order), block):
        rows = order[at:at + block]
        origin, prompt = t.origin_ns[rows], t.prompt_tokens[rows]
        output = np.where(t.ok[rows], t.completion_tokens[rows], t.max_tokens[rows])
        usable = present(origin) & (np.nan_to_num(prompt) > 0) & (np.nan_to_num(output) > 0)
        rows = rows[usable]
        if not len(rows):
            continue
        first = int(origin[usable][0]) if first is None else first
        for start, p, o, a, s, n, k in zip(
                origin[usable].tolist(), prompt[usable].tolist(), output[usable].tolist(),
                t.api.codes[rows].tolist(), t.session.codes[rows].tolist(),
                t.step["turn"][rows].tolist(), t.tenant.codes[rows].tolist()):
            row = {"timestamp": round((start - first) / 1e9, 6), "prompt_tokens": int(p),
                   "output_tokens": int(o)}
            if a >= 0:
                row["api"] = t.api.names[a]
            if s >= 0:
                row.update(session=t.session.names[s], turn=int(n))
            if k >= 0:
                row["tenant"] = t.tenant.names[k]
            yield row
