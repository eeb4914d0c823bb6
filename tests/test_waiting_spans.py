"""The spans `latlab observe` holds while their traces wait (up to --max-pending-spans of
them): only the attributes its calls are made from, compact, ids shared; the calls made from
spans so cut are those made from the whole spans. Memory is measured with tracemalloc over
the same spans each way (no clock involved)."""

import gc
import re
import tracemalloc
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from latlab.load.telemetry import observer as observer_module
from latlab.load.telemetry.attributes import Attributes
from latlab.load.telemetry.conventions import KEPT
from latlab.load.telemetry.observer import Observer
from latlab.load.telemetry.otlp import iter_spans, spans_of
from latlab.records.spans import NO_EVENTS

MS = 1_000_000
T0 = 1_790_000_000 * 10**9
FIXTURE = Path(__file__).parent / "fixtures" / "observe" / "genai_spans.jsonl"
TELEMETRY = Path(__file__).parents[1] / "latlab" / "load" / "telemetry"


def _attrs(span, values):
    for key, value in values.items():
        v = (AnyValue(string_value=value) if isinstance(value, str) else
             AnyValue(int_value=value) if isinstance(value, int) else
             AnyValue(double_value=value))
        span.attributes.append(KeyValue(key=key, value=v))


def rag_export(first: int, calls: int) -> ExportTraceServiceRequest:
    """An export of a RAG application's calls, five spans each (benchmarks/observe_throughput's
    shape): its server span, a retrieval, the GenAI client span, the HTTP client span, and
    the model server's `llm_request`."""
    request = ExportTraceServiceRequest()
    app, model = request.resource_spans.add(), request.resource_spans.add()
    for rs, name in ((app, "rag_app"), (model, "latlab-serve")):
        rs.resource.attributes.append(KeyValue(key="service.name",
                                               value=AnyValue(string_value=name)))
    app_spans, model_spans = app.scope_spans.add().spans, model.scope_spans.add().spans
    for n in range(first, first + calls):
        trace, ids = n.to_bytes(16, "big"), [(n * 8 + i).to_bytes(8, "big") for i in range(5)]
        start, rid = T0 + n * MS, f"chatcmpl-{n}"
        root = app_spans.add(trace_id=trace, span_id=ids[0], name="POST /v1/chat/completions",
                             kind=2, start_time_unix_nano=start,
                             end_time_unix_nano=start + 900 * MS)
        _attrs(root, {"http.method": "POST", "http.route": "/v1/chat/completions",
                      "http.status_code": 200, "http.scheme": "http", "net.host.port": 8100,
                      "http.flavor": "1.1", "http.target": "/v1/chat/completions"})
        retrieval = app_spans.add(trace_id=trace, span_id=ids[1], parent_span_id=ids[0],
                                  name="retrieval", kind=1, start_time_unix_nano=start + MS,
                                  end_time_unix_nano=start + 50 * MS)
        _attrs(retrieval, {"rag.documents": 5000})
        client = app_spans.add(trace_id=trace, span_id=ids[2], parent_span_id=ids[0],
                               name="chat tiny", kind=3, start_time_unix_nano=start + 60 * MS,
                               end_time_unix_nano=start + 890 * MS)
        _attrs(client, {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                        "gen_ai.request.model": "tiny", "gen_ai.request.max_tokens": 100 + n,
                        "gen_ai.response.model": "tiny", "gen_ai.response.id": rid,
                        "gen_ai.usage.input_tokens": 500 + n, "gen_ai.usage.output_tokens": 90,
                        "server.address": "127.0.0.1"})
        http = app_spans.add(trace_id=trace, span_id=ids[3], parent_span_id=ids[2], name="POST",
                             kind=3, start_time_unix_nano=start + 61 * MS,
                             end_time_unix_nano=start + 888 * MS)
        _attrs(http, {"http.method": "POST", "http.status_code": 200,
                      "http.url": "http://127.0.0.1:8000/v1/chat/completions",
                      "net.peer.name": "127.0.0.1"})
        llm = model_spans.add(trace_id=trace, span_id=ids[4], parent_span_id=ids[3],
                              name="llm_request", kind=2, start_time_unix_nano=start + 65 * MS,
                              end_time_unix_nano=start + 880 * MS)
        _attrs(llm, {"gen_ai.request.id": rid, "gen_ai.usage.prompt_tokens": 500 + n,
                     "gen_ai.usage.completion_tokens": 90, "gen_ai.usage.cached_tokens": 64,
                     "latlab.latency.preprocess": 0.002, "latlab.latency.postprocess": 0.001,
                     "gen_ai.latency.time_in_queue": 0.004 + n * 1e-6,
                     "gen_ai.latency.time_to_first_token": 0.05 + n * 1e-6,
                     "gen_ai.latency.time_in_model_prefill": 0.044,
                     "gen_ai.latency.time_in_model_decode": 0.76,
                     "gen_ai.latency.time_in_model_inference": 0.804,
                     "gen_ai.latency.e2e": 0.815})
        for name, at in (("enqueued", 66), ("scheduled", 70), ("first_token", 115)):
            llm.events.add(name=name, time_unix_nano=start + at * MS)
    return request


