"""Server spans over real OTLP: vLLM-shaped spans from the OpenTelemetry SDK's own exporter,
OTLP/JSON, SGLang-style slices, latlab serve end to end, and the join after the fact."""

import asyncio
import time

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from typer.testing import CliRunner

from latlab.cli import app
from latlab.load.telemetry.otlp import SpanReceiver, read_spans
from latlab.load.telemetry.spans import clock_offset, join_run, timing_of
from latlab.load.telemetry.upstream import Joined, JoinedBy, join
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.config import Clock
from latlab.records.folder import RunFolder
from latlab.records.lengths import LengthDistribution
from latlab.records.spans import SERVER_TIMINGS, SPANS, Span
from latlab.records.timeline import RequestTimeline
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SMALL = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=16),
                       output_tokens=LengthDistribution(kind="fixed", a=4))


def vllm_span(provider: TracerProvider, trace_id: str, request_id: str) -> None:
    """The span vLLM's output processor emits for a finished request: `llm_request`, a
    SERVER span, child of the request's traceparent, latencies in seconds."""
    parent = TraceContextTextMapPropagator().extract(
        {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    arrival = time.time_ns()
    with provider.get_tracer("vllm").start_as_current_span(
            "llm_request", kind=SpanKind.SERVER, context=parent, start_time=arrival) as span:
        for key, value in {"gen_ai.request.id": request_id, "gen_ai.usage.prompt_tokens": 16,
                           "gen_ai.usage.completion_tokens": 4,
                           "gen_ai.latency.time_in_queue": 0.012,
                           "gen_ai.latency.time_to_first_token": 0.05,
                           "gen_ai.latency.time_in_model_prefill": 0.030,
                           "gen_ai.latency.time_in_model_decode": 0.060,
                           "gen_ai.latency.time_in_model_inference": 0.090,
                           "gen_ai.latency.e2e": 0.105}.items():
            span.set_attribute(key, value)


def test_a_request_id_joins_only_the_span_that_holds_it_whole():
    def span(rid: str) -> Span:
        return Span("1" * 32, rid, "llm_request", 0, 1, attributes={"gen_ai.request.id": rid})

    later = span("cmpl-ab12cd-10-0")  # request 10's span came first: it holds "ab12cd-1" too
    first = span("cmpl-ab12cd-1-0")
    joined = join([RequestTimeline(id="ab12cd-1", index=1),
                   RequestTimeline(id="ab12cd-2", index=2)], [later, first], None)
    assert joined == {"ab12cd-1": Joined([first], JoinedBy.REQUEST_ID)}
    named = RequestTimeline(id="x", index=0, server_request_id="chatcmpl-engine-12345678")
    assert join([named], [span("engine-1234567"), span("engine-12345678")],
                None)["x"].spans[0].span_id == "engine-12345678"


def test_vllm_spans_over_otlp_protobuf_join_by_trace_id(tmp_path):
    with SpanReceiver(tmp_path / SPANS) as receiver:
        provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
            endpoint=receiver.endpoint)))
        vllm_span(provider, TRACE, "cmpl-abc123-0")
        provider.shutdown()
        assert receiver.count == 1 and TRACE in receiver.trace_ids
    (span,) = read_spans(tmp_path / SPANS)
    assert span.name == "llm_request" and span.kind == "server" and span.service == "vllm"
    r = RequestTimeline(id="abc123", index=0, trace_id=TRACE)
    joined = join([r], [span], None)["abc123"]
    assert joined.by == JoinedBy.TRACE
    timing, _ = timing_of(joined.spans)
    assert timing.source == "otlp:vllm"
    assert (timing.queue, timing.prefill, timing.decode, timing.total) == pytest.approx(
        (12.0, 30.0, 60.0, 105.0))
    other = RequestTimeline(id="abc123", index=0, trace_id="0" * 32)  # joins by request id
    assert join([other], [span], None)["abc123"] == Joined([span], JoinedBy.REQUEST_ID)


