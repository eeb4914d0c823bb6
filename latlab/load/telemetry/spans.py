"""Join the server's spans to the requests: each request sent a `traceparent` with its own
trace id, and the server's span for it is a child in that trace (or carries its id in
`gen_ai.request.id`). What the spans say becomes the request's `ServerTiming`:

* a span with the GenAI latency attributes vLLM emits (`llm_request`; latlab serve emits the
  same): `gen_ai.latency.time_in_queue`, `.time_in_model_prefill`, `.time_in_model_decode`,
  `.e2e` (seconds), `gen_ai.usage.cached_tokens`;
* otherwise spans named after their stage (SGLang's slices: "tokenize", "prefill",
  "decode loop", ...), summed per stage, the trace's server span giving the total;
* an application in front of the model (`app_trace`): its server span is the trace's root
  and gives the total, the spans under it the application's components
  (`ServerTiming.application`), the model server's span, nested, the stages; where the model
  is comes from a model server's span or a GenAI client span (`gen_ai.operation.name`,
  `gen_ai.system`), else the user names the application's spans (`--app-span`);
* behind a gateway that passes neither `traceparent` nor the timings on, `upstream` joins
  the engine's spans by what survives (request and response ids, else prompt length and time
  order) and adds the gateway's hop around each;
* otherwise the trace is the benched server's own (a model server traced by generic HTTP
  instrumentation): it says nothing about stages and is not an application, so the
  request keeps the client's view (the join notes it).

Span times are on the server's wall clock. Each matched request bounds the offset between the
server's clock and the client's (its span lies between the request's send and its end); the
intersection over the run is the estimate, its half-width how good it is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import orjson

from latlab.load.telemetry import upstream
from latlab.load.telemetry.app_trace import application_of
from latlab.load.telemetry.conventions import CACHED, GENAI, GENAI_CALL
from latlab.load.telemetry.otlp import read_spans
from latlab.records.config import Clock
from latlab.records.folder import RunFolder
from latlab.records.spans import SERVER_TIMINGS, SPANS, Span, SpanJoin
from latlab.records.timeline import RequestTimeline, ServerTiming

STAGE_NAMES = {"tokenize": "preprocess", "preprocess": "preprocess", "validate": "preprocess",
               "queue": "queue", "wait": "queue", "waiting": "queue", "prefill": "prefill",
               "prefill forward": "prefill", "decode": "decode", "decode loop": "decode",
               "detokenize": "postprocess"}


def timing_of(spans: Sequence[Span], app_spans: Sequence[str] = ()
              ) -> tuple[ServerTiming | None, int | None]:
    """The server timing a trace's spans give, and its cached prompt tokens; `app_spans`
    names an application's own spans (`--app-span`)."""
    timing, cached = model_timing(spans)
    llm = next((s for s in spans if is_model_span(s) or _calls_model(s)), None)
    if llm is None and not app_spans:
        return timing, cached  # a model server's stage slices, or its generic spans (None)
    app = application_of(spans, llm, timing.total if timing else None, app_spans)
    if app is None:
        return timing, cached
    total, parts, service = app
    timing = timing or ServerTiming()
    timing.total, timing.application = total, parts
    timing.source = f"otlp:{service}" + (f"+{timing.source[5:]}" if timing.source else "")
    return timing, cached


def is_model_span(s: Span) -> bool:
    """A model server's span with its latencies (vLLM's `llm_request`, latlab serve's)."""
    return GENAI["total"] in s.attributes or GENAI["prefill"] in s.attributes


def _calls_model(s: Span) -> bool:
    """A GenAI client span: an application's call to a model (OpenTelemetry's GenAI
    semantic conventions, OpenLLMetry)."""
    return any(key in s.attributes for key in GENAI_CALL)


def model_timing(spans: Sequence[Span]) -> tuple[ServerTiming | None, int | None]:
    """What the model server's spans say: a GenAI span's latencies, else stage slices."""
    for s in spans:
        if is_model_span(s):
            values = {stage: _seconds_ms(s.attributes.get(key)) for stage, key in GENAI.items()}
            cached = s.attributes.get(CACHED)
            return (ServerTiming.from_json(values, f"otlp:{s.service or 'unknown'}"),
                    cached if isinstance(cached, int) else None)
    stages: dict[str, float] = defaultdict(float)
    for s in spans:
        stage = STAGE_NAMES.get(s.name.strip().lower())
        if stage is not None:
            stages[stage] += s.duration_ms
    if not stages:
        return None, None
    roots = [s for s in spans if s.kind == "server"] or [s for s in spans if not s.parent_span_id]
    if roots:
        stages["total"] = max(s.duration_ms for s in roots)
    service = next((s.service for s in spans if s.service), None)
    return ServerTiming.from_json(dict(stages), f"otlp:{service or 'unknown'}"), None


