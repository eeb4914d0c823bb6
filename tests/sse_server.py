"""Small in-test OpenAI-style streaming servers with known timings (127.0.0.1, port 0).

Each server runs its own event loop in a thread, so sync tests (the CLI, `run_bench`) and
async tests (the client) can both use it. A handler scripts one response: the events, the
sleep before each, a status, or a cut connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def completion(text: str, usage: dict | None = None, **extra: Any) -> bytes:
    return sse({"id": "cmpl-1", "object": "text_completion",
                "choices": [{"index": 0, "text": text, "finish_reason": None}],
                "usage": usage, **extra})


def chat(delta: dict, usage: dict | None = None) -> bytes:
    return sse({"id": "chat-1", "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}], "usage": usage})


def usage_only(prompt: int, completion_tokens: int, server_timing: dict | None = None,
               cached: int | None = None) -> bytes:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                             "total_tokens": prompt + completion_tokens}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    body: dict[str, Any] = {"id": "cmpl-1", "choices": [], "usage": usage}
    if server_timing is not None:
        body["server_timing"] = server_timing
    return sse(body)


@dataclass
class Step:
    """Sleep `delay_s`, then write `data` (or cut the connection when `data` is None)."""

    delay_s: float
    data: bytes | None


def stream(steps: list[Step], headers: dict[str, str] | None = None) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **(headers or {})})
        await resp.prepare(request)
        for step in steps:
            if step.delay_s:
                await asyncio.sleep(step.delay_s)
            if step.data is None:
                request.transport.close()
                return resp
            await resp.write(step.data)
        await resp.write_eof()
        return resp

    return handle


def caching(cold_s: float, warm_s: float) -> Handler:
    """A server with a prompt cache it never reports (as vLLM's prefix cache in its default
    usage): a prompt it has seen gets its first token after `warm_s`, a new one after
    `cold_s` (its prefill); usage carries no cached tokens."""
    seen: set[str] = set()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = str(body.get("prompt") or body.get("messages"))
        delay = warm_s if prompt in seen else cold_s
        seen.add(prompt)
        return await stream([Step(delay, completion("a")), Step(0.002, completion("b")),
                             Step(0, usage_only(16, 2)), Step(0, DONE)])(request)

    return handle


def status(code: int, body: dict | None = None) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        return web.json_response(body or {"error": {"message": f"status {code}"}}, status=code)

    return handle


# The fields of OpenAI's completions and chat request bodies: a strict server takes no other.
OPENAI_FIELDS = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream",
                 "stream_options", "temperature", "top_p", "n", "stop", "seed", "user",
                 "logprobs", "top_logprobs", "echo", "suffix", "best_of", "presence_penalty",
                 "frequency_penalty", "logit_bias", "response_format", "tools", "tool_choice",
                 "parallel_tool_calls", "service_tier", "store", "metadata"}
STREAM_OPTIONS = {"include_usage", "include_obfuscation"}


def strict(eos_after: int | None = None, gap_s: float = 0.0) -> Handler:
    """A server that keeps to OpenAI's schema, as `transformers serve` does: a FastAPI-style
    422 naming every field outside it, a stream that ends after the chunk with the
    finish_reason and the usage, without [DONE]; its model stops by itself after
    `eos_after` tokens (None: only at max_tokens)."""
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        extra = [["body", name] for name in sorted(set(body) - OPENAI_FIELDS)]
        extra += [["body", "stream_options", name] for name in
                  sorted(set(body.get("stream_options") or {}) - STREAM_OPTIONS)]
        if extra:
            return web.json_response({"detail": [{"type": "extra_forbidden", "loc": loc,
                                                  "msg": "Extra inputs are not permitted"}
                                                 for loc in extra]}, status=422)
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        n = min(asked, eos_after or asked)
        chat_api = "messages" in body
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
        finish = "length" if n == asked else "stop"
        if not body.get("stream"):
            text = "".join(f" t{i}" for i in range(n))
            choice = ({"message": {"role": "assistant", "content": text}} if chat_api
                      else {"text": text})
            return web.json_response({"id": "s", "choices": [choice | {
                "index": 0, "finish_reason": finish}], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            await asyncio.sleep(gap_s)
            await resp.write(chat({"content": f" t{i}"}) if chat_api else completion(f" t{i}"))
        last = {"index": 0, "finish_reason": finish} | ({"delta": {}} if chat_api else {"text": ""})
        await resp.write(sse({"id": "s", "choices": [last], "usage": usage}))
        await resp.write_eof()
        return resp

    return handle


@dataclass
class Server:
    """Serves `handler` at /v1/completions, /v1/chat/completions, Ollama's /api/generate
    and /api/chat and SGLang's /generate; lists `model` (none when it is None), or answers
    /v1/models with `models_answer` (status, text) when given."""

    handler: Handler
    model: str | None = "fake-model"
    models_answer: tuple[int, str] | None = None
    received: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    metrics: Callable[[Server], str] | None = None  # Prometheus text at /metrics

    def __enter__(self) -> Server:
        started = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("test server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()

        async def generate(request: web.Request) -> web.StreamResponse:
            self.received.append({"body": await request.json(), "headers": request.headers.copy(),
                                  "path": request.path})
            return await self.handler(request)

        async def models(request: web.Request) -> web.Response:
            if self.models_answer is not None:
                return web.Response(status=self.models_answer[0], text=self.models_answer[1])
            models = [{"id": self.model}] if self.model is not None else []
            return web.json_response({"object": "list", "data": models})

        app.router.add_post("/v1/completions", generate)
        app.router.add_post("/v1/chat/completions", generate)
        app.router.add_post("/api/generate", generate)
        app.router.add_post("/api/chat", generate)
        app.router.add_post("/generate", generate)
        app.router.add_get("/v1/models", models)
        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text=self.metrics(self))

        if self.metrics is not None:
            app.router.add_get("/metrics", metrics)
        self._runner = web.AppRunner(app, handle_signals=False)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        started.set()
        self._loop.run_forever()
