"""`latlab observe` on the spans OpenTelemetry's own GenAI instrumentation exports
(`opentelemetry-instrumentation-openai-v2`, the official `openai` client, a BatchSpanProcessor
at the SDK's 5 s delay): examples/rag_app twice, one in front of a latlab serve that exports its
spans (calls joined), one in front of one that exports nothing (client only). Every call lands
in its own window while observe runs, and `--from` on the same spans (spans.jsonl, in the order
they arrived) gives the same windows and findings.

The live run needs the instrumentation (the `rag` extra); the recorded fixture
(tests/fixtures/observe/genai_spans.jsonl, from this test: LATLAB_RECORD_GENAI=PATH) keeps
the rest of the suite on its spans without it.
"""

import importlib.util
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest
from processes import running

from latlab.load.target.launch import ServerLaunch, embedded_engine, free_port, launched
from latlab.records.files import read_json
from latlab.records.folder import RunFolder
from latlab.records.observe import OBSERVE_JSON, WINDOWS, ObserveConfig, ObserveRecord
from latlab.services.observe import run_observe

APP = Path(__file__).resolve().parents[1] / "examples" / "rag_app" / "app.py"
FIXTURE = Path(__file__).parent / "fixtures" / "observe" / "genai_spans.jsonl"
LOAD_S = 24.0
SETTLE_S = 90.0
EXPORT_S = 7.0
WINDOW_S = 2
PACE_S = 0.25  # between a user's calls: the calls a window holds, not as many as the CPU allows


def rag_app(llm_url: str, port: int, otlp_endpoint: str, what: str) -> ServerLaunch:
    """examples/rag_app, its spans sent at the OpenTelemetry SDK's default 5 s delay."""
    url = f"http://127.0.0.1:{port}"
    return ServerLaunch((sys.executable, str(APP), "--llm-url", llm_url, "--port", str(port),
                         "--docs", "500", "--otlp-endpoint", otlp_endpoint,
                         "--export-delay-ms", "5000"), url, f"{url}/health", f"rag_app ({what})")


def windows(folder: Path) -> list[dict]:
    return [orjson.loads(line) for line in (folder / WINDOWS).read_bytes().splitlines()]


def same_windows(a: list[dict], b: list[dict]) -> None:
    assert [(w["start_ns"], w["calls"], w["partial"]) for w in a] == \
        [(w["start_ns"], w["calls"], w["partial"]) for w in b]
    assert [sorted(f["title"] for f in w["findings"]) for w in a] == \
        [sorted(f["title"] for f in w["findings"]) for w in b]


def chat(url: str, stop_at: float, user: int, sent: list) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            r = client.post("/v1/chat/completions", json={
                "model": "tiny", "max_tokens": 4 + n % 8, "stream": n % 2 == 0,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": f"question {user}.{n}?"}]})
            assert r.status_code == 200, r.text
            sent.append(url)
            time.sleep(PACE_S)


@pytest.mark.skipif(importlib.util.find_spec("opentelemetry.instrumentation.openai_v2") is None,
                    reason="needs opentelemetry-instrumentation-openai-v2 (pip install -e "
                           "'.[rag]'): the fixture test below covers its spans without it")
@pytest.mark.timeout(400)
def test_the_genai_instrumentations_calls_each_in_its_window_live_as_from_the_file(tmp_path):
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    sent: list[str] = []
    joined_port, alone_port = free_port(), free_port()
    with running(["observe", "--otlp-port", str(port), "--out", str(tmp_path / "live"),
                  "--window", str(WINDOW_S), "--keep-spans"]) as observe:
        with embedded_engine(["--model", "tiny", "--otlp-endpoint", endpoint]) as traced, \
                embedded_engine(["--model", "tiny"]) as silent, \
                launched(rag_app(traced.url, joined_port, endpoint, "joined"),
                         ready_timeout_s=90), \
                launched(rag_app(silent.url, alone_port, endpoint, "client only"),
                         ready_timeout_s=90):
            stop_at = time.monotonic() + LOAD_S
            users = [threading.Thread(target=chat, args=(f"http://127.0.0.1:{p}", stop_at,
                                                         i, sent))
                     for i, p in enumerate([joined_port, alone_port])]
            for u in users:
                u.start()
            for u in users:
                u.join()
            (folder,) = [p for p in (tmp_path / "live").iterdir() if p.is_dir()]
            # Windows are written once the watermark passes them: the trace wait (10 s while
            # it learns), 10 s more for a client-only call's other half, the exporters' 5 s.
            deadline = time.monotonic() + SETTLE_S
            while time.monotonic() < deadline and not (folder / WINDOWS).is_file():
                time.sleep(0.5)
            written_live = windows(folder)  # before the stop: closed by the watermark
            time.sleep(EXPORT_S)  # the applications' last batch, before they stop
    assert observe.returncode == 0, observe.err.decode()[-2000:]
    assert written_live, "no window was written while observe ran"
    assert all(w["calls"] for w in written_live)
    record = read_json(folder / OBSERVE_JSON, ObserveRecord)
    alone = sum(url.endswith(str(alone_port)) for url in sent)
    assert record.calls == len(sent) and record.unseen_model == alone
    assert record.late == 0 and record.split_traces == 0
    # Half the calls streamed, but this instrumentation's spans do not say which: unknown,
    # not "none streamed" (its stream wrapper sets no gen_ai.request.stream).
    assert (record.streamed, record.not_streamed, record.stream_unknown) == (0, 0, len(sent))
    live = windows(folder)
    assert sum(w["calls"] for w in live) == len(sent)
    again = run_observe(ObserveConfig(from_file=folder / "spans.jsonl", out=tmp_path / "from",
                                      window_s=WINDOW_S))
    same_windows(live, windows(again.run.path))
    records = RunFolder.open(folder).read_records()
    client_only = [r for r in records if r.server.model_call is not None]
    assert len(client_only) == alone
    if os.environ.get("LATLAB_RECORD_GENAI"):
        shutil.copy(folder / "spans.jsonl", os.environ["LATLAB_RECORD_GENAI"])


def test_the_recorded_genai_spans_each_call_in_its_window_and_client_only_unsplit(tmp_path):
    result = run_observe(ObserveConfig(from_file=FIXTURE, out=tmp_path, window_s=WINDOW_S))
    r = result.record
    assert r.calls > 50 and 0 < r.unseen_model < r.calls and r.late == 0
    assert sum(w.calls for w in result.windows) == r.calls
    assert (r.streamed, r.not_streamed, r.stream_unknown) == (0, 0, r.calls)
    a = result.analysis
    assert "model server (unsplit)" in a.mean.buckets()
    alone = [row for row in a.decomposed if row.record.server.model_call is not None]
    assert len(alone) == r.unseen_model
    for row in alone:
        assert row.parts.bucket("model server (unsplit)") > 0
        assert row.parts.bucket("queue & overhead") < 0.1 * row.parts.total
    unevaluated = {u.rule: u.needs for u in a.unevaluated}
    assert "calls observed from their spans carry none" in unevaluated["one_at_a_time"]
