"""One OpenTelemetry span per request: to a JSON-lines file (`--otel-file`), to an OTLP/HTTP
collector (`--otlp-endpoint`, e.g. `latlab bench --otlp-port`), or both.

The span is `llm_request`, a SERVER span and a child of the client's W3C `traceparent`, as
vLLM emits it: from receipt to response complete (wall-clock times derived from the engine's
monotonic stamps), the GenAI attributes vLLM sets (`gen_ai.latency.*` in seconds,
`gen_ai.usage.*`, `gen_ai.request.id`) plus latlab's own pre- and postprocessing, and an event
per stage (enqueued, scheduled, first token, last token).
"""

from __future__ import annotations

import time
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from latlab.engine.sequence import StageTimes
from latlab.server.timing import TRACEPARENT

EXPORT_DELAY_MS = 500


class RequestTracer:
    def __init__(self, path: Path | None = None, endpoint: str | None = None) -> None:
        self._file = open(path, "a", encoding="utf-8") if path else None
        self._provider = TracerProvider(resource=Resource.create({"service.name": "latlab-serve"}))
        if self._file is not None:
            exporter = ConsoleSpanExporter(out=self._file, formatter=_json_line)
            self._provider.add_span_processor(BatchSpanProcessor(exporter))
        if endpoint is not None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self._provider.add_span_processor(BatchSpanProcessor(
                OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=EXPORT_DELAY_MS))
        self._tracer = self._provider.get_tracer("latlab.server")
        self._wall_offset_ns = time.time_ns() - time.perf_counter_ns()
        self._propagator = TraceContextTextMapPropagator()

    def record(self, request_id: str, times: StageTimes, prompt_tokens: int,
               completion_tokens: int, outcome: str, cached_tokens: int = 0) -> None:
        wall = self._wall_offset_ns
        parent = TRACEPARENT.get()
        context = self._propagator.extract({"traceparent": parent}) if parent else None

        def seconds(start: int | None, end: int | None) -> float | None:
            return None if start is None or end is None else (end - start) / 1e9

        latency = {"time_in_queue": seconds(times.enqueued, times.first_scheduled),
                   "time_to_first_token": seconds(times.received, times.first_token),
                   "time_in_model_prefill": seconds(times.first_scheduled, times.first_token),
                   "time_in_model_decode": seconds(times.first_token, times.last_token),
                   "e2e": seconds(times.received, times.completed)}
        attributes = {"gen_ai.request.id": request_id,
                      "gen_ai.usage.prompt_tokens": prompt_tokens,
                      "gen_ai.usage.completion_tokens": completion_tokens,
                      "gen_ai.usage.cached_tokens": cached_tokens,
                      "gen_ai.response.finish_reasons": outcome,
                      "latlab.latency.preprocess": seconds(times.received, times.enqueued),
                      "latlab.latency.postprocess": seconds(times.last_token, times.completed),
                      **{f"gen_ai.latency.{k}": v for k, v in latency.items()}}
        span = self._tracer.start_span("llm_request", context=context, kind=SpanKind.SERVER,
                                       start_time=times.received + wall,
                                       attributes={k: v for k, v in attributes.items()
                                                   if v is not None})
        for name, at in (("enqueued", times.enqueued), ("scheduled", times.first_scheduled),
                         ("first_token", times.first_token), ("last_token", times.last_token)):
            if at is not None:
                span.add_event(name, timestamp=at + wall)
        span.end(end_time=(times.completed or time.perf_counter_ns()) + wall)

    def shutdown(self) -> None:
        self._provider.shutdown()
        if self._file is not None:
            self._file.close()


def _json_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"
