"""An application in front of the model: its spans become components of each request's
decomposition. The span arithmetic on a hand-made trace, then examples/rag_app end to end
(FastAPI + numpy retrieval + latlab serve, traced with OpenTelemetry's instrumentations) on
127.0.0.1, benchmarked by latlab."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from latlab.analysis.decompose import Quality
from latlab.load.target.launch import ServerLaunch, embedded_engine, free_port, launched
from latlab.load.telemetry.spans import timing_of
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.lengths import LengthDistribution
from latlab.records.spans import Span
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench

APP = Path(__file__).resolve().parents[1] / "examples" / "rag_app" / "app.py"


def rag_app(llm_url: str, port: int, otlp_endpoint: str, lookup_ms: str) -> ServerLaunch:
    url = f"http://127.0.0.1:{port}"
    return ServerLaunch((sys.executable, str(APP), "--llm-url", llm_url, "--port", str(port),
                         "--docs", "2000", "--lookup-ms", lookup_ms, "--otlp-endpoint",
                         otlp_endpoint), url, f"{url}/health", "rag_app")
MS = 1_000_000


def span(name, span_id, parent, start_ms, end_ms, kind="internal", service="app", **attrs):
    return Span(trace_id="t", span_id=span_id, parent_span_id=parent, name=name, kind=kind,
                start_ns=start_ms * MS, end_ns=end_ms * MS, attributes=attrs, service=service)


def test_an_applications_spans_split_its_time():
    spans = [
        span("POST /chat", "root", "client", 0, 300, kind="server"),
        span("retrieval", "r1", "root", 10, 60),
        span("retrieval", "r2", "root", 50, 90),  # overlaps the first: counted once
        span("POST", "call", "root", 100, 110, kind="client"),  # ends at the headers
        span("llm_request", "llm", "call", 102, 290, kind="server", service="llm",
             **{"gen_ai.latency.e2e": 0.188, "gen_ai.latency.time_in_model_prefill": 0.05,
                "gen_ai.latency.time_in_model_decode": 0.13,
                "gen_ai.latency.time_in_queue": 0.008}),
        span("http send", "s1", "root", 150, 160),  # while the model streams: not the app's
        span("audit", "a1", "root", 295, 299),
    ]
    timing, _ = timing_of(spans)
    assert timing.source == "otlp:app+llm" and timing.total == pytest.approx(300)
    assert (timing.queue, timing.prefill, timing.decode) == pytest.approx((8, 50, 130))
    assert timing.application == pytest.approx({"retrieval": 80, "audit": 4, "other": 28})
    alone, _ = timing_of([replace(spans[4], parent_span_id="client")])
    assert alone.application is None and alone.total == pytest.approx(188)


def test_the_rag_example_benchmarked_end_to_end(tmp_path):
    otlp = free_port("127.0.0.1")
    endpoint = f"http://127.0.0.1:{otlp}/v1/traces"
    port = free_port("127.0.0.1")
    with embedded_engine(["--model", "tiny", "--otlp-endpoint", endpoint]) as engine, \
            launched(rag_app(engine.url, port, endpoint, "200"), ready_timeout_s=60):
        result = run_bench(BenchConfig(
            url=f"http://127.0.0.1:{port}", otlp_port=otlp, requests=8, duration_s=None,
            workload=WorkloadConfig(api="chat", prompt_tokens=LengthDistribution(kind="fixed",
                                                                                 a=16),
                                    output_tokens=LengthDistribution(kind="fixed", a=4)),
            arrivals=ArrivalConfig(users=2), out=tmp_path))
    a = result.analysis
    assert result.summary.spans.requests_joined == 8
    for row in a.decomposed:
        assert row.record.server.source == "otlp:rag_app+latlab-serve"
        parts = row.parts
        assert sum(c.ms for c in parts.components.values() if c.ms is not None) == \
            pytest.approx(parts.total)
        # the store's 200 ms sleep (timers wake ~1 ms early)
        assert parts.ms("app:fetch documents") >= 190
        assert parts.ms("app:retrieval") > 0 and parts.ms("prefill") > 0
    assert a.mean.quality["prefill"] == Quality.EXACT  # the model server's span, nested
    assert a.mean.application()[0] == "app:fetch documents"
    finding = next(f for f in a.findings if f.rule == "application_time")
    assert "fetch documents" in finding.title


def test_the_instrumented_rag_example_observed_from_its_spans(tmp_path):
    """A plain client (not latlab bench) calls the RAG app; `latlab observe` explains each call
    from the spans alone: the application's (FastAPI, its own, the GenAI instrumentation's
    client span), the network between it and the model (both sides seen) and the model's."""
    import threading
    import time

    import httpx

    from latlab.analysis import analyze
    from latlab.records.observe import ObserveConfig
    from latlab.services.observe import run_observe

    otlp = free_port("127.0.0.1")
    stop, seen, result = threading.Event(), [], {}
    observe = threading.Thread(target=lambda: result.setdefault("r", run_observe(
        ObserveConfig(otlp_port=otlp, out=tmp_path, window_s=2, trace_wait_s=1), stop=stop,
        view=seen.append)))
    observe.start()
    port = free_port("127.0.0.1")
    try:
        endpoint = f"http://127.0.0.1:{otlp}/v1/traces"
        with embedded_engine(["--model", "tiny", "--otlp-endpoint", endpoint]) as engine, \
                launched(rag_app(engine.url, port, endpoint, "150"), ready_timeout_s=60):
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                for i in range(6):
                    answer = client.post("/v1/chat/completions", json={
                        "model": "tiny", "max_tokens": 4, "stream": i % 2 == 0,
                        "stream_options": {"include_usage": True},
                        "messages": [{"role": "user", "content": f"what is thing {i}?"}]})
                    assert answer.status_code == 200, answer.text
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (seen and seen[-1].record.calls >= 6):
                time.sleep(0.2)
    finally:
        stop.set()
        observe.join(120)
    r = result["r"]
    assert r.record.calls == 6 and r.record.unseen_model == 0
    a = analyze(r.run)
    for row in a.decomposed:
        assert row.record.server.source == "otlp:rag_app+latlab-serve"
        assert row.record.tenant == "rag_app" and row.record.prompt_tokens > 100
        parts = row.parts
        assert sum(c.ms for c in parts.components.values() if c.ms is not None) == \
            pytest.approx(parts.total)
        assert parts.ms("app:fetch documents") >= 140  # the store's 150 ms (timers wake early)
        assert parts.ms("app:retrieval") > 0 and parts.ms("prefill") > 0
        assert parts.quality("network") in (Quality.DERIVED, Quality.ESTIMATED)
        assert parts.ms("network") + parts.ms("intake") >= 0
    assert len(a.decomposed) == 6
    assert a.mean.quality["prefill"] == Quality.EXACT and a.mean.quality["decode"] == Quality.EXACT
    assert a.mean.application()[0] == "app:fetch documents"


def test_the_examples_driver_imports_what_latlab_has():
    import importlib.util
    path = APP.with_name("bench.py")
    spec = importlib.util.spec_from_file_location("rag_app_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # raises ImportError when latlab renamed what it uses
    assert callable(module.main)
