"""The local streaming servers `client.py` measures clients against: raw asyncio HTTP/1.1
processes sharing one port, each stream paced one token event per 10 ms (the server logging
when it got each request and wrote each event, on the shared monotonic clock) or written at
once. Run as `client_servers.py serve PORT LOG` (by `Servers`)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson

INTERVAL_S = 0.010

EVENT = (b'data: {"id":"cmpl-bench","object":"text_completion","created":0,"model":"bench",'
         b'"choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":null}],'
         b'"usage":null}\n\n')

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")

MODELS = b'{"object":"list","data":[{"id":"bench"}]}'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _tail(n: int) -> bytes:
    usage = {"id": "cmpl-bench", "choices": [],
             "usage": {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}}
    return (_chunk(b"data: " + orjson.dumps(usage) + b"\n\n") + _chunk(b"data: [DONE]\n\n")
            + b"0\r\n\r\n")


class StreamServer(asyncio.Protocol):
    """HTTP/1.1 keep-alive: `/paced/...` streams an event per 10 ms, `/fast/...` all at once."""

    log_fd = -1
    fast_bodies: dict[int, bytes] = {}

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.buf = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data: bytes) -> None:
        if not self.buf:
            self.received = time.perf_counter_ns()
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
            length = int(headers.get("content-length", 0))
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
            method, path, _ = lines[0].split(" ", 2)
            self.route(method, path, headers, body)

    def route(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        if method == "GET":
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
            return
        try:
            n = int(orjson.loads(body)["max_tokens"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):  # AIPerf's probes
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return
        if path.startswith("/fast"):
            if n not in self.fast_bodies:
                self.fast_bodies[n] = HEAD + _chunk(EVENT) * n + _tail(n)
            self.transport.write(self.fast_bodies[n])
            return
        self.transport.write(HEAD)
        self.rid, self.n, self.sent = headers.get("x-request-id", ""), n, []
        self.arrived = self.received
        self.start = asyncio.get_running_loop().time()
        self._schedule()

    def _schedule(self) -> None:
        due = self.start + (len(self.sent) + 1) * INTERVAL_S
        self.timer = asyncio.get_running_loop().call_at(due, self._tick)

    def _tick(self) -> None:
        self.transport.write(_chunk(EVENT))
        self.sent.append(time.perf_counter_ns())
        if len(self.sent) < self.n:
            return self._schedule()
        self.timer = None
        self.transport.write(_tail(self.n))
        os.write(self.log_fd, orjson.dumps({"id": self.rid, "r": self.arrived, "t": self.sent})
                 + b"\n")


def serve(port: int, log: str) -> None:
    import uvloop

    StreamServer.log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(StreamServer, sock=sock,
                                                                backlog=4096)
        await server.serve_forever()

    uvloop.run(main())


class Servers:
    """`count` server processes sharing one port (SO_REUSEPORT)."""

    def __init__(self, count: int, folder: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = folder / "server-sends.jsonl"
        self.procs = [subprocess.Popen([sys.executable, __file__, "serve", str(self.port),
                                        str(self.log)]) for _ in range(count)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    time.sleep(0.5)  # let every process bind
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("benchmark servers did not start")

    def url(self, kind: str) -> str:
        return f"http://127.0.0.1:{self.port}/{kind}"

    def sends(self) -> dict[str, dict]:
        """Each finished stream by its X-Request-Id: when the server got the request (`r`)
        and when it wrote each token event (`t`)."""
        rows = [orjson.loads(line) for line in self.log.read_bytes().splitlines()]
        return {row["id"]: row for row in rows}

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(10)


if __name__ == "__main__":
    serve(int(sys.argv[2]), sys.argv[3])
