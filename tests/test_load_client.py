"""The client against in-test servers with known timings: what each metric definition gives."""

import asyncio
import sys

import pytest
from aiohttp import web
from sse_server import DONE, Server, Step, chat, completion, sse, status, stream, strict, usage_only

from latlab.load.request.client import Client
from latlab.load.request.config import ClientConfig
from latlab.load.request.errors import error_message
from latlab.load.target.discovery import discover
from latlab.load.workload.requests import RequestSpec
from latlab.metrics.request import request_metrics
from latlab.records.timeline import Outcome, RequestTimeline

MS = 1_000_000
TIMING = {"preprocess": 0.5, "queue": 1.0, "prefill": 45.0, "decode": 60.0, "postprocess": 0.2,
          "total": 106.7}


def spec(index: int = 0, **kw) -> RequestSpec:
    fields = dict(index=index, prompt="hello there", messages=None, prompt_tokens=2, max_tokens=8)
    return RequestSpec(**(fields | kw))


def chat_spec(**kw) -> RequestSpec:
    return spec(prompt=None, messages=[{"role": "user", "content": "hi"}], **kw)


def usage(n: int) -> dict:
    return {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}


async def send(url: str, request: RequestSpec, api: str = "completions", **kw) -> RequestTimeline:
    r = RequestTimeline(id=f"req-{request.index}", index=request.index, scheduled_ns=None)
    async with Client(url, "fake-model", ClientConfig(api=api, **kw)) as client:
        await client.send(request, r)
    return r


# A chat stream: a role-only delta at once, the first token after 50 ms, then an event every
# 10 ms; the third content event carries 3 tokens (cumulative usage per chunk); then a final
# usage-only event with server timings, then [DONE].
CHAT_STEPS = [
    Step(0, chat({"role": "assistant", "content": ""}, usage(0))),
    Step(0.05, chat({"content": "a"}, usage(1))),
    Step(0.01, chat({"content": "b"}, usage(2))),
    Step(0.01, chat({"content": "cde"}, usage(5))),
    Step(0.01, chat({"content": "f"}, usage(6))),
    Step(0.01, chat({"content": ""}, usage(6))),
    Step(0, usage_only(7, 6, TIMING, cached=4)),
    Step(0, DONE),
]


async def test_chat_stream_follows_the_definitions():
    with Server(stream(CHAT_STEPS)) as server:
        r = await send(server.url, chat_spec(), api="chat")
    assert r.ok, r.error
    assert r.status == 200
    # the role-only delta and the empty content are not token events; one event carries 3
    assert r.token_counts == [1, 1, 3, 1]
    assert len(r.token_ns) == 4
    assert r.first_token_ns == r.token_ns[0] and r.last_token_ns == r.token_ns[-1]
    assert r.first_token_ns - r.sent_ns >= 50 * MS  # the server slept 50 ms before it
    assert r.sent_ns <= r.headers_ns <= r.first_token_ns <= r.usage_ns <= r.done_ns
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (7, 6, 4)
    assert r.tokens_from_usage
    assert r.server.prefill == 45.0 and r.server.total == 106.7
    m = request_metrics(r)
    t = r.token_ns
    assert m.ttft == (t[0] - r.sent_ns) / MS
    assert m.chunk_gaps == pytest.approx([(b - a) / MS for a, b in zip(t, t[1:])])
    third = (t[2] - t[1]) / MS / 3
    assert m.itl == pytest.approx([(t[1] - t[0]) / MS, third, third, third, (t[3] - t[2]) / MS])
    assert m.tpot == pytest.approx((t[3] - t[0]) / MS / 5)
    assert m.e2e == (r.done_ns - r.sent_ns) / MS


async def test_without_per_chunk_usage_each_event_is_one_token_and_usage_counts():
    steps = [Step(0, completion("")), Step(0.02, completion("x")), Step(0.005, completion("yy")),
             Step(0, completion("z")), Step(0, usage_only(7, 5)), Step(0, DONE)]
    with Server(stream(steps)) as server:
        r = await send(server.url, spec(), continuous_usage=False)
        body = server.received[0]["body"]
    assert r.ok and r.token_counts == [1, 1, 1]
    assert r.completion_tokens == 5 and r.output_tokens == 5 and r.tokens_from_usage
    assert body["stream_options"] == {"include_usage": True}
    assert r.first_token_ns - r.sent_ns >= 20 * MS


