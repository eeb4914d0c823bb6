"""latlab serve under pressure: admission control, clients that go away, shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys

import httpx
import orjson
from engine_server import running_server
from processes import wait_until

LONG = {"prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True}


def engine_idle(server) -> bool:
    stats = server.engine.stats
    return (stats.num_running == 0 and stats.num_waiting == 0
            and stats.num_free_blocks == stats.num_blocks)


async def test_queue_full_gets_429_with_retry_after():
    # At most one running and one waiting: of a burst of 10 long requests most are turned away.
    with running_server(max_num_seqs=1, max_waiting=1, max_model_len=1024,
                        num_kv_blocks=160) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True}
            responses = await asyncio.gather(
                *(client.post("/v1/completions", json=body) for _ in range(10)))
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) == {200, 429}, statuses
        rejected = next(r for r in responses if r.status_code == 429)
        assert rejected.headers["retry-after"] == "1"
        assert rejected.json()["error"]["code"] == "rate_limit_exceeded"
        wait_until(lambda: engine_idle(server), what="the engine to drain")


async def test_aborted_streams_give_back_every_kv_block():
    with running_server(max_num_seqs=4) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

            async def read_then_leave(i: int) -> None:
                body = {**LONG, "prompt": "tok " * (5 + i), "max_tokens": 150}
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200
                    lines = r.aiter_lines()
                    for _ in range(i % 3):  # some leave at once, still queued
                        await anext(lines)

            await asyncio.gather(*(read_then_leave(i) for i in range(24)))
        wait_until(lambda: engine_idle(server), what="every KV block to come back")
        assert server.engine.stats.num_steps > 0


def test_disconnected_non_streamed_request_is_aborted():
    with running_server(max_num_seqs=1, max_model_len=1024, num_kv_blocks=130) as server:
        body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True}
        with httpx.Client(base_url=server.url, timeout=0.1) as client:
            try:
                client.post("/v1/completions", json=body)
            except httpx.TimeoutException:
                pass
        wait_until(lambda: engine_idle(server), timeout_s=10, what="the abort")
        assert server.engine.stats.num_steps < 1000  # cut short, not run to the end
        text = httpx.get(server.url + "/metrics").text
        assert 'latlab_requests_total{outcome="abort"} 1.0' in text


def test_shutdown_ends_streams_in_flight_with_an_error_event():
    with running_server(max_model_len=1024, num_kv_blocks=130) as s:
        body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            lines = (line for line in r.iter_lines() if line)
            assert next(lines).startswith("data: {")
            s.server.should_exit = True
            rest = list(lines)
    assert rest[-1] == "data: [DONE]"
    assert "the server is shutting down" in rest[-2]
    assert orjson.loads(rest[-2].removeprefix("data: "))["error"]["type"] == "service_unavailable"


def test_sigterm_stops_serve_cleanly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "latlab", "serve", "--model", "tiny", "--port", str(port),
         "--max-model-len", "256", "--num-kv-blocks", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = process.stdout.readline()
        assert line.startswith(f"latlab serve: ready on http://127.0.0.1:{port} (model tiny"), line
        assert httpx.get(f"http://127.0.0.1:{port}/ready").status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert process.stdout.read().strip().endswith("latlab serve: stopped")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
