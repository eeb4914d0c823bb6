"""`latlab observe` end to end: a plain `openai` client's requests to latlab serve explained
from its spans alone (the command, stopped with Ctrl-C); a Collector's file of a day with a
peak, with a line it cannot read; the observed folder read by report, runs, compare and
predict --replay; bad bodies and a port in use."""

import gzip
import socket
import subprocess
import time

import httpx
import openai
import orjson
import pytest
from processes import running
from sim_helpers import calibration
from typer.testing import CliRunner

from latlab.analysis import analyze
from latlab.analysis.decompose import Quality
from latlab.cli import app
from latlab.load.target.launch import embedded_engine, free_port
from latlab.records.config import RunConfig
from latlab.records.files import read_json
from latlab.records.folder import RunFolder
from latlab.records.observe import OBSERVE_JSON, TRACE_JSONL, WINDOWS, ObserveRecord
from latlab.sim import calibration as calibrations
from latlab.store import RunStore

HOUR_S = 3600
READY_S = 60


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def wait_listening(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline and process.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"latlab observe did not listen on {port}")


def test_a_plain_openai_clients_requests_are_all_explained_from_the_servers_spans(tmp_path):
    port = free_port()
    in_band = {}
    with running(["observe", "--otlp-port", str(port), "--out", str(tmp_path), "--window",
                  "2", "--trace-wait", "1"]) as observe:
        wait_listening(port, observe.process)
        with embedded_engine(["--model", "tiny", "--otlp-endpoint",
                           f"http://127.0.0.1:{port}/v1/traces"]) as engine:
            client = openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused")
            for i in range(30):
                stream = client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"question {i}"}],
                    max_tokens=4 + i % 5, stream=True, stream_options={"include_usage": True})
                for chunk in stream:  # latlab serve's own timings ride on the usage chunk
                    if chunk.usage is not None:
                        in_band[chunk.id] = chunk.model_extra["server_timing"]
        # the server's exporter flushed its spans as it stopped; Ctrl-C as the block ends
    assert observe.returncode == 0, observe.err.decode()
    assert b"30 LLM calls" in observe.out and b"Where the time goes" in observe.out
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = RunFolder.open(folder)
    assert run.read_config().kind == "observed"
    records = {r.id: r for r in run.read_records()}
    assert set(records) == set(in_band)  # every request, each by the id the client saw
    for rid, timing in in_band.items():
        server = records[rid].server
        for stage in ("preprocess", "queue", "prefill", "decode", "postprocess"):
            assert getattr(server, stage) == pytest.approx(timing[stage], abs=0.01)
    a = analyze(run)
    assert a.ok.sum() == 30
    for stage in ("queue", "prefill", "decode"):
        assert a.mean.quality[stage] == Quality.EXACT and a.mean.coverage[stage] == 1.0
    assert a.mean.quality["network"] == Quality.UNAVAILABLE  # no client span: not seen
    report = invoke("report", folder)
    assert report.exit_code == 0 and "Where the time goes" in report.output
    assert read_json(folder / OBSERVE_JSON, ObserveRecord).calls == 30


def llm_line(start_ns: int, spans: list[tuple[str, int, float, float]]) -> bytes:
    """An OTLP/JSON export request of latlab serve's spans, as a Collector's file exporter
    writes it: (trace id, start offset ns, queue s, e2e s) each."""
    def attr(key, value):
        if isinstance(value, str):
            return {"key": key, "value": {"stringValue": value}}
        if isinstance(value, int):
            return {"key": key, "value": {"intValue": str(value)}}
        return {"key": key, "value": {"doubleValue": value}}

    return orjson.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name",
                                     "value": {"stringValue": "latlab-serve"}}]},
        "scopeSpans": [{"scope": {"name": "latlab.server"}, "spans": [{
            "traceId": trace, "spanId": trace[16:], "name": "llm_request", "kind": 2,
            "startTimeUnixNano": str(start_ns + at), "endTimeUnixNano": str(start_ns + at +
                                                                           int(e2e * 1e9)),
            "attributes": [attr("gen_ai.request.id", f"chatcmpl-{trace}"),
                           attr("gen_ai.usage.prompt_tokens", 200),
                           attr("gen_ai.usage.completion_tokens", 50),
                           attr("gen_ai.latency.time_in_queue", queue),
                           attr("gen_ai.latency.time_to_first_token", queue + 0.05),
                           attr("gen_ai.latency.time_in_model_prefill", 0.05),
                           attr("gen_ai.latency.time_in_model_decode", e2e - queue - 0.05),
                           attr("gen_ai.latency.e2e", e2e)]}
            for trace, at, queue, e2e in spans]}]}]}) + b"\n"


