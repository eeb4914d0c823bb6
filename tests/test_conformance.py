"""Any OpenAI-compatible server: what real servers answered (tests/fixtures/servers: their
responses replayed), a server that keeps to OpenAI's schema and ends streams without [DONE]
benched with the defaults, SGLang's native API and vLLM's /metrics, and `transformers serve`
end to end when it is installed here."""

import json
import os
import shutil
from pathlib import Path

import pytest
from sse_server import Server, Step, stream, strict
from typer.testing import CliRunner

from latlab.analysis.server_view import server_view
from latlab.cli import app
from latlab.load import BenchError
from latlab.load.request.client import Client, answer_text
from latlab.load.request.config import ClientConfig
from latlab.load.request.fields import refused_fields
from latlab.load.request.server_timing import from_event
from latlab.load.request.sglang import SglangParser
from latlab.load.request.sse import StreamParser
from latlab.load.target.discovery import identify
from latlab.load.target.launch import ServerLaunch, free_port, launched
from latlab.load.telemetry.scrape import parse
from latlab.load.workload.requests import RequestSpec
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.lengths import LengthDistribution
from latlab.records.table import as_table
from latlab.records.target import ServerKind
from latlab.records.timeline import RequestTimeline
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench

SERVERS = Path(__file__).parent / "fixtures" / "servers"
MS = 1_000_000
SMALL = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=16),
                       output_tokens=LengthDistribution(kind="fixed", a=8))


def recorded(server: str, name: str) -> dict:
    return json.loads((SERVERS / server / f"{name}.json").read_text())


def replay(body: str, chat: bool = False, parser=StreamParser) -> tuple[RequestTimeline, object]:
    """Feed a recorded stream event by event, 1 ms apart, into a fresh timeline."""
    r = RequestTimeline(id="r", index=0, sent_ns=0, scheduled_ns=0)
    p = parser(r, chat)
    for i, event in enumerate(e for e in body.split("\n\n") if e.strip()):
        p.feed((event + "\n\n").encode(), (i + 1) * MS)
    p.finish()
    return r, p


@pytest.mark.parametrize("name,chat", [("stream_completions", False), ("stream_chat", True)])
def test_transformers_serve_streams_end_without_done_and_are_complete(name, chat):
    exchange = recorded("transformers", name)
    assert "[DONE]" not in exchange["body"]
    usage = json.loads(exchange["body"].strip().split("\n\n")[-1].removeprefix("data: "))
    r, parser = replay(exchange["body"], chat)
    assert r.ok and parser.without_done and r.done_ns == r.usage_ns > r.last_token_ns
    assert r.completion_tokens == usage["usage"]["completion_tokens"] == 6
    assert r.prompt_tokens == usage["usage"]["prompt_tokens"] and r.server is None
    # its streamer sends a chunk per whole word: events can be fewer than tokens
    assert 1 <= len(r.token_ns) <= 6 and r.token_counts == [1] * len(r.token_ns)


def test_transformers_serve_answers_and_refusals():
    for name in ("nonstream_completions", "nonstream_chat"):
        body = json.loads(recorded("transformers", name)["body"])
        assert answer_text(body) and body["usage"]["completion_tokens"] == 6
    refusal = recorded("transformers", "refused_fields")
    assert refusal["status"] == 422
    assert sorted(refused_fields(422, refusal["body"], refusal["request"]["body"])) == [
        "ignore_eos", "min_tokens"]
    assert recorded("transformers", "models")["status"] == 500


def test_a_model_list_that_fails_says_so_and_how_to_name_the_model():
    with Server(stream([]), models_answer=(500, "Internal Server Error")) as server:
        with pytest.raises(BenchError, match="HTTP 500.*give --model NAME"):
            identify(server.url, None, ServerKind.AUTO, None)
        model, kind, context, notes = identify(server.url, "m", ServerKind.AUTO, None)
    assert (model, kind, context) == ("m", ServerKind.OPENAI, None)
    assert "HTTP 500" in notes[0] and "--server-kind" in notes[0]


def test_a_strict_server_without_done_is_benched_with_the_defaults(tmp_path):
    with Server(strict(eos_after=5)) as server:
        result = run_bench(BenchConfig(url=server.url, requests=20, workload=SMALL,
                                       out=tmp_path))
    s, a = result.summary, result.analysis
    assert not result.failed and s.ok == s.requests == 20 and not s.failures
    records = result.run.read_records()
    assert all(r.completion_tokens == len(r.token_ns) == 5 for r in records)
    assert result.run.read_config().target.refused_fields == [
        "continuous_usage_stats", "ignore_eos", "min_tokens"]
    assert any("refused" in w and "max_tokens alone" in w for w in s.warnings)
    assert any("20 of 20 streams ended without" in w for w in s.warnings)
    assert s.stopped_short == 20 and any("not held" in w for w in s.warnings)
    assert not {f.rule for f in a.findings} & {"failures", "one_at_a_time", "decode_stalls"}


def test_sglangs_native_stream_and_meta_info():
    exchange = recorded("sglang", "stream_generate")
    r, _ = replay(exchange["body"], parser=SglangParser)
    assert r.ok and r.token_counts == [1] * 6 and r.completion_tokens == 6
    assert (r.prompt_tokens, r.cached_tokens) == (12, 8)
    s = r.server
    assert s.source == "sglang" and s.total == pytest.approx(115)
    assert (s.preprocess, s.queue, s.prefill, s.decode) == pytest.approx((6, 4, 25, 80), abs=1e-3)
    body = json.loads(recorded("sglang", "nonstream_generate")["body"])
    assert from_event(body).total == pytest.approx(115) and answer_text(body).startswith(" the")


