"""A fake server *command* for `latlab coldstart` tests (run as `python coldstart_server.py`).

It sleeps `--delay` s before it listens (so time to ready has a known lower bound), makes the
first request `--cold-ms` slower and a request after more than `--idle-after` s of idleness
`--idle-ms` slower, and with `--pidfile` starts a child (`sleep`) and appends both pids, so a
test can check the whole process group is stopped. With `--hang-from N`, the Nth start (and
any later one, counted by the pidfile's lines) never gets ready: a test can stop a run in
the middle of a start, not by luck. With `--speeds FILE`, a process is `--slow-ms` slower on
every request or not at all, by the order in which processes sharing FILE got their first
request (the 1st, 4th, 5th, 8th, ... are slow), and it notes there how many of them were alive.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import subprocess
import time
from pathlib import Path

from aiohttp import web
from processes import alive
from sse_server import DONE, completion, usage_only

TOKENS = 3
BASE_S = 0.005


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--cold-ms", type=float, default=0.0)
    parser.add_argument("--idle-after", type=float, default=1e9)
    parser.add_argument("--idle-ms", type=float, default=0.0)
    parser.add_argument("--pidfile", type=Path)
    parser.add_argument("--no-models", action="store_true")
    parser.add_argument("--hang-from", type=int)
    parser.add_argument("--speeds", type=Path)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    args = parser.parse_args()
    if args.pidfile:
        child = subprocess.Popen(["sleep", "600"])
        with args.pidfile.open("a") as f:
            f.write(f"{os.getpid()} {child.pid}\n")
        start = len(args.pidfile.read_text().splitlines())
        if args.hang_from is not None and start >= args.hang_from:
            time.sleep(600)  # stopped long before, with its process group
    time.sleep(args.delay)
    state = {"served": 0, "last": time.monotonic(), "slow_ms": 0.0}

    async def generate(request: web.Request) -> web.StreamResponse:
        if state["served"] == 0 and args.speeds:
            state["slow_ms"] = slow_ms(args.speeds, args.slow_ms)
        extra = state["slow_ms"] + (args.cold_ms if state["served"] == 0 else 0.0)
        if time.monotonic() - state["last"] > args.idle_after:
            extra += args.idle_ms
        state["served"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(extra / 1e3)
        for k in range(1, TOKENS + 1):
            await asyncio.sleep(BASE_S)
            await resp.write(completion("x", {"prompt_tokens": 8, "completion_tokens": k}))
        await resp.write(usage_only(8, TOKENS))
        await resp.write(DONE)
        await resp.write_eof()
        state["last"] = time.monotonic()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "cold-model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/completions", generate)
    app.router.add_get("/health", health)
    if not args.no_models:
        app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, handle_signals=True)


def slow_ms(speeds: Path, slow: float) -> float:
    """This process's delay, from the processes that came before it in `speeds` (a line each:
    its pid and how many of them, itself included, were alive)."""
    with speeds.open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        before = [int(line.split()[0]) for line in f.read().splitlines()]
        f.write(f"{os.getpid()} {1 + sum(map(alive, before))}\n")
    return slow if len(before) % 4 in (0, 3) else 0.0


if __name__ == "__main__":
    main()