def _seconds_ms(value: object) -> float | None:
    return value * 1000.0 if isinstance(value, (int, float)) else None


def clock_offset(pairs: Sequence[tuple[RequestTimeline, Sequence[Span]]], clock: Clock
                 ) -> tuple[float | None, float | None]:
    """(server − client clock offset, half-width) in ms from the requests' spans, or
    (None, None) without a clock anchor or when the bounds contradict each other."""
    if clock.perf_counter_ns is None or clock.unix_time is None:
        return None, None
    anchor = clock.unix_time * 1e9 - clock.perf_counter_ns
    low, high = -float("inf"), float("inf")
    for r, spans in pairs:
        if r.sent_ns is None or r.done_ns is None:
            continue
        start, end = min(s.start_ns for s in spans), max(s.end_ns for s in spans)
        low = max(low, end - (r.done_ns + anchor))
        high = min(high, start - (r.sent_ns + anchor))
    if low > high or low == -float("inf") or high == float("inf"):
        return None, None
    return (low + high) / 2e6, (high - low) / 2e6


def join_run(run: RunFolder, spans: Sequence[Span] | None = None) -> SpanJoin:
    """Join the run's spans (its spans.jsonl, or `spans` from elsewhere) to its requests and
    write what they give to server_timings.jsonl, which `RunFolder.read_records` merges.
    Behind a gateway (`Target.gateway`) each joined request gets the gateway's hop."""
    if spans is None:
        path = run.path / SPANS
        spans = read_spans(path) if path.is_file() else []
    records = run.read_records(raw=True)
    config = run.read_config()
    named = config.bench.app_spans if config.bench is not None else []
    clock = config.clock
    anchor = (int(clock.unix_time * 1e9) - clock.perf_counter_ns
              if clock.perf_counter_ns is not None and clock.unix_time is not None else None)
    matched = upstream.join(records, spans, anchor)
    hop = config.target.gateway is not None and anchor is not None
    sources: dict[str, int] = defaultdict(int)
    joined_by: dict[str, int] = defaultdict(int)
    by_id = {r.id: r for r in records}
    lines = []
    for rid, found in matched.items():
        timing, cached = timing_of(found.spans, named)
        if timing is None:
            continue
        engine = next((s for s in found.spans if is_model_span(s)), None)
        if hop and engine is not None:
            timing = upstream.with_hop(timing, by_id[rid], engine, anchor)
        sources[timing.source or "otlp"] += 1
        joined_by[str(found.by)] += 1
        lines.append(orjson.dumps({"id": rid, "server": timing.to_json(),
                                   "cached_tokens": cached}))
    (run.path / SERVER_TIMINGS).write_bytes(b"".join(line + b"\n" for line in lines))
    offset, width = clock_offset([(by_id[k], v.spans) for k, v in matched.items()
                                  if v.by != upstream.JoinedBy.ORDER], clock)
    notes = []
    traced = sum(1 for r in records if r.trace_id)
    if spans and not matched:
        notes.append(f"{len(spans)} spans arrived but none matched a request's trace id, "
                     "request id, or prompt length inside its time: does the server propagate "
                     "`traceparent`, and are the spans this run's?")
    elif len(matched) > len(lines):
        notes.append(f"the spans of {len(matched) - len(lines)} requests name no stage and no "
                     "model call (generic HTTP instrumentation): those keep the client's view "
                     "(--app-span names an application's own spans)")
    if joined_by and set(joined_by) != {str(upstream.JoinedBy.TRACE)}:
        notes.append("spans joined to requests by " + ", ".join(
            f"{by} ({n})" for by, n in sorted(joined_by.items(), key=lambda kv: -kv[1]))
            + ": the server did not pass the client's `traceparent` on")
    return SpanJoin(spans=len(spans), requests_joined=len(lines), requests_with_trace=traced,
                    sources=dict(sources), joined_by=dict(joined_by), clock_offset_ms=offset,
                    clock_offset_uncertainty_ms=width, notes=notes)
