"""A TCP proxy on loopback that delays every byte by a fixed one-way time, in each direction:
an injected network delay between a client and a server.

    python benchmarks/delay_proxy.py --listen 18200 --target 127.0.0.1:8000 --delay-ms 20
    ... --wire wire.jsonl     # every chunk: direction, bytes, read and written (monotonic ns)

Each chunk read from one side is written to the other `delay` later, in order; the TCP
handshake itself (done by the kernel) is not delayed, as on a real link it would be, so a
latency tool must measure the round trip with a request, not with a connect. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

LOOPBACK = ("127.0.0.1", "::1", "localhost")


class DelayProxy:
    def __init__(self, target_host: str, target_port: int, delay_s: float,
                 listen_port: int = 0, wire: Path | None = None) -> None:
        if target_host not in LOOPBACK:
            raise ValueError(f"{target_host}: the proxy only forwards to loopback")
        self.target = (target_host, target_port)
        self.delay_s, self.listen_port = delay_s, listen_port
        # the wire timestamps: when each chunk was read and written (CLOCK_MONOTONIC, the
        # clock of a load generator's perf_counter_ns on Linux)
        self.wire = open(wire, "a", encoding="utf-8") if wire is not None else None
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1",
                                                  self.listen_port)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self.listen_port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, client_r: asyncio.StreamReader,
                          client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(self._pipe(client_r, server_w, "up"),
                             self._pipe(server_r, client_w, "down"), return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    direction: str) -> None:
        """Forward each chunk `delay_s` after it was read, keeping the order."""
        queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        delay_ns = int(self.delay_s * 1e9)

        async def send() -> None:
            while True:
                read, data = await queue.get()
                if (wait := read + delay_ns - time.monotonic_ns()) > 0:
                    await asyncio.sleep(wait / 1e9)
                if not data:
                    writer.close()
                    return
                writer.write(data)
                if self.wire is not None:
                    self.wire.write(json.dumps({"direction": direction, "bytes": len(data),
                                                "read_ns": read,
                                                "written_ns": time.monotonic_ns()}) + "\n")
                    self.wire.flush()
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic_ns(), data))
        finally:
            queue.put_nowait((time.monotonic_ns(), b""))
            await sender


async def _main(args: argparse.Namespace) -> None:
    host, port = args.target.rsplit(":", 1)
    proxy = DelayProxy(host, int(port), args.delay_ms / 1000, args.listen, args.wire)
    print(f"forwarding 127.0.0.1:{await proxy.start()} → {args.target} "
          f"with {args.delay_ms:g} ms each way", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int, default=0)
    parser.add_argument("--target", required=True, help="HOST:PORT on loopback")
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--wire", type=Path, help="write every chunk's read and write times here")
    try:
        asyncio.run(_main(parser.parse_args()))
    except KeyboardInterrupt:
        pass
