"""Traces latlab did not send, as call records: the spans each kind of service emits (latlab
serve's and vLLM's `llm_request`, SGLang's stage slices, OpenTelemetry's GenAI client
instrumentation, an application's own), joined per trace and across traces, with the
components each gives; the memory bound of the spans waiting."""

import pytest

from latlab.analysis.decompose import Quality, decompose
from latlab.load.telemetry.calls import calls_of, record_of
from latlab.load.telemetry.observer import Observer
from latlab.records.spans import Span
from latlab.records.timeline import Outcome

MS = 1_000_000
T0 = 1_790_000_000 * 10**9  # unix ns


def span(name, span_id, parent, start_ms, end_ms, kind="internal", service="app", trace="t1",
         status=None, **attrs):
    return Span(trace, span_id, name, T0 + start_ms * MS, T0 + end_ms * MS, parent, kind,
                attrs, [], service, status)


def llm_request(span_id, parent, start_ms, e2e_ms, trace="t1", rid="chatcmpl-1", queue=5.0,
                prefill=30.0):
    """latlab serve's span (vLLM's has the same GenAI attributes): latencies in seconds,
    preprocessing 3 ms, postprocessing 1 ms."""
    ttft = 3.0 + queue + prefill
    decode = e2e_ms - ttft - 1.0
    return span("llm_request", span_id, parent, start_ms, start_ms + e2e_ms, "server",
                "latlab-serve", trace, **{
                    "gen_ai.request.id": rid, "gen_ai.usage.prompt_tokens": 100,
                    "gen_ai.usage.completion_tokens": 20, "gen_ai.usage.cached_tokens": 0,
                    "latlab.latency.preprocess": 0.003, "latlab.latency.postprocess": 0.001,
                    "gen_ai.latency.time_in_queue": queue / 1e3,
                    "gen_ai.latency.time_to_first_token": ttft / 1e3,
                    "gen_ai.latency.time_in_model_prefill": prefill / 1e3,
                    "gen_ai.latency.time_in_model_decode": decode / 1e3,
                    "gen_ai.latency.e2e": e2e_ms / 1e3})


