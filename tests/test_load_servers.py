"""The client against servers that behave like the real ones: one that closes the
connections it called keep-alive (llama.cpp), TGI's non-streamed timing headers, Ollama's
native stream; and the W3C trace context every request carries."""

import asyncio
import json
import threading
from pathlib import Path

import orjson
from aiohttp import web
from sse_server import DONE, Server, Step, completion, stream, usage_only

from latlab.load.request.client import Client
from latlab.load.request.config import ClientConfig
from latlab.load.workload.requests import RequestSpec
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.lengths import LengthDistribution
from latlab.records.timeline import RequestTimeline
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench

SERVERS = Path(__file__).parent / "fixtures" / "servers"
SMALL = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=8),
                       output_tokens=LengthDistribution(kind="fixed", a=2))
STEPS = [Step(0.002, completion("a")), Step(0.002, completion("b")),
         Step(0, usage_only(8, 2)), Step(0, DONE)]


class OneShotServer:
    """Serves one streamed request per connection and says Keep-Alive, then drops the
    connection when a second request arrives on it, before any response byte."""

    def __init__(self) -> None:
        self.served = self.dropped = 0

    async def __aenter__(self) -> "OneShotServer":
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        requests = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                await reader.readexactly(length)
                requests += 1
                if requests > 1:
                    self.dropped += 1
                    break
                body = b"".join(s.data for s in STEPS)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Keep-Alive: timeout=5, max=100\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
                self.served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def spec(i: int) -> RequestSpec:
    return RequestSpec(index=i, prompt="hi", messages=None, prompt_tokens=1, max_tokens=2)


async def send_all(url: str, n: int, **kw) -> list[RequestTimeline]:
    records = []
    async with Client(url, "m", ClientConfig(pool_size=1, **kw)) as client:
        for i in range(n):
            r = RequestTimeline(id=f"r{i}", index=i)
            await client.send(spec(i), r)
            records.append(r)
    return records


async def test_a_closed_keepalive_connection_is_retried_once_on_a_fresh_one():
    async with OneShotServer() as server:
        records = await send_all(server.url, 4)
    assert all(r.ok for r in records), [r.error for r in records]
    # the pool's connection dies after each answer: every second request finds it dead and
    # goes again on a fresh connection, the next opens a new pooled one
    assert [r.retries for r in records] == [0, 1, 0, 1]
    assert all(r.connection.new for r in records)  # the retry's connection is recorded
    assert server.dropped == 2 and server.served == 4


async def test_without_keepalive_nothing_needs_a_retry():
    async with OneShotServer() as server:
        records = await send_all(server.url, 3, keepalive=False)
    assert all(r.ok and r.retries == 0 for r in records) and server.dropped == 0


async def test_every_request_carries_its_own_trace_context():
    with Server(stream(STEPS)) as server:
        records = await send_all(server.url, 2)
        headers = [h["headers"] for h in server.received]
    for r, h in zip(records, headers):
        version, trace_id, parent, flags = h["traceparent"].split("-")
        assert (version, flags) == ("00", "01") and trace_id == r.trace_id
        assert len(trace_id) == 32 and len(parent) == 16 and h["X-Request-Id"] == r.id
    assert records[0].trace_id != records[1].trace_id


def test_the_retries_are_counted_and_explained_in_the_summary(tmp_path):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(OneShotServer().__aenter__(), loop).result(10)
    try:
        result = run_bench(BenchConfig(url=server.url, model="m", workload=SMALL, requests=12,
                                       duration_s=None, out=tmp_path,
                                       arrivals=ArrivalConfig(users=2)))
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert result.summary.ok == 12 and result.summary.retries >= 5
    assert any("fresh connection" in w and "--no-keepalive" in w for w in result.summary.warnings)


def test_tgi_timing_headers_of_non_streamed_answers(tmp_path):
    headers = json.loads((SERVERS / "tgi" / "headers.json").read_text())

    async def tgi(request: web.Request) -> web.Response:
        body = {"choices": [{"text": "ab", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 8, "completion_tokens": 2}}
        return web.json_response(body, headers=headers)

    with Server(tgi) as server:
        result = run_bench(BenchConfig(url=server.url, workload=SMALL, requests=3,
                                       duration_s=None, stream=False, out=tmp_path,
                                       arrivals=ArrivalConfig(users=1)))
        assert all(b["body"]["stream"] is False for b in server.received)
    records = result.run.read_records()
    assert all(r.ok and r.server.source == "tgi" and r.server.inference == 408 for r in records)
    assert all(len(r.token_ns) == 1 and r.token_counts == [2] for r in records)
    assert result.analysis.mean.components["inference"] == 408


def test_ollama_native_api(tmp_path):
    lines = (SERVERS / "ollama" / "chat_stream.ndjson").read_bytes().splitlines()
    final = orjson.loads((SERVERS / "ollama" / "generate_final.json").read_bytes())

    async def ollama(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        for text in ("Hel", "lo"):
            await resp.write(orjson.dumps({"response": text, "done": False}) + b"\n")
            await asyncio.sleep(0.002)
        await resp.write(orjson.dumps(final) + b"\n")
        await resp.write_eof()
        return resp

    server = Server(ollama)
    with server:
        app_routes = server.received
        result = run_bench(BenchConfig(url=server.url, model="gemma3", requests=2,
                                       duration_s=None, out=tmp_path,
                                       workload=SMALL.model_copy(update={"api": "ollama"}),
                                       arrivals=ArrivalConfig(users=1)))
    assert lines  # the chat fixture is read by tests/test_server_adapters.py
    assert {r["path"] for r in app_routes} == {"/api/generate"}
    body = app_routes[0]["body"]
    assert body["options"]["num_predict"] == 2 and body["raw"] is True and "prompt" in body
    records = result.run.read_records()
    assert all(r.ok and r.server.source == "ollama" and r.completion_tokens == 18
               for r in records)
    assert result.analysis.mean.components["model_load"] > 100