def test_otlp_json_with_hex_ids(tmp_path):
    body = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "sglang"}}]},
        "scopeSpans": [{"spans": [
            {"traceId": TRACE, "spanId": "00f067aa0ba902b7", "name": "Req 1", "kind": 2,
             "startTimeUnixNano": "1000000000", "endTimeUnixNano": "1200000000"},
            *[{"traceId": TRACE, "spanId": f"00f067aa0ba902b{i}", "parentSpanId":
               "00f067aa0ba902b7", "name": name, "startTimeUnixNano": str(start),
               "endTimeUnixNano": str(end)}
              for i, (name, start, end) in enumerate([("tokenize", 1_000_000_000, 1_002_000_000),
                                                      ("prefill", 1_010_000_000, 1_040_000_000),
                                                      ("decode loop", 1_040_000_000,
                                                       1_190_000_000)])]]}]}]}
    with SpanReceiver(tmp_path / SPANS) as receiver:
        answer = httpx.post(receiver.endpoint, json=body, timeout=10)
        bad = httpx.post(receiver.endpoint, content=b"{not json",
                         headers={"Content-Type": "application/json"}, timeout=10)
    assert answer.status_code == 200 and bad.status_code == 400
    spans = read_spans(tmp_path / SPANS)
    assert {s.trace_id for s in spans} == {TRACE} and len(spans) == 4
    timing, _ = timing_of(spans)  # SGLang-style slices, named after their stage
    assert timing.source == "otlp:sglang"
    assert (timing.preprocess, timing.prefill, timing.decode, timing.total) == pytest.approx(
        (2.0, 30.0, 150.0, 200.0))


def test_the_clock_offset_is_bounded_by_every_request():
    clock = Clock(perf_counter_ns=0, unix_time=1000.0)  # client unix ns = perf ns + 1e12
    pairs = []
    for i, (sent, done) in enumerate([(0, 100), (200, 260)]):
        r = RequestTimeline(id=f"r{i}", index=i, sent_ns=sent * 1_000_000,
                            done_ns=done * 1_000_000)
        # the server's clock runs 5 s ahead; each span sits 1 ms inside its request
        start = int(1e12) + (sent + 1) * 1_000_000 + 5_000_000_000
        end = int(1e12) + (done - 1) * 1_000_000 + 5_000_000_000
        pairs.append((r, [Span(trace_id="t", span_id=str(i), name="s", start_ns=start,
                               end_ns=end)]))
    offset, width = clock_offset(pairs, clock)
    assert offset == pytest.approx(5000.0) and width == pytest.approx(1.0)
    assert clock_offset(pairs, Clock()) == (None, None)


def test_latlab_serve_exports_its_spans_to_the_bench_end_to_end(tmp_path):
    pytest.importorskip("torch")
    result = run_bench(BenchConfig(serve_args=["--model", "tiny"], workload=SMALL, requests=6,
                                   duration_s=None, otlp_port=0, span_wait_s=20,
                                   out=tmp_path, arrivals=ArrivalConfig(users=2)))
    joined = result.summary.spans
    assert joined.spans >= 6 and joined.requests_joined == result.summary.ok == 6
    assert joined.sources == {"otlp:latlab-serve": 6}
    assert joined.clock_offset_ms is not None and abs(joined.clock_offset_ms) < 1000
    by_span = {line["id"]: line["server"] for line in map(
        __import__("json").loads, (result.run.path / SERVER_TIMINGS).read_text().splitlines())}
    for r in result.run.read_records():  # the span says what the stream said
        assert by_span[r.id]["prefill"] == pytest.approx(r.server.prefill, abs=0.01)
        assert by_span[r.id]["total"] == pytest.approx(r.server.total, abs=0.01)


def test_report_joins_spans_from_a_file_after_the_fact(tmp_path):
    pytest.importorskip("torch")
    spans = tmp_path / "otel.jsonl"
    result = run_bench(BenchConfig(serve_args=["--model", "tiny", "--otel-file", str(spans)],
                                   workload=SMALL, requests=4, duration_s=None, out=tmp_path,
                                   arrivals=ArrivalConfig(users=1)))
    assert not (result.run.path / SERVER_TIMINGS).exists()
    out = CliRunner().invoke(app, ["report", str(result.run.path), "--spans", str(spans)])
    assert out.exit_code == 0, out.output
    assert "joined 4 of 4 traced requests" in out.output
    assert RunFolder.open(result.run.path).read_summary().spans.requests_joined == 4
    bad = CliRunner().invoke(app, ["report", str(result.run.path), "--spans",
                                   str(tmp_path / "missing.jsonl")])
    assert bad.exit_code == 2 and "--spans" in bad.output and "Traceback" not in bad.output


