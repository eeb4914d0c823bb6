"""latlab serve through real HTTP: the official openai client, server timings, errors, metrics."""

from __future__ import annotations

import threading

import httpx
import openai
import orjson
import pytest
import torch
from engine_server import running_server
from processes import wait_until
from prometheus_client.parser import text_string_to_metric_families

from latlab.engine.engine import LLMEngine
from latlab.engine.loader import load_model, save_checkpoint
from latlab.records.server_timing import SERVER_TIMING_STAGES, ServerTiming


@pytest.fixture(scope="module")
def server():
    with running_server() as s:
        yield s


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def check_timing(timing: ServerTiming | None) -> None:
    assert timing is not None
    values = timing.to_json()
    assert values.pop("source", "latlab") == "latlab"
    assert set(values) == set(SERVER_TIMING_STAGES)
    parts = [values[k] for k in SERVER_TIMING_STAGES if k != "total"]
    assert all(v >= 0 for v in parts)
    assert sum(parts) <= values["total"] * 1.001 + 0.01
    assert values["prefill"] > 0 and values["decode"] > 0


def test_completion_non_streamed(client):
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt="def main():", max_tokens=7, temperature=0,
        extra_headers={"X-Request-Id": "req-42"}, extra_body={"ignore_eos": True})
    completion = raw.parse()
    assert raw.headers["x-request-id"] == "req-42"
    assert completion.id == "req-42"
    assert completion.usage.completion_tokens == 7
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].text
    check_timing(ServerTiming.from_header(raw.headers["server-timing"]))


def test_completion_streamed_with_usage_and_timing(client):
    chunks = list(client.completions.create(
        model="tiny", prompt="import os", max_tokens=9, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert text_chunks[-1].choices[0].finish_reason == "length"
    final = chunks[-1]
    assert final.choices == [] and final.usage.completion_tokens == 9
    assert final.usage.prompt_tokens_details.cached_tokens == 0
    check_timing(ServerTiming.from_json(final.model_extra["server_timing"]))
    # Greedy: the streamed text is the non-streamed text.
    whole = client.completions.create(model="tiny", prompt="import os", max_tokens=9,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text


def test_chat_streamed_and_not(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    chunks = list(client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True}))
    first = chunks[0]
    assert first.choices[0].delta.role == "assistant" and not first.choices[0].delta.content
    assert first.usage.completion_tokens == 0
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == streamed
    assert reply.usage.prompt_tokens == chunks[-1].usage.prompt_tokens > 0


def test_models_health_ready(server, client):
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert httpx.get(server.url + "/health").status_code == 200
    ready = httpx.get(server.url + "/ready")
    assert ready.status_code == 200 and ready.json()["startup_s"] > 0


@pytest.mark.parametrize("body, status, param", [
    (b'{"prompt": "x"', 400, None),
    (b'[1, 2]', 400, None),
    (b'{"prompt": 5}', 400, "prompt"),
    (b'{"prompt": "x", "temperature": "hot"}', 400, "temperature"),
    (b'{"prompt": "x", "max_tokens": -3}', 400, "max_tokens"),
    (b'{"prompt": "x", "max_tokens": 1000000000}', 400, "max_tokens"),
    (b'{"prompt": "x", "model": "gpt-5"}', 404, "model"),
    (b'{"prompt": "x", "n": 3}', 400, None),
    (b'{"prompt": "x", "repetition_penalty": 1.3}', 400, None),
    (b'{"prompt": ""}', 400, "prompt"),
    (b'{"prompt": [1, 999999]}', 400, "prompt"),
    (b'{"prompt": "x", "min_tokens": 9, "max_tokens": 2}', 400, "min_tokens"),
    (b'{"prompt": "' + b"word " * 400 + b'", "max_tokens": 2}', 400, "max_tokens"),
    (b'{"prompt": "' + b"x" * (5 << 20) + b'"}', 413, None),
])
def test_bad_input_gets_an_openai_error(server, body, status, param):
    r = httpx.post(server.url + "/v1/completions", content=body,
                   headers={"Content-Type": "application/json", "X-Request-Id": "bad-1"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["param"] == param
    assert r.headers["x-request-id"] == "bad-1"


def test_max_completion_tokens_is_the_limit_wherever_it_is_sent(server, caplog):
    """OpenAI's current name for the limit (AIPerf sends it to /v1/completions too); with
    max_tokens as well it wins, as in vLLM's chat; fields latlab does not know are logged."""
    bodies = [("/v1/completions", {"prompt": "import os"}),
              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})]
    with caplog.at_level("WARNING", logger="latlab.serve"):
        for path, body in bodies:
            for limit in ({"max_completion_tokens": 7}, {"max_completion_tokens": 5,
                                                         "max_tokens": 9}):
                r = httpx.post(server.url + path, json=body | limit | {
                    "ignore_eos": True, "temperature": 0, "mystery_knob": 1})
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == limit["max_completion_tokens"]
    ignored = [m for m in caplog.messages if "mystery_knob" in m]
    assert len(ignored) == 1  # once, not per request


def test_bad_chat_and_unknown_routes(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "robot", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.role"
    assert httpx.get(server.url + "/v1/nothing").json()["error"]["type"] == "not_found_error"
    assert httpx.get(server.url + "/v1/completions").status_code == 405


def test_metrics_parse(server, client):
    client.completions.create(model="tiny", prompt="x", max_tokens=3,
                              extra_body={"ignore_eos": True})
    text = httpx.get(server.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("latlab_time_to_first_token_seconds", "latlab_inter_token_latency_seconds",
                 "latlab_e2e_request_latency_seconds", "latlab_request_queue_time_seconds",
                 "latlab_request_prefill_time_seconds", "latlab_request_decode_time_seconds",
                 "latlab_num_requests_running", "latlab_num_requests_waiting",
                 "latlab_kv_cache_usage_perc", "latlab_generation_tokens", "latlab_requests"):
        assert name in families, name
    samples = {s.name: s.value for s in families["latlab_generation_tokens"].samples}
    assert samples["latlab_generation_tokens_total"] >= 3
    outcomes = {s.labels["outcome"] for s in families["latlab_requests"].samples}
    assert "length" in outcomes


def test_api_key_is_enforced():
    with running_server(api_key="s3cret") as s:
        assert httpx.get(s.url + "/v1/models").status_code == 401
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x"},
                       headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(s.url + "/health").status_code == 200
        with openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret", max_retries=0) as c:
            assert c.completions.create(model="tiny", prompt="x", max_tokens=2).usage


def test_not_ready_until_warmed_up(monkeypatch):
    release = threading.Event()
    warmup = LLMEngine.warmup

    def slow_warmup(self):
        assert release.wait(30)
        warmup(self)

    monkeypatch.setattr(LLMEngine, "warmup", slow_warmup)
    with running_server(wait_ready=False) as s:
        try:
            assert httpx.get(s.url + "/health").status_code == 200
            assert httpx.get(s.url + "/ready").status_code == 503
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "x"})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert "warming up" in r.json()["error"]["message"]
        finally:
            release.set()
        wait_until(lambda: httpx.get(s.url + "/ready").status_code == 200, what="readiness")
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "x"}).status_code == 200


