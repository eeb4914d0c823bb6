"""A gateway in front of the engine: told from its headers, its engine's spans joined to the
requests without its help, its hop in the decomposition. The fixtures were recorded from
LiteLLM 1.108 in front of `latlab serve` (tests/fixtures/gateways/README.md says how)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from latlab.analysis import analyze
from latlab.analysis.compare import compare
from latlab.analysis.decompose import GATEWAY, Quality
from latlab.load import BenchError
from latlab.load.request.fields import Adaptations
from latlab.load.request.tls import ssl_context
from latlab.load.target.discovery import PROBE_PATH, probe
from latlab.load.target.gateway import detect, named
from latlab.load.telemetry.otlp import read_spans
from latlab.load.telemetry.spans import join_run
from latlab.load.telemetry.upstream import CLOCK_SLACK_NS, JoinedBy, join
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder
from latlab.records.spans import SPANS, Span
from latlab.records.timeline import RequestTimeline
from latlab.report.html import write_html

FIXTURES = Path(__file__).parent / "fixtures" / "gateways"
LITELLM = FIXTURES / "litellm"


def recorded_headers(path: Path) -> dict[str, str]:
    """The response headers of a recorded `curl -D -` answer."""
    head = path.read_bytes().decode().split("\r\n\r\n", 1)[0].split("\r\n")[1:]
    return dict(line.split(": ", 1) for line in head)


def test_a_gateway_is_told_from_the_headers_it_adds():
    litellm = detect(recorded_headers(LITELLM / "chat-stream.http"))
    assert litellm is not None and litellm.name == "LiteLLM 1.108.7"
    assert "x-litellm-" in litellm.evidence
    assert detect({"Server": "nginx/1.22.1"}).name == "nginx/1.22.1"
    assert detect({"server": "envoy", "x-envoy-upstream-service-time": "12"}).name == "Envoy"
    assert detect({"Via": "1.1 squid"}).evidence == "via: 1.1 squid"
    assert detect({"server": "uvicorn", "content-type": "application/json"}) is None
    assert named("http://127.0.0.1:8000").evidence == "--server-url http://127.0.0.1:8000"


@pytest.fixture
def litellm_run(tmp_path) -> RunFolder:
    shutil.copytree(LITELLM / "run", tmp_path / "run")
    return RunFolder.open(tmp_path / "run")


def test_the_engines_spans_join_through_litellm_by_the_response_id(litellm_run):
    joined = join_run(litellm_run)
    records = litellm_run.read_records(raw=True)
    assert joined.requests_joined == len(records) == 20
    assert joined.joined_by == {str(JoinedBy.RESPONSE_ID): 20}
    assert any("traceparent" in note for note in joined.notes)  # LiteLLM drops it


def test_prompt_length_and_time_order_pair_them_as_the_ids_do(litellm_run):
    """Without any id that survives the gateway, the spans pair with the requests as the
    response ids pair them (20 requests of one prompt length, 17 in flight at once)."""
    records = litellm_run.read_records(raw=True)
    spans = read_spans(litellm_run.path / SPANS)
    clock = litellm_run.read_config().clock
    anchor = int(clock.unix_time * 1e9) - clock.perf_counter_ns
    by_id = join(records, spans, anchor)
    for r in records:
        r.server_request_id = None
    by_order = join(records, spans, anchor)
    assert {j.by for j in by_order.values()} == {JoinedBy.ORDER}
    assert {k: v.spans for k, v in by_order.items()} == {k: v.spans for k, v in by_id.items()}
    assert join(records, spans, None) == {}  # no clock anchor: nothing to order by


def test_the_gateways_hop_is_its_own_component_and_the_parts_add_up(litellm_run):
    join_run(litellm_run)
    analysis = analyze(litellm_run)
    parts, ok = analysis.requests.parts, analysis.ok
    for name in GATEWAY:
        assert (parts.quality[name][ok] == list(Quality).index(Quality.DERIVED)).all()
        assert (parts.value(name)[ok] > 0).all()
    assert analysis.mean.coverage["prefill"] == 1.0 and analysis.mean.coverage["decode"] == 1.0
    # intake, the engine's stages and the tail account for E2E: next to nothing unattributed
    assert np.abs(parts.value("unattributed")[ok]).max() < 1.0
    assert analysis.mean.bucket("gateway") > 0 and "gateway" in analysis.mean.buckets()
    hop = analysis.hop
    assert hop is not None and hop.joined == hop.requests == int(ok.sum())
    assert hop.client_ttft_ms == pytest.approx(
        hop.intake_ms + hop.engine_ttft_ms + hop.forward_ms, abs=0.01)
    finding = next(f for f in analysis.findings if f.rule == "gateway_share")
    assert finding.title.startswith("a gateway takes") and "20 of 20 requests" in " ".join(
        finding.evidence)


def test_the_order_join_keeps_to_each_requests_time_and_lengths():
    anchor = 0
    sent = [1_000_000_000, 1_050_000_000]

    def request(i: int, prompt: int) -> RequestTimeline:
        return RequestTimeline(id=f"r{i}", index=i, sent_ns=sent[i], done_ns=sent[i] + 500_000_000,
                               prompt_tokens=prompt, completion_tokens=8)

    def span(name: str, start: int, prompt: int, output: int = 8) -> Span:
        return Span("t" + name, name, "llm_request", start, start + 300_000_000,
                    attributes={"gen_ai.request.id": name, "gen_ai.usage.prompt_tokens": prompt,
                                "gen_ai.usage.completion_tokens": output})

    records = [request(0, 100), request(1, 200)]
    early = span("early", sent[0] - CLOCK_SLACK_NS - 1, 100)  # before the request was sent
    other_length = span("long", sent[0] + 10_000_000, 300)
    other_output = span("more", sent[0] + 11_000_000, 100, output=9)
    first = span("first", sent[0] + 20_000_000, 100)
    second = span("second", sent[1] + 1_000_000, 200)
    joined = join(records, [early, other_length, other_output, first, second], anchor)
    assert joined["r0"].spans == [first] and joined["r1"].spans == [second]


def test_the_report_and_compare_show_the_hop(litellm_run, tmp_path):
    join_run(litellm_run)
    through = analyze(litellm_run)
    page = write_html(litellm_run, through).read_text()
    assert "Through a gateway (mean of 20 of 20 requests, 100%)" in page
    assert "gateway intake" in page and "forwarding" in page
    shutil.copytree(litellm_run.path, tmp_path / "direct")
    direct = RunFolder.open(tmp_path / "direct")
    config = direct.read_config()
    config.target.gateway = None
    direct.write_config(config)
    comparison = compare(analyze(direct), through)
    assert any("A went through no gateway, B through a gateway" in c
               for c in comparison.conditions)


async def test_the_probe_asks_a_path_no_server_routes_and_takes_any_answer():
    """What the round trip is measured with costs the target nothing (through LiteLLM, GET
    /health ran a completion on every model)."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(status=404, headers={"Server": "nginx/1.22.1"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        found = await probe(f"http://127.0.0.1:{port}", probes=3)
    finally:
        await runner.cleanup()
    assert seen == [PROBE_PATH] * 4  # one to open the connection, three timed
    assert found.rtt_ms is not None and found.rtt_ms > 0
    assert detect(found.headers).name == "nginx/1.22.1"
    assert (await probe("http://127.0.0.1:9", probes=2)).rtt_ms is None  # nothing answers


def test_tls_options_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="--ca-cert .*no such file"):
        BenchConfig(url="https://127.0.0.1:1", ca_cert=tmp_path / "missing.pem")
    (tmp_path / "cert.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="give one"):
        BenchConfig(url="https://127.0.0.1:1", ca_cert=tmp_path / "cert.pem", insecure=True)
    with pytest.raises(BenchError, match="--ca-cert .*not a PEM certificate"):
        ssl_context(str(tmp_path / "cert.pem"))
    with pytest.raises(ValueError, match="--server-url .*give --url too"):
        BenchConfig(server_url="http://127.0.0.1:1")


def test_what_a_client_learned_of_the_gateway_crosses_processes():
    learned = Adaptations(gateway=detect(recorded_headers(LITELLM / "chat-stream.http")))
    assert Adaptations.from_json(learned.to_json()) == learned
    assert Adaptations().merge(learned).gateway == learned.gateway