async def test_the_client_speaks_sglangs_native_api():
    body = recorded("sglang", "stream_generate")["body"]
    events = [Step(0, (e + "\n\n").encode()) for e in body.split("\n\n") if e.strip()]
    spec = RequestSpec(index=0, prompt="hello", messages=None, prompt_tokens=1, max_tokens=6)
    with Server(stream(events)) as server:
        async with Client(server.url, "m", ClientConfig(api="sglang")) as client:
            r = RequestTimeline(id="r", index=0)
            await client.send(spec, r)
        sent = server.received[0]
    assert sent["path"] == "/generate" and "model" not in sent["body"]
    assert sent["body"]["sampling_params"] == {"max_new_tokens": 6, "ignore_eos": True,
                                               "min_new_tokens": 6}
    assert r.ok and r.completion_tokens == 6 and r.server.source == "sglang"


def test_vllms_metrics_are_the_runs_server_view_checked_against_the_client():
    before, after = (parse((SERVERS / "vllm" / f"metrics_{n}.txt").read_text(), t)
                     for n, t in (("before", 0), ("after", 20_000 * MS)))
    records = [RequestTimeline(id=f"r{i}", index=i, sent_ns=(i * 900 + 10) * MS,
                               done_ns=(i * 900 + 530) * MS, prompt_tokens=256,
                               completion_tokens=64, tokens_from_usage=True) for i in range(20)]
    during = parse((SERVERS / "vllm" / "metrics_after.txt").read_text(), 10_000 * MS)
    assert server_view([before, after], as_table(records)).peaks == {}  # idle: not a peak
    view = server_view([before, during, after], as_table(records))
    assert view.requests == view.client_requests == 20 and view.agrees, view.checks
    assert view.stages_ms == pytest.approx({"queue": 20, "prefill": 50, "decode": 420,
                                            "inference": 470, "ttft": 75, "e2e": 500})
    assert view.tokens == {"prompt_tokens": 5120, "generation_tokens": 1280}
    assert view.peaks == {"running": 4, "waiting": 1, "kv_usage": 0.35}
    fewer = server_view([before, after], as_table(records[:12]))
    assert not fewer.agrees and "other clients" in fewer.checks[0]
    for r in records:
        r.completion_tokens = 32
    halved = server_view([before, after], as_table(records))
    assert not halved.agrees and "generation tokens: the server counted 64.0 a request" in (
        halved.checks[-1])


def test_latlab_serves_histograms_are_the_server_view_end_to_end(tmp_path):
    pytest.importorskip("torch")
    result = run_bench(BenchConfig(serve_args=["--model", "tiny"], requests=8, workload=SMALL,
                                   scrape_interval_s=0.2, drain_s=5, out=tmp_path,
                                   arrivals=ArrivalConfig(users=2)))
    view = result.analysis.server
    assert view is not None and view.agrees, view and view.checks
    # those ended between two scrapes; one may end as a scrape is taken
    assert abs(view.requests - view.client_requests) <= 2 and view.client_requests >= 2
    assert set(view.stages_ms) == {"queue", "prefill", "decode", "ttft", "e2e"}
    assert view.stages_ms["e2e"] <= view.client_e2e_ms
    assert view.tokens["generation_tokens"] == 8 * view.requests
    page = result.run.report_path.read_text()
    assert "The server&#x27;s own view" in page or "The server's own view" in page
    assert f"{view.requests} requests in" in page and "per request: " in page


def transformers_serve() -> str | None:
    """A `transformers serve` to test against: $LATLAB_TRANSFORMERS_SERVE, else the one in
    /work/build/venv-hf; None when neither is installed."""
    given = os.environ.get("LATLAB_TRANSFORMERS_SERVE")
    if given:
        return shutil.which(given) or given
    built = Path("/work/build/venv-hf/bin/transformers")
    return str(built) if built.is_file() else None


@pytest.mark.skipif(transformers_serve() is None,
                    reason="transformers serve is not installed: set LATLAB_TRANSFORMERS_SERVE "
                           "to its `transformers` binary (pip install 'transformers[serving]')")
def test_transformers_serve_end_to_end_with_the_defaults(tmp_path, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_HUB_DISABLE_UPDATE_CHECK", "HF_HUB_DISABLE_TELEMETRY"):
        monkeypatch.setenv(var, "1")
    model = tmp_path / "tiny"
    exported = CliRunner().invoke(app, ["model", "export", str(model), "--model", "tiny"])
    assert exported.exit_code == 0, exported.output
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    serve = ServerLaunch((transformers_serve(), "serve", "--host", "127.0.0.1", "--port",
                          str(port), "--device", "cpu", str(model)), url, f"{url}/health",
                         "transformers serve")
    with launched(serve, ready_timeout_s=180, log_path=tmp_path / "serve.log"):
        result = run_bench(BenchConfig(url=url, model=str(model), requests=12, workload=SMALL,
                                       arrivals=ArrivalConfig(users=3), out=tmp_path))
    s, a = result.summary, result.analysis
    assert not result.failed and s.ok == s.requests == 12, (s.failures, result.message)
    for r in result.run.read_records():  # the server's usage; its chunks hold whole words
        assert r.tokens_from_usage and 1 <= len(r.token_ns) <= r.completion_tokens <= 8
    assert any("refused ignore_eos, min_tokens" in w for w in s.warnings)
    assert any("12 of 12 streams ended without" in w for w in s.warnings)
    rules = {f.rule: f for f in a.findings}
    assert "one_at_a_time" in rules and "continuous-batching" in rules["one_at_a_time"].fix
    assert "failures" not in rules
