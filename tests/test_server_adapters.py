"""Each server's own timings, read from its real responses (tests/fixtures/servers)."""

import json
from pathlib import Path

import pytest
from multidict import CIMultiDict

from latlab.analysis.decompose import Quality, decompose
from latlab.load.request.ollama import NdjsonParser
from latlab.load.request.server_timing import (
    ServerKind,
    context_length,
    detect,
    from_event,
    from_headers,
)
from latlab.load.request.sse import StreamParser
from latlab.load.telemetry.scrape import parse
from latlab.records.timeline import RequestTimeline

SERVERS = Path(__file__).parent / "fixtures" / "servers"
MS = 1_000_000


def recorded(name: str) -> dict:
    return json.loads((SERVERS / "llamacpp" / f"{name}.json").read_text())


def replay(body: str, chat: bool = False, parser=StreamParser) -> RequestTimeline:
    """Feed a recorded stream event by event, 1 ms apart, into a fresh timeline."""
    r = RequestTimeline(id="r", index=0, sent_ns=0, scheduled_ns=0)
    p = parser(r, chat)
    sep = "\n\n" if parser is StreamParser else "\n"
    for i, event in enumerate(e for e in body.split(sep) if e.strip()):
        p.feed((event + sep).encode(), (i + 1) * MS)
    p.finish()
    r.done_ns = r.done_ns or r.usage_ns
    return r


def test_llamacpp_streams_carry_prefill_decode_and_cached_tokens():
    exchange = recorded("stream_completions")
    final = json.loads(exchange["body"].strip().split("\n\n")[-2].removeprefix("data: "))
    r = replay(exchange["body"])
    assert r.ok and r.server.source == "llamacpp"
    assert r.server.prefill == final["timings"]["prompt_ms"]
    assert r.server.decode == final["timings"]["predicted_ms"]
    assert r.server.total is None and r.server.queue is None
    assert r.cached_tokens == final["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert r.completion_tokens == 6 and len(r.token_ns) == 6  # the final "" is not a token
    d = decompose(r)
    assert d.quality("prefill") == Quality.EXACT and d.quality("queue") == Quality.DERIVED


def test_timings_per_token_counts_tokens_per_chunk_from_predicted_n():
    exchange = recorded("stream_timings_per_token")
    assert exchange["request"]["body"]["timings_per_token"] is True
    r = replay(exchange["body"])
    assert r.token_counts == [1] * 6 and sum(r.token_counts) == r.completion_tokens
    assert r.cached_tokens == 5  # the same prompt again: llama.cpp kept it


def test_llamacpp_chat_stream_and_non_streamed_body():
    chat = replay(recorded("stream_chat")["body"], chat=True)
    assert chat.ok and chat.completion_tokens == 6 and chat.server.prefill > 0
    for name in ("nonstream_completions", "nonstream_chat"):
        body = json.loads(recorded(name)["body"])
        timing = from_event(body)
        assert timing.source == "llamacpp" and timing.prefill == body["timings"]["prompt_ms"]


def test_the_server_kind_is_told_by_its_model_list():
    assert detect(json.loads(recorded("models")["body"])) == ServerKind.LLAMACPP
    assert detect({"data": [{"id": "m", "owned_by": "vllm"}]}) == ServerKind.VLLM
    assert detect({"data": [{"id": "m"}]}) == ServerKind.OPENAI


def test_the_context_length_each_server_lists():
    llamacpp = json.loads(recorded("models")["body"])
    assert context_length(llamacpp, "default-f32.gguf") == 1024  # meta.n_ctx, not n_ctx_train
    vllm = {"data": [{"id": "a", "max_model_len": 4096}, {"id": "b", "max_model_len": 8192}]}
    assert context_length(vllm, "b") == 8192
    assert context_length(vllm, "c") is None
    assert context_length({"data": [{"id": "m", "max_model_len": "big"}]}, "m") is None


def test_tgi_headers_of_a_non_streamed_response():
    headers = CIMultiDict(json.loads((SERVERS / "tgi" / "headers.json").read_text()))
    timing = from_headers(headers)
    assert timing.source == "tgi"
    assert (timing.preprocess, timing.queue, timing.inference, timing.total) == (1, 3, 408, 412)
    assert timing.prefill is None and timing.decode is None  # TGI does not split them


def test_ollama_final_object_and_chat_stream():
    final = json.loads((SERVERS / "ollama" / "generate_final.json").read_text())
    timing = from_event(final)
    assert timing.source == "ollama"
    assert timing.model_load == pytest.approx(101.397084)
    assert timing.prefill == pytest.approx(13.074791) and timing.total == pytest.approx(174.560334)
    r = replay((SERVERS / "ollama" / "chat_stream.ndjson").read_text(), chat=True,
               parser=NdjsonParser)
    assert r.ok and len(r.token_ns) == 2 and r.completion_tokens == 17
    assert r.prompt_tokens == 10 and r.server.decode == pytest.approx(4032.296)
    d = decompose(r)
    assert d.quality("model_load") == Quality.EXACT
    assert d.ms("queue") == pytest.approx(4353.6199 - 63.9153 - 246.847 - 4032.296, abs=1e-3)


def test_a_stream_without_its_final_object_is_broken():
    with pytest.raises(Exception, match="final object"):
        replay('{"message":{"content":"a"},"done":false}', chat=True, parser=NdjsonParser)


def test_prometheus_scrapes_map_each_servers_names():
    text = recorded("metrics")["body"]
    scrape = parse(text, 7)
    assert scrape.t_ns == 7 and scrape.values["running"] == 0
    assert "llamacpp:prompt_tokens_total" in scrape.raw
    vllm = parse("# TYPE vllm:num_requests_waiting gauge\n"
                 'vllm:num_requests_waiting{model_name="m"} 5\n'
                 "# TYPE vllm:kv_cache_usage_perc gauge\n"
                 'vllm:kv_cache_usage_perc{model_name="m"} 0.75\n', 0)
    assert vllm.values == {"waiting": 5.0, "kv_usage": 0.75}