def test_otel_file_gets_a_span_per_request_with_stage_events(tmp_path):
    path = tmp_path / "spans.jsonl"
    with running_server(otel_file=path) as s:
        for stream in (False, True):
            r = httpx.post(s.url + "/v1/completions", headers={"X-Request-Id": f"t-{stream}"},
                           json={"prompt": "x", "max_tokens": 3, "stream": stream})
            assert r.status_code == 200
    spans = [orjson.loads(line) for line in path.read_text().splitlines()]
    assert sorted(sp["attributes"]["gen_ai.request.id"] for sp in spans) == ["t-False", "t-True"]
    for span in spans:
        assert span["name"] == "llm_request" and span["kind"] == "SpanKind.SERVER"
        assert [e["name"] for e in span["events"]] == ["enqueued", "scheduled", "first_token",
                                                       "last_token"]
        assert span["attributes"]["gen_ai.usage.completion_tokens"] == 3
        assert span["attributes"]["gen_ai.latency.time_in_model_prefill"] > 0


def test_a_chat_template_that_rejects_the_messages_gives_400(tmp_path):
    tiny = load_model("tiny", torch.float32, seed=0)
    tiny.tokenizer.chat_template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first, please') }}"
        "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    folder = save_checkpoint(tiny, tmp_path / "model")
    with running_server(model=str(folder)) as s:
        r = httpx.post(s.url + "/v1/chat/completions", json={
            "messages": [{"role": "system", "content": "x"}], "max_tokens": 2})
        assert r.status_code == 400 and "user first, please" in r.json()["error"]["message"]
        r = httpx.post(s.url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert r.status_code == 200


def test_step_log_has_every_served_step_and_what_it_scheduled(tmp_path):
    """Each step that served is one line: every generated token was sampled in exactly one
    of them, every prompt token computed in one, and the steps follow one another."""
    from concurrent.futures import ThreadPoolExecutor

    from latlab.records.steps import read_step_log

    path = tmp_path / "steps.jsonl"
    prompts = ["one two three", "a much longer prompt than the first one " * 3, "x"]
    with running_server(settings={"step_log": path}) as s:
        def send(prompt):
            return httpx.post(s.url + "/v1/completions", timeout=60,
                              json={"prompt": prompt, "max_tokens": 5, "ignore_eos": True})

        with ThreadPoolExecutor(3) as pool:
            usages = [r.json()["usage"] for r in pool.map(send, prompts)]
    steps = read_step_log(path)
    assert sum(st.sampled for st in steps) == sum(u["completion_tokens"] for u in usages)
    # the last generated token is sampled but never computed again
    computed = sum(u["prompt_tokens"] + u["completion_tokens"] - 1 for u in usages)
    assert sum(st.tokens for st in steps) == computed
    assert all(st.decodes + st.prefills >= 1 and st.decodes <= st.tokens
               and st.end_ns > st.start_ns for st in steps)
    assert all(a.end_ns <= b.start_ns for a, b in zip(steps, steps[1:]))
