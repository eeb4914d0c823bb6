"""bench against a server that never stops sending: one endless SSE event, an endless stream
of good events, an endless JSON body, an endless NDJSON line. Each request fails on its own
(`too_large`) and what bench holds stays bounded by the caps, whatever the server sends."""

import tracemalloc

import pytest
from aiohttp import web
from sse_server import Server, completion

from latlab.load.request.client import Client
from latlab.load.request.config import ClientConfig
from latlab.load.workload.requests import RequestSpec
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.lengths import LengthDistribution
from latlab.records.timeline import Outcome, RequestTimeline
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench

MIB = 1 << 20
EVENT_CAP, RESPONSE_CAP = 1 * MIB, 4 * MIB
SENT_AT_MOST = 64 * MIB  # what a hostile handler sends before it gives up (bounds the test)
PIECE = 64 << 10


def endless(first: bytes, then: bytes, content_type: str = "text/event-stream"):
    """A handler that sends `first`, then `then` again and again until the client leaves."""
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        await resp.write(first)
        sent = len(first)
        try:
            while sent < SENT_AT_MOST:
                await resp.write(then)
                sent += len(then)
        except (ConnectionError, RuntimeError):
            pass  # the client stopped reading and closed the connection
        return resp

    return handle


SPEC = RequestSpec(index=0, prompt="hi", messages=None, prompt_tokens=1, max_tokens=4)
HANDLERS = {
    "one endless SSE event": (endless(b'data: {"choices": [{"text": "', b"x" * PIECE),
                              "completions", True),
    "endless good events": (endless(b"", completion("a") * 1000), "completions", True),
    "an endless JSON body": (endless(b'{"choices": [{"text": "', b"x" * PIECE,
                                     "application/json"), "completions", False),
    "one endless NDJSON line": (endless(b'{"response": "', b"x" * PIECE,
                                        "application/x-ndjson"), "ollama", True),
}


@pytest.mark.parametrize("name", HANDLERS)
async def test_an_endless_answer_fails_as_too_large_within_the_caps(name):
    handler, api, streamed = HANDLERS[name]
    r = RequestTimeline(id="r", index=0, scheduled_ns=None)
    with Server(handler) as server:
        tracemalloc.start()
        try:
            async with Client(server.url, "m", ClientConfig(
                    api=api, stream=streamed, max_event_bytes=EVENT_CAP,
                    max_response_bytes=RESPONSE_CAP)) as c:
                await c.send(SPEC, r)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert r.outcome == Outcome.TOO_LARGE, (r.outcome, r.error)
    assert "MiB" in r.error and "--max-" in r.error
    # bounded by the caps, not by the 64 MiB the server was ready to send
    assert peak < 3 * RESPONSE_CAP, f"{peak / MIB:.1f} MiB"


def test_a_run_against_an_endless_server_ends_with_its_own_failure_class(tmp_path):
    handler = endless(b'data: {"choices": [{"text": "', b"x" * PIECE)
    small = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=4),
                           output_tokens=LengthDistribution(kind="fixed", a=2))
    with Server(handler) as server:
        result = run_bench(BenchConfig(url=server.url, model="m", workload=small, requests=3,
                                       max_event_mib=0.5, out=tmp_path,
                                       arrivals=ArrivalConfig(users=1)))
    assert result.summary.failures == {"too_large": 3}
    assert all("--max-event-mib" in r.error for r in result.run.read_records())