def genai(span_id, parent, start_ms, end_ms, trace="t1", response="chatcmpl-1", **attrs):
    """The GenAI instrumentation's CLIENT span (opentelemetry-instrumentation-openai-v2)."""
    return span("chat tiny", span_id, parent, start_ms, end_ms, "client", "app", trace, **{
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "tiny", "gen_ai.request.max_tokens": 20,
        "gen_ai.response.id": response, "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 20, **attrs})


def total(parts):
    return sum(c.ms for c in parts.components.values() if c.ms is not None)


def test_a_call_seen_by_its_model_server_only():
    """A plain client: the server's stages are exact, the network nobody saw unavailable."""
    (call,) = calls_of([llm_request("s", None, 0, 200)])
    r = record_of(call, 0)
    parts = decompose(r)
    assert r.server.source == "otlp:latlab-serve" and r.api == "chat"
    assert (r.prompt_tokens, r.completion_tokens, r.tokens_from_usage) == (100, 20, True)
    assert (r.first_token_ns - r.sent_ns) / MS == pytest.approx(38)  # the server's TTFT
    for stage, ms in (("queue", 5.0), ("prefill", 30.0), ("decode", 161.0), ("preprocess", 3.0)):
        assert parts.components[stage].quality == Quality.EXACT
        assert parts.ms(stage) == pytest.approx(ms)
    assert parts.quality("network") == Quality.UNAVAILABLE
    assert parts.total == pytest.approx(200) and total(parts) == pytest.approx(200)
    assert parts.ms("unattributed") == pytest.approx(0.0, abs=1e-6)


def test_an_instrumented_applications_call_gets_application_network_and_model_components():
    trace = [
        span("POST /v1/chat/completions", "root", "caller", 0, 400, "server", "rag_app"),
        span("retrieval", "r", "root", 5, 65),
        span("fetch documents", "f", "root", 70, 120),
        genai("c", "root", 130, 395),
        span("POST", "h", "c", 131, 160, "client"),  # the HTTP client's: ends at the headers
        llm_request("s", "h", 100, 230),  # its clock is behind the app's: centred in the call
    ]
    (call,) = calls_of(trace)
    assert call.client.span_id == "c" and call.server.span_id == "s"
    r = record_of(call, 7)
    parts = decompose(r)
    assert r.server.source == "otlp:rag_app+latlab-serve" and r.tenant == "rag_app"
    assert (r.sent_ns, r.done_ns) == (T0, T0 + 400 * MS)
    assert parts.ms("app:retrieval") == pytest.approx(60)
    assert parts.ms("app:fetch documents") == pytest.approx(50)
    assert parts.ms("network") == pytest.approx(265 - 230)  # the client's span less the server's
    assert parts.quality("network") == Quality.DERIVED
    assert parts.ms("app:other") == pytest.approx(400 - 60 - 50 - 265)
    assert parts.ms("prefill") == pytest.approx(30) and parts.quality("prefill") == Quality.EXACT
    assert total(parts) == pytest.approx(400) and abs(parts.ms("unattributed")) < 3
    # the server's span (100..330 on its clock) starts before the call (130..395): moved
    assert r.first_token_ns == T0 + (100 + 38) * MS + (130 + 395 - 100 - 330) * MS // 2


def test_a_client_that_does_not_propagate_its_trace_is_joined_by_the_response_id():
    observer = Observer(wait=1e9, max_spans=1000)
    observer.add([genai("c", None, 0, 300, trace="client-trace", response="chatcmpl-9")], T0)
    observer.add([llm_request("s", None, 20, 250, trace="server-trace", rid="chatcmpl-9")], T0)
    assert observer.ready(T0 + int(0.5e9)) == []
    (r,) = observer.ready(T0 + int(1.5e9)) + observer.finish()
    parts = decompose(r)
    assert r.trace_id == "client-trace" and r.server_request_id == "chatcmpl-9"
    assert parts.ms("network") == pytest.approx(50) and parts.ms("queue") == pytest.approx(5)
    assert observer.calls == 1 and observer.unseen_model == 0


def test_an_agents_calls_are_the_steps_of_its_task():
    trace = [span("invoke_agent", "root", None, 0, 1000),
             genai("c1", "root", 10, 300, response="a"), llm_request("s1", "c1", 20, 270, rid="a"),
             span("execute_tool search", "tool", "root", 320, 600,
                  **{"gen_ai.operation.name": "execute_tool"}),
             genai("c2", "root", 650, 990, response="b"),
             llm_request("s2", "c2", 660, 300, rid="b")]
    observer = Observer(wait=0, max_spans=1000)
    observer.add(trace, T0)
    first, second = observer.ready(T0 + 1)
    assert (first.session.turn, second.session.turn, second.session.turns) == (1, 2, 2)
    assert second.session.kind == "agent" and second.session.after_ns == first.done_ns
    assert (second.session.tool_start_ns, second.session.tool_end_ns) == (T0 + 320 * MS,
                                                                         T0 + 600 * MS)
    assert first.server.application is None  # a step is its call, not the agent's whole task


def test_sglang_stage_slices_make_a_call():
    trace = [span("Bootstrap Room 0x0", "room", "caller", 0, 210, service="sglang"),
             span(" Req 1a2b3c4d", "req", "room", 0, 210, service="sglang", rid="1a2b3c4d"),
             span("Tokenizer (host:ab | pid:1)", "thread", "req", 0, 210, service="sglang"),
             *[span(name, name, "thread", a, b, service="sglang")
               for name, a, b in (("tokenize", 0, 5), ("prefill", 12, 52),
                                  ("decode loop", 52, 205))]]
    (call,) = calls_of(trace)
    r = record_of(call, 0)
    assert call.server.span_id == "room" and r.server_request_id == "1a2b3c4d"
    assert (r.server.preprocess, r.server.prefill, r.server.decode) == pytest.approx((5, 40, 153))
    assert (r.first_token_ns - r.sent_ns) / MS == pytest.approx(45)


def test_a_failed_call_keeps_its_outcome():
    trace = [genai("c", None, 0, 30, status="error", **{"error.type": "RateLimitError"})]
    (call,) = calls_of(trace)
    r = record_of(call, 0)
    assert r.outcome == Outcome.HTTP_429 and "RateLimitError" in r.error
    assert decompose(r) is None


def test_the_spans_waiting_stay_bounded():
    observer = Observer(wait=60e9, max_spans=100)
    for i in range(1000):  # a trace every ms, none complete within the wait
        observer.add([llm_request(f"s{i}", None, i, 50, trace=f"t{i}", rid=f"r{i}")], T0 + i * MS)
        observer.ready(T0 + i * MS)
        assert observer.pending_spans <= 100
    assert observer.forced == 900
    assert observer.calls + len(observer.finish()) == 1000


def test_otlp_json_is_read_as_protobuf_reads_it():
    """The JSON reader (`json_spans`) against `opentelemetry-proto`'s own decoding of the same
    export: every kind of value, events, a status, ids in OTLP/JSON's hex."""
    import base64

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from latlab.load.telemetry.otlp import json_spans, spans_of

    message = json_format.ParseDict({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": base64.b64encode(bytes(range(16))).decode(),
            "spanId": base64.b64encode(bytes(range(8))).decode(),
            "parentSpanId": base64.b64encode(bytes(range(1, 9))).decode(),
            "name": "llm_request", "kind": 2, "startTimeUnixNano": "5", "endTimeUnixNano": "9",
            "status": {"code": 2},
            "attributes": [{"key": k, "value": v} for k, v in {
                "s": {"stringValue": "x"}, "i": {"intValue": "7"}, "d": {"doubleValue": 0.5},
                "b": {"boolValue": True}, "a": {"arrayValue": {"values": [{"intValue": "1"}]}},
                "by": {"bytesValue": base64.b64encode(b"\x00\xff").decode()},
                "kv": {"kvlistValue": {"values": [{"key": "k", "value": {"stringValue": "v"}}]}},
            }.items()],
            "events": [{"name": "first_token", "timeUnixNano": "7", "attributes": []}]}]}]}]},
        ExportTraceServiceRequest())
    data = json_format.MessageToDict(message)
    for s in data["resourceSpans"][0]["scopeSpans"][0]["spans"]:  # OTLP/JSON's ids: hex
        for key in ("traceId", "spanId", "parentSpanId"):
            s[key] = base64.b64decode(s[key]).hex()
    assert json_spans(data) == list(spans_of(message))
    assert json_spans(data)[0].status == "error" and json_spans(data)[0].kind == "server"
    with pytest.raises(ValueError, match="not OTLP/JSON"):
        json_spans({"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]})