async def test_request_carries_id_labels_and_length_controls():
    steps = [Step(0, completion("a", usage(1))), Step(0, usage_only(7, 1)), Step(0, DONE)]
    with Server(stream(steps)) as server:
        await send(server.url, spec(index=3, tenant="acme", priority=2, max_tokens=8))
        got = server.received[0]
    body, headers = got["body"], got["headers"]
    assert headers["X-Request-Id"] == "req-3"
    assert body["user"] == "acme" and body["priority"] == 2
    assert body["max_tokens"] == 8 and body["min_tokens"] == 8 and body["ignore_eos"] is True
    assert body["stream"] is True and body["prompt"] == "hello there"
    assert body["model"] == "fake-model"
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


async def test_fields_a_strict_server_refuses_are_dropped_for_the_run():
    with Server(strict()) as server:
        async with Client(server.url, "m", ClientConfig()) as client:
            first, second = (RequestTimeline(id=f"r{i}", index=i) for i in range(2))
            await client.send(spec(priority=1), first)
            await client.send(spec(index=1, priority=1), second)
        bodies = [got["body"] for got in server.received]
    assert first.ok and second.ok and first.completion_tokens == 8, first.error
    refused = {"ignore_eos", "min_tokens", "priority", "continuous_usage_stats"}
    assert set(client.learned.refused) == refused and client.learned.resent == 1
    assert "Extra inputs are not permitted" in client.learned.refused["ignore_eos"]
    assert refused <= set(bodies[0]) | set(bodies[0]["stream_options"])
    assert bodies[1] == bodies[2] | {"prompt": "hello there"}  # asked again at once, then never
    assert bodies[1]["stream_options"] == {"include_usage": True}  # only the refused option
    assert not refused & set(bodies[2]) and bodies[2]["max_tokens"] == 8


async def test_a_refusal_that_names_no_field_of_latlabs_is_a_failure():
    refusal = {"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}}
    with Server(status(400, refusal)) as server:
        async with Client(server.url, "m", ClientConfig()) as client:
            r = RequestTimeline(id="r", index=0)
            await client.send(spec(), r)
    assert r.outcome == Outcome.HTTP_4XX and not client.learned.refused
    assert len(server.received) == 1


async def test_server_timing_header_is_read_when_the_stream_has_none():
    header = "queue;dur=3.5, prefill;dur=20, total;dur=30"
    steps = [Step(0, completion("a")), Step(0, usage_only(7, 1)), Step(0, DONE)]
    with Server(stream(steps, headers={"Server-Timing": header})) as server:
        r = await send(server.url, spec())
    assert r.ok and r.server.queue == 3.5 and r.server.prefill == 20.0 and r.server.decode is None


async def test_sse_framing_variants_are_parsed():
    raw = (b": keep-alive comment\r\n\r\n"
           b"event: message\r\ndata: {\"choices\": [{\"text\": \"a\"}]}\r\n\r\n"
           b"data:{\"choices\": [{\"text\": \"b\"}]}\n\n"
           + usage_only(7, 2) + DONE)
    with Server(stream([Step(0, raw[:37]), Step(0.005, raw[37:])])) as server:
        r = await send(server.url, spec())
    assert r.ok, r.error
    assert r.token_counts == [1, 1] and r.completion_tokens == 2


@pytest.mark.parametrize("code,outcome", [(429, Outcome.HTTP_429), (401, Outcome.HTTP_4XX),
                                          (404, Outcome.HTTP_4XX), (503, Outcome.HTTP_5XX)])
async def test_http_errors_are_classified_with_the_body(code, outcome):
    with Server(status(code, {"error": {"message": "nope"}})) as server:
        r = await send(server.url, spec())
    assert r.outcome == outcome and r.status == code
    assert f"HTTP {code}" in r.error and "nope" in r.error
    assert r.first_token_ns is None and r.done_ns >= r.sent_ns


PYTHON_501 = b"""<!DOCTYPE HTML>
<html lang="en">
    <head>
        <meta charset="utf-8">
        <title>Error response</title>
    </head>
    <body>
        <h1>Error response</h1>
        <p>Error code: 501</p>
        <p>Message: Unsupported method (&#x27;POST&#x27;).</p>
    </body>
</html>"""


def test_error_bodies_become_one_short_line():
    assert error_message(PYTHON_501) == "Error response Error code: 501 Message: Unsupported " \
                                        "method ('POST')."
    assert error_message(b'{"error": {"message": "too long", "type": "x"}}') == "too long"
    assert error_message(b'{"error": "Input validation error"}') == "Input validation error"
    assert error_message(b'{"detail": "Not Found"}') == "Not Found"
    assert len(error_message(b"x" * 2000)) == 300


async def test_stream_cut_midway_is_stream_broken_and_keeps_its_tokens():
    steps = [Step(0, completion("a")), Step(0.01, completion("b")), Step(0.01, None)]
    with Server(stream(steps)) as server:
        r = await send(server.url, spec())
    assert r.outcome == Outcome.STREAM_BROKEN
    assert r.token_counts == [1, 1]
    assert request_metrics(r).e2e is None


async def test_a_stream_that_ends_after_its_usage_without_done_is_complete():
    steps = [Step(0, completion("a")), Step(0.02, usage_only(7, 1))]
    r = RequestTimeline(id="r", index=0)
    with Server(stream(steps)) as server:
        async with Client(server.url, "m", ClientConfig()) as client:
            await client.send(spec(), r)
    assert r.ok and r.completion_tokens == 1 and client.learned.without_done == 1
    assert r.done_ns == r.usage_ns  # done when its last event came


async def test_a_stream_that_ends_mid_answer_without_done_is_broken():
    steps = [Step(0, completion("a")), Step(0, completion("b"))]
    with Server(stream(steps)) as server:
        r = await send(server.url, spec())
    assert r.outcome == Outcome.STREAM_BROKEN and "[DONE]" in r.error
    assert "no finish_reason" in r.error and r.token_counts == [1, 1]


@pytest.mark.parametrize("payload", [b"data: {not json\n\n", sse(b"[1, 2]"),
                                     sse({"choices": "nope"}), b"data: hello\n\n"])
async def test_malformed_payload_is_bad_payload(payload):
    with Server(stream([Step(0, completion("a")), Step(0, payload), Step(0, DONE)])) as server:
        r = await send(server.url, spec())
    assert r.outcome == Outcome.BAD_PAYLOAD and "malformed" in r.error
    assert r.token_counts == [1]


async def test_error_event_mid_stream_is_stream_broken():
    steps = [Step(0, completion("a")), Step(0, sse({"error": {"message": "engine died"}})),
             Step(0, DONE)]
    with Server(stream(steps)) as server:
        r = await send(server.url, spec())
    assert r.outcome == Outcome.STREAM_BROKEN and "engine died" in r.error


async def test_a_json_answer_to_a_stream_request_is_bad_payload():
    async def handle(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"text": "all at once"}]})

    with Server(handle) as server:
        r = await send(server.url, spec())
    assert r.outcome == Outcome.BAD_PAYLOAD and "Content-Type" in r.error