def day_file(path, start_ns: int) -> int:
    """Twelve minutes of a service: 1 call/s, then 4 calls/s (the peak, when calls queue for
    1.5 s), then 1 call/s again; 50 calls a line. Returns the calls."""
    calls = []
    for minute in range(12):
        rate = 4 if 4 <= minute < 8 else 1
        queue = 1.5 if rate == 4 else 0.01
        calls += [(f"{len(calls) + i + 1:032x}", int((minute * 60 + i / rate) * 1e9), queue,
                   queue + 0.5) for i in range(60 * rate)]
    with open(path, "wb") as f:
        for i in range(0, len(calls), 50):
            f.write(llm_line(start_ns, calls[i:i + 50]))
            if i == 500:
                f.write(b"{this line was cut off\n")
    return len(calls)


def test_a_collectors_file_of_a_day_with_a_peak(tmp_path):
    start = 1_790_000_040 * 10**9  # a minute boundary: the windows are the minutes
    calls = day_file(tmp_path / "spans.jsonl", start)
    out = tmp_path / "runs"
    r = invoke("observe", "--from", tmp_path / "spans.jsonl", "--out", out, "--window", 60)
    assert r.exit_code == 0, r.output
    assert f"{calls:,} LLM calls" in r.output
    assert "latency explodes at peak hours" in r.output
    (stored,) = RunStore(out).list(kind="observed")
    folder = stored.path
    record = read_json(folder / OBSERVE_JSON, ObserveRecord)
    assert record.rejected == 1 and "line 12" in record.first_rejection
    windows = [orjson.loads(line) for line in (folder / WINDOWS).read_bytes().splitlines()]
    assert len(windows) == 12 and [w["calls"] for w in windows] == [60] * 4 + [240] * 4 + [60] * 4
    peak = [w for w in windows if w["calls"] == 240]
    assert all(w["shares"]["queue & overhead"] > 0.6 for w in peak)
    rows = [orjson.loads(line) for line in (folder / TRACE_JSONL).read_bytes().splitlines()]
    assert len(rows) == calls and rows[0]["timestamp"] == 0
    assert rows[-1]["timestamp"] == pytest.approx(11 * 60 + 59, abs=0.01)
    config = RunConfig.model_validate_json((folder / "config.json").read_bytes())
    assert config.bench.arrivals.rate == pytest.approx((calls - 1) / (12 * 60 - 1), rel=0.01)
    assert config.bench.workload.output_tokens.a == 50
    assert "--rate 2" in r.output  # the fitted workload's flags

    assert "observed" in invoke("runs", "--runs-dir", out).output
    cal = calibrations.save(calibration(), tmp_path / "cal.json")
    predicted = invoke("predict", "--calibration", cal, "--replay", folder, "--out", out,
                       "--name", "replayed", "--no-test-advice")
    assert predicted.exit_code == 0, predicted.output
    (replayed,) = [p for p in out.iterdir() if p.name.endswith("replayed")]
    assert len(RunFolder(replayed).read_records()) == calls
    compared = invoke("compare", folder, replayed)
    assert compared.exit_code in (0, 1), compared.output  # a verdict, not an error
    assert "Traceback" not in compared.output


def test_bad_bodies_gzip_and_a_port_in_use(tmp_path):
    port = free_port()
    with running(["observe", "--otlp-port", str(port), "--out", str(tmp_path),
                  "--trace-wait", "0"], timeout_s=60) as observe:
        wait_listening(port, observe.process)
        url = f"http://127.0.0.1:{port}/v1/traces"
        line = llm_line(time.time_ns(), [("ab" * 16, 0, 0.01, 0.2)])
        ok = httpx.post(url, content=gzip.compress(line), timeout=10,
                        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        garbage = httpx.post(url, content=b"\x00garbage", timeout=10,
                             headers={"Content-Type": "application/x-protobuf"})
        busy = invoke("observe", "--otlp-port", port, "--out", tmp_path / "second")
    assert ok.status_code == 200 and garbage.status_code == 400
    assert busy.exit_code == 2 and "--otlp-port" in busy.output and "Traceback" not in busy.output
    assert observe.returncode == 0, observe.err.decode()
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir() and p.name != "second"]
    record = read_json(folder / OBSERVE_JSON, ObserveRecord)
    assert (record.calls, record.rejected) == (1, 1)
    assert "not an OTLP trace export" in record.first_rejection
    assert b"1 bodies or lines held no spans" in observe.out
