"""One OpenTelemetry span per request, with an event per stage, as JSON lines in a file.

The span runs from receipt to response complete (wall-clock times derived from the engine's
monotonic stamps); its events mark enqueued, scheduled, first token and last token.
"""

from __future__ import annotations

import time
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from latlab.engine.sequence import StageTimes


class RequestTracer:
    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", encoding="utf-8")
        self._provider = TracerProvider(resource=Resource.create({"service.name": "latlab-serve"}))
        exporter = ConsoleSpanExporter(out=self._file, formatter=_json_line)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("latlab.server")
        self._wall_offset_ns = time.time_ns() - time.perf_counter_ns()

    def record(self, request_id: str, times: StageTimes, prompt_tokens: int,
               completion_tokens: int, outcome: str) -> None:
        wall = self._wall_offset_ns
        span = self._tracer.start_span("latlab.request", start_time=times.received + wall,
                                       attributes={"latlab.request_id": request_id,
                                                   "latlab.prompt_tokens": prompt_tokens,
                                                   "latlab.completion_tokens": completion_tokens,
                                                   "latlab.outcome": outcome})
        for name, at in (("enqueued", times.enqueued), ("scheduled", times.first_scheduled),
                         ("first_token", times.first_token), ("last_token", times.last_token)):
            if at is not None:
                span.add_event(name, timestamp=at + wall)
        span.end(end_time=(times.completed or time.perf_counter_ns()) + wall)

    def shutdown(self) -> None:
        self._provider.shutdown()
        self._file.close()


def _json_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"