def _bytes_per_span(hold, exports: list[ExportTraceServiceRequest]) -> float:
    """The memory `hold(export)` keeps, per span, over every export but the first (which
    fills the tables of names shared from then on)."""
    hold(exports[0])
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        spans = sum(hold(export) for export in exports[1:])
        return (tracemalloc.get_traced_memory()[0] - before) / spans
    finally:
        tracemalloc.stop()


def test_a_waiting_span_keeps_a_compact_mapping_of_the_attributes_read():
    (export,) = [rag_export(0, 2)]
    spans = list(spans_of(export, events=False, kept=KEPT))
    client, llm = spans[2], spans[-2]  # the app's spans first, then the model server's
    assert isinstance(client.attributes, Attributes) and client.events is NO_EVENTS
    assert set(client.attributes) == {
        "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
        "gen_ai.request.max_tokens", "gen_ai.response.model", "gen_ai.response.id",
        "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"}  # not server.address
    assert "gen_ai.latency.time_in_model_inference" not in llm.attributes
    assert llm.attributes["gen_ai.latency.e2e"] == 0.815
    assert dict(spans[0].attributes) == {"http.status_code": 200}  # all the root's read
    # one key table per shape, one string per label value and per id the export repeats
    other_client = spans[6]
    assert other_client.attributes._index is client.attributes._index
    assert other_client.attributes["gen_ai.request.model"] is client.attributes[
        "gen_ai.request.model"]
    assert llm.trace_id is client.trace_id and client.parent_span_id is spans[0].span_id


def test_a_waiting_span_holds_about_half_what_it_did_whole(monkeypatch):
    """The benchmark's RAG spans waiting in the observer, decoded whole (a dict of every
    attribute: what a waiting span was) and as observe decodes them: about 0.8 KB a span
    against 0.5 KB, with what the observer keeps per trace."""
    exports = [rag_export(i * 100, 100) for i in range(11)]  # 5,000 spans measured

    def bytes_per_span(kept) -> float:
        observer = Observer(60e9, 10**9)

        def waiting(export):
            before = observer.pending_spans
            observer.add(list(spans_of(export, events=False, kept=kept)), T0)
            return observer.pending_spans - before

        return _bytes_per_span(waiting, exports)

    held = bytes_per_span(KEPT)
    with monkeypatch.context() as patch:
        patch.setattr(observer_module, "held", lambda s: s)
        whole = bytes_per_span(None)
    assert whole > 750  # a dict of every attribute
    assert held < 0.65 * whole and held < 600


def _records(spans) -> list[dict]:
    observer = Observer(10e9, 10**9)
    for s in spans:
        observer.add([s], s.end_ns)
    return [r.to_json() for r in observer.finish()]


def test_the_calls_made_from_the_kept_attributes_are_those_made_from_all(monkeypatch):
    """OpenTelemetry's GenAI instrumentation's spans and latlab serve's (the recorded
    fixture), through the observer cut to `KEPT` and whole: the same records."""
    spans = list(iter_spans(FIXTURE, lambda line, reason: None))
    assert any(len(s.attributes) > len(KEPT.of(s.attributes.items())) for s in spans)
    cut = _records(spans)
    monkeypatch.setattr(observer_module, "held", lambda s: s)  # every span taken whole
    assert _records(spans) == cut and len(cut) > 50


def test_the_telemetry_modules_read_attributes_by_the_conventions_names():
    """An attribute read by a literal key would be cut from the waiting spans unnoticed:
    every key observe reads is named in `conventions` (and so kept)."""
    literal = re.compile(r"""attributes(\.get\(|\[)\s*["']|["'][\w.]+["'] in \w+\.attributes""")
    for module in ("calls", "spans", "call_outcome", "app_trace", "observer"):
        text = (TELEMETRY / f"{module}.py").read_text()
        assert not literal.search(text), module
