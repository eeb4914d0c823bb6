"""`latlab observe`: a service's own traffic explained from its spans, as a run folder.

    result = run_observe(ObserveConfig(otlp_port=4318, duration_s=600))
    result.summary.percentile("e2e", "p99"), result.analysis.findings, result.windows

Spans arrive (OTLP/HTTP, or a file of exported ones), are grouped per trace and each LLM call
becomes a record (`load.telemetry.observer`), appended to requests.jsonl as it completes; the
calls are analysed a window at a time (`observe_windows`), each window once the watermark
(`load.telemetry.watermark`) says every call that started in it is in. At the end (the
duration, the file's end, Ctrl-C) what is still waiting is explained with the spans it has,
and the folder is finished like a bench run's (`observe_end`, over every call, with the
memory of one step's columns): summary.json, report.html, the run store,
plus the traffic as a replayable trace (trace.jsonl, latlab's trace rows) and the synthetic
workload fitted to it (config.json → `bench`, what `latlab bench --config FOLDER` reruns;
`latlab predict --replay FOLDER` replays the calls themselves).

Python's cyclic garbage collector is paused while spans come in (`load.workers.collector`):
the spans waiting for their traces to complete live for seconds, so every young collection
walked and promoted all of them and the full ones came often, a quarter of the intake's CPU;
spans, traces and calls make no reference cycles, and what piles up regardless is collected
at most once a refresh (`sweep_if_piled`).
"""

from __future__ import annotations

import gc
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import orjson

from latlab import __version__
from latlab.load.telemetry.conventions import KEPT
from latlab.load.telemetry.observer import Observer
from latlab.load.telemetry.otlp import SpanReceiver, iter_spans
from latlab.load.telemetry.trace_wait import TraceWait
from latlab.load.telemetry.watermark import EXPORT_DELAY_NS, Watermark
from latlab.load.workers.collector import collector_paused, sweep_if_piled
from latlab.metrics.stats import ci_ranks
from latlab.records.config import Clock, RunConfig, Target
from latlab.records.folder import RecordWriter, RunFolder
from latlab.records.observe import ObserveConfig, ObservedWindow, ObserveRecord
from latlab.records.spans import SPANS, Span, SpanJoin
from latlab.records.target import redact
from latlab.services.errors import InputError
from latlab.services.observe_end import ObserveResult, finish, json_line
from latlab.services.observe_scratch import clear_stale
from latlab.services.observe_windows import Provisional, Rolling, Windows

REFRESH_S = 1.0
FILE_BATCH = 5000  # spans read from a file between two looks at the complete traces
TAKE_CALLS = 2000  # calls made into records, written and put in their windows at a time


@dataclass
class Live:
    """What the live view shows: the receiver's counts, the rolling window, the last closed
    window (its budget and findings), the one still waiting for late spans, and the
    peak-hours finding so far."""

    endpoint: str | None
    elapsed_s: float
    record: ObserveRecord
    rolling: Rolling
    last: ObservedWindow | None
    provisional: Provisional | None  # the latest window ended but not yet written
    peak: object | None
    pending_spans: int


class _Spans:
    """Where the spans go as they come: the observer, and spans.jsonl with --keep-spans."""

    def __init__(self, observer: Observer) -> None:
        self.observer, self.file = observer, None
        self.rejected, self.first_rejection, self.throttled = 0, None, 0

    def add(self, spans: list[Span], now_ns: int) -> None:
        if self.file is not None:
            self.file.write(b"".join(orjson.dumps(x.to_json(), option=orjson.OPT_APPEND_NEWLINE)
                                     for x in spans))
        self.observer.add(spans, now_ns)

    def reject(self, count: int, reason: str | None) -> None:
        self.rejected += count
        self.first_rejection = self.first_rejection or reason


@dataclass
class _Session:
    run: RunFolder
    settings: RunConfig
    config: ObserveConfig
    spans: _Spans
    windows: Windows
    writer: RecordWriter
    stop: threading.Event

    @property
    def observer(self) -> Observer:
        return self.spans.observer

    def take(self, now_ns: int, final: bool = False) -> None:
        """Write the calls complete by `now_ns` (all when `final`); close the windows the
        watermark has passed."""
        complete = self.observer.remaining() if final else self.observer.complete(now_ns)
        while records := list(islice(complete, TAKE_CALLS)):
            lines = [json_line(r.to_json()) for r in records]
            self.writer.write_lines(lines)
            self.windows.add(records, lines)
        self.windows.close(None if final else self.observer.watermark(now_ns))

    def record(self) -> ObserveRecord:
        o = self.observer
        source = self.settings.target.otlp_endpoint or _source(self.config)
        return ObserveRecord(source=source, spans=o.spans, traces=o.traces,
                             calls=o.calls, traces_without_call=o.traces_without_call,
                             forced=o.forced, late=self.windows.late,
                             streamed=o.streamed[True], not_streamed=o.streamed[False],
                             stream_unknown=o.streamed[None],
                             unseen_model=o.unseen_model,
                             malformed=o.malformed,
                             rejected=self.spans.rejected, throttled=self.spans.throttled,
                             first_rejection=self.spans.first_rejection,
                             windows=len(self.windows.kept), lag_s=o.mark.lag_ns / 1e9,
                             trace_wait_s=o.wait.ns / 1e9, split_traces=o.wait.splits,
                             sources=dict(o.sources))


