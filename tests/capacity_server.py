"""A fake streaming server with a capacity: `slots` requests are served at a time, each for
`service_s` (its tokens spread over it); the rest wait in a queue, or get 429 beyond
`max_waiting`. Latency rises sharply once the offered rate passes slots / service_s."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from sse_server import DONE, Handler, completion, usage_only


def capacity(slots: int, service_s: float, tokens: int = 4,
             max_waiting: int | None = None) -> Handler:
    state = {"waiting": 0}
    semaphore: list[asyncio.Semaphore] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        if not semaphore:
            semaphore.append(asyncio.Semaphore(slots))
        if max_waiting is not None and semaphore[0].locked() and state["waiting"] >= max_waiting:
            return web.json_response({"error": {"message": "queue full"}}, status=429)
        arrived = time.perf_counter()
        state["waiting"] += 1
        async with semaphore[0]:
            state["waiting"] -= 1
            queue_ms = (time.perf_counter() - arrived) * 1e3
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for k in range(1, tokens + 1):
                await asyncio.sleep(service_s / tokens)
                await resp.write(completion("x", {"prompt_tokens": 8, "completion_tokens": k}))
            timing = {"queue": queue_ms, "prefill": service_s * 1e3 / tokens,
                      "decode": service_s * 1e3 * (tokens - 1) / tokens,
                      "total": queue_ms + service_s * 1e3}
            await resp.write(usage_only(8, tokens, timing))
            await resp.write(DONE)
            await resp.write_eof()
            return resp

    return handle
