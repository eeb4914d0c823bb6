"""`latlab observe`'s intake: spans in (the OTLP receiver, or a file), calls out. A `Session`
holds what one observation has open: the observer the spans go to (with spans.jsonl under
--keep-spans), requests.jsonl's writer and the windows; `take` writes the calls complete now
and puts them in their windows, and closes the windows the watermark has passed. `follow`
does so each `REFRESH_S` while the receiver takes spans (drawing the live view), `from_file`
a file's spans in its order, traces quiet by the spans' own end times.

    receiver = listen(config, spans)        # an OTLP/HTTP receiver handing spans to `spans`
    follow(session, receiver, view)         # until the duration or `stop`
    session.take(0, final=True)             # every call still waiting
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

import orjson

from latlab.load.telemetry.conventions import KEPT
from latlab.load.telemetry.observer import Observer
from latlab.load.telemetry.otlp import SpanReceiver, iter_spans
from latlab.load.workers.collector import sweep_if_piled
from latlab.metrics.stats import ci_ranks
from latlab.records.config import RunConfig
from latlab.records.folder import RecordWriter, RunFolder
from latlab.records.observe import ObserveConfig, ObservedWindow, ObserveRecord
from latlab.records.spans import Span
from latlab.services.errors import InputError
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


class Spans:
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
class Session:
    run: RunFolder
    settings: RunConfig
    config: ObserveConfig
    spans: Spans
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


def listen(config: ObserveConfig, spans: Spans) -> SpanReceiver:
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


def follow(s: Session, receiver: SpanReceiver, view: Callable[[Live], None] | None) -> None:
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


def from_file(s: Session) -> None:
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


def _feed(s: Session, spans: list[Span], watermark: int) -> int:
    if not spans:
        return watermark
    watermark = max(watermark, max(x.end_ns for x in spans))
    s.spans.add(spans, watermark)
    s.take(watermark)
    sweep_if_piled()
    return watermark


def json_line(data: object) -> bytes:
    """`data` as a JSON line of its own size: orjson's bytes keep its whole output buffer
    (16 KB), so the 2,000 lines taken at a time held 32 MB instead of 2."""
    return bytes(memoryview(orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE)))


def _source(config: ObserveConfig) -> str:
    return (f"--from {config.from_file}" if config.from_file is not None
            else f"OTLP/HTTP on {config.host}:{config.otlp_port}")