async def test_connection_refused_has_no_send_time():
    with Server(status(200)) as server:
        url = server.url
    r = await send(url, spec())
    assert r.outcome == Outcome.CONNECTION_REFUSED
    assert r.sent_ns is None and r.done_ns is not None


async def test_timeout():
    with Server(stream([Step(0, completion("a")), Step(2.0, DONE)])) as server:
        r = await send(server.url, spec(), timeout_s=0.3)
    assert r.outcome == Outcome.TIMEOUT and r.token_counts == [1]


async def test_connection_phases_new_then_reused():
    steps = [Step(0, completion("a")), Step(0, usage_only(7, 1)), Step(0, DONE)]
    with Server(stream(steps)) as server:
        async with Client(server.url, "fake-model", ClientConfig(pool_size=1)) as client:
            records = []
            for i in range(2):
                r = RequestTimeline(id=f"r{i}", index=i)
                await client.send(spec(i), r)
                records.append(r)
    first, second = records
    assert first.ok and second.ok
    assert first.connection.new and first.connection.connect_ns > 0
    assert not second.connection.new and second.connection.setup_ns == 0
    if sys.platform == "linux":  # the kernel's round trip of the handshake, within its connect
        assert 0 < first.connection.rtt_ns <= first.connection.connect_ns
        assert second.connection.rtt_ns is None


async def test_cancel_records_cancelled():
    with Server(stream([Step(0, completion("a")), Step(5.0, DONE)])) as server:
        async with Client(server.url, "fake-model", ClientConfig()) as client:
            r = RequestTimeline(id="r", index=0)
            task = asyncio.create_task(client.send(spec(), r))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert r.outcome == Outcome.CANCELLED and r.done_ns is not None


async def test_discover_takes_the_first_listed_model():
    with Server(status(200), model="m-1") as server:
        model, _, _ = await discover(server.url)
    assert model == "m-1"