def test_join_run_without_matches_says_why(tmp_path):
    run = RunFolder.create(tmp_path, "x")
    with run.record_writer() as w:
        w.write(RequestTimeline(id="r0", index=0, trace_id=TRACE))
    stray = Span(trace_id="f" * 32, span_id="1", name="llm_request", start_ns=0, end_ns=1)
    joined = join_run(run, [stray])
    assert joined.requests_joined == 0 and "traceparent" in joined.notes[0]


async def _asgi_stream(receive, send) -> None:
    """What a streaming OpenAI endpoint does over ASGI (Starlette's StreamingResponse): it
    listens for the client's disconnect for the whole stream while it sends the chunks."""
    await receive()  # the request body
    listener = asyncio.ensure_future(receive())  # the disconnect listener
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    for _ in range(3):
        await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    await listener


def test_a_model_server_traced_by_generic_asgi_instrumentation_is_no_application(tmp_path):
    """Spans of OpenTelemetry's own ASGI instrumentation around a streaming endpoint (as
    `transformers serve` traced with opentelemetry-instrumentation-fastapi makes them): the
    `http receive` span is open for the whole stream; none of it is application work."""
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    events = iter([{"type": "http.request", "body": b"{}", "more_body": False}])
    streamed = asyncio.Event()

    async def receive():
        message = next(events, None)
        if message is None:
            await streamed.wait()
            return {"type": "http.disconnect"}
        return message

    async def app_(scope, receive_, send):
        await _asgi_stream(receive_, send)

    async def send(message):
        if message["type"] == "http.response.body" and not message.get("more_body"):
            streamed.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000),
             "client": ("127.0.0.1", 50000),
             "headers": [(b"host", b"127.0.0.1:8000"),
                         (b"traceparent", f"00-{TRACE}-00f067aa0ba902b7-01".encode())]}
    with SpanReceiver(tmp_path / SPANS) as receiver:
        provider = TracerProvider(resource=Resource.create({"service.name": "serve"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
            endpoint=receiver.endpoint)))
        asyncio.run(OpenTelemetryMiddleware(app_, tracer_provider=provider)(scope, receive, send))
        provider.shutdown()
    spans = read_spans(tmp_path / SPANS)
    receive_span = next(s for s in spans if s.name.endswith("http receive")
                        and s.duration_ms >= 25)
    assert receive_span.attributes.get("asgi.event.type") == "http.disconnect"
    assert timing_of(spans) == (None, None)  # no stage, no model call, no application
    # naming plumbing does not make it work
    assert timing_of(spans, app_spans=["POST /v1/completions http send"]) == (None, None)


def span(name, span_id, parent, start_ms, end_ms, kind="internal", service="app", **attrs):
    return Span(trace_id=TRACE, span_id=span_id, parent_span_id=parent, name=name, kind=kind,
                start_ns=start_ms * 1_000_000, end_ns=end_ms * 1_000_000, attributes=attrs,
                service=service)


def test_an_applications_own_spans_named_or_around_a_genai_call():
    root = span("POST /ask", "root", None, 0, 300, kind="server")
    plumbing = [span("POST /ask http receive", "rx", "root", 1, 299,
                     **{"asgi.event.type": "http.disconnect"}),
                span("POST /ask http send", "tx", "root", 250, 251)]
    retrieval = span("retrieval", "r", "root", 10, 60)
    audit = span("audit", "a", "root", 280, 290)
    call = span("chat tiny", "c", "root", 70, 240, kind="client",
                **{"gen_ai.operation.name": "chat", "gen_ai.system": "openai"})
    timing, _ = timing_of([root, *plumbing, retrieval, audit, call])  # the GenAI call
    assert timing.application == pytest.approx({"retrieval": 50, "audit": 10, "other": 70})
    assert timing.total == pytest.approx(300)
    named, _ = timing_of([root, *plumbing, retrieval, audit], app_spans=["retrieval"])
    assert named.application == pytest.approx({"retrieval": 50, "other": 250})
    assert timing_of([root, *plumbing, retrieval, audit]) == (None, None)