def run_observe(config: ObserveConfig, *, stop: threading.Event | None = None,
                view: Callable[[Live], None] | None = None,
                command: Sequence[str] | None = None, store: Path | None = None
                ) -> ObserveResult:
    """Observe until the duration, the file's end or `stop` (the command sets it on Ctrl-C),
    then finish the folder. Raises `InputError` for a file it cannot open or a port it
    cannot listen on (before any folder is made)."""
    stop = stop or threading.Event()
    if config.from_file is not None and not config.from_file.is_file():
        raise InputError(f"--from {config.from_file}: "
                         + ("not a file" if config.from_file.exists() else "no such file"))
    mark = Watermark(EXPORT_DELAY_NS, int(config.max_lateness_s * 1e9))
    wait = TraceWait(None if config.trace_wait_s is None else int(config.trace_wait_s * 1e9))
    spans = _Spans(Observer(wait, config.max_pending_spans, mark))
    receiver = None if config.from_file is not None else _listen(config, spans)
    try:
        cleared = clear_stale(config.out)
        run = RunFolder.create(config.out, config.name)
        settings = RunConfig(
            kind="observed", latlab_version=__version__,
            command=shlex.join(redact(command if command is not None else sys.argv)),
            name=run.path.name, tags=config.tags, observe=config, slos=config.slos,
            target=Target(otlp_endpoint=receiver.endpoint if receiver else None),
            clock=Clock(perf_counter_ns=0, unix_time=0.0))
        run.write_config(settings)
        windows = Windows(run, settings, int(config.window_s * 1e9), mark.bound_ns,
                          since_ns=None if receiver is None else time.time_ns())
        with windows, run.record_writer() as writer, collector_paused(), \
                (open(run.path / SPANS, "ab") if config.keep_spans else nullcontext()) as kept:
            spans.file = kept
            session = _Session(run, settings, config, spans, windows, writer, stop)
            if receiver is None:
                _from_file(session)
            else:
                _live(session, receiver, view)
                receiver.__exit__(None, None, None)
                receiver = None
            session.take(0, final=True)
    finally:
        if receiver is not None:
            receiver.__exit__(None, None, None)
    stopped = ("stopped" if stop.is_set() else
               "end of file" if config.from_file is not None else "duration")
    o = session.observer
    join = SpanJoin(spans=o.spans, requests_joined=o.calls, requests_with_trace=o.calls,
                    sources=dict(o.sources))
    model = o.models.most_common(1)[0][0] if o.models else None
    run, settings, windows, record = session.run, session.settings, session.windows, \
        session.record()
    # The intake let go of before the end: the observer (its traces' tables, the ids it
    # remembers), the receiver's spans; what the paused collector left, collected.
    del session, spans, o
    gc.collect()
    result = finish(run, settings, config, windows, record, join, model, stopped, store)
    result.cleared = cleared
    return result


def _listen(config: ObserveConfig, spans: _Spans) -> SpanReceiver:
    ci_ranks(100, 50.0)  # its scipy import costs seconds: paid now, not at the first window
    receiver = SpanReceiver(None, config.host, config.otlp_port,
                            on_spans=lambda batch: spans.add(batch, time.time_ns()),
                            accepting=lambda: spans.observer.accepting(time.time_ns()),
                            events=config.keep_spans,
                            kept=None if config.keep_spans else KEPT)
    try:
        return receiver.__enter__()
    except OSError as e:
        raise InputError(f"--otlp-port {config.otlp_port}: cannot listen on {config.host} "
                         f"({e.strerror or e})") from None


def _live(s: _Session, receiver: SpanReceiver, view: Callable[[Live], None] | None) -> None:
    duration, started = s.config.duration_s, time.monotonic()
    while duration is None or time.monotonic() - started < duration:
        left = REFRESH_S if duration is None else duration - (time.monotonic() - started)
        if s.stop.wait(max(0.0, min(REFRESH_S, left))):
            break
        now = time.time_ns()
        s.take(now)
        sweep_if_piled()
        s.spans.reject(receiver.rejected - s.spans.rejected, receiver.first_rejection)
        s.spans.throttled = receiver.throttled
        if view is not None:
            w = s.windows
            view(Live(receiver.endpoint, time.monotonic() - started, s.record(),
                      w.rolling(s.observer.watermark(now)), w.kept[-1] if w.kept else None,
                      w.provisional(now), w.peak, s.observer.pending_spans))
    s.spans.reject(receiver.rejected - s.spans.rejected, receiver.first_rejection)
    s.spans.throttled = receiver.throttled


def _from_file(s: _Session) -> None:
    """The file's spans in its order; traces are quiet by the spans' own end times."""
    watermark, batch = 0, []
    for span in iter_spans(s.config.from_file,
                           lambda line, reason: s.spans.reject(1, f"line {line}: {reason}")):
        batch.append(span)
        if len(batch) >= FILE_BATCH:
            watermark = _feed(s, batch, watermark)
            batch = []
            if s.stop.is_set():
                break
    _feed(s, batch, watermark)


def _feed(s: _Session, spans: list[Span], watermark: int) -> int:
    if not spans:
        return watermark
    watermark = max(watermark, max(x.end_ns for x in spans))
    s.spans.add(spans, watermark)
    s.take(watermark)
    sweep_if_piled()
    return watermark


def _source(config: ObserveConfig) -> str:
    return (f"--from {config.from_file}" if config.from_file is not None
            else f"OTLP/HTTP on {config.host}:{config.otlp_port}")
