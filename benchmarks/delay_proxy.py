"""A TCP proxy on loopback that delays every byte by a fixed one-way time, in each direction:
an injected network delay between a client and a server.

    python benchmarks/delay_proxy.py --listen 18200 --target 127.0.0.1:8000 --delay-ms 20

Each chunk read from one side is written to the other `delay` later, in order; the TCP
handshake itself (done by the kernel) is not delayed, as on a real link it would be, so a
latency tool must measure the round trip with a request, not with a connect. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import time

LOOPBACK = ("127.0.0.1", "::1", "localhost")


class DelayProxy:
    def __init__(self, target_host: str, target_port: int, delay_s: float,
                 listen_port: int = 0) -> None:
        if target_host not in LOOPBACK:
            raise ValueError(f"{target_host}: the proxy only forwards to loopback")
        self.target = (target_host, target_port)
        self.delay_s, self.listen_port = delay_s, listen_port
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
        await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w),
                             return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward each chunk `delay_s` after it was read, keeping the order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                if not data:
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic() + self.delay_s, data))
        finally:
            queue.put_nowait((time.monotonic() + self.delay_s, b""))
            await sender


async def _main(args: argparse.Namespace) -> None:
    host, port = args.target.rsplit(":", 1)
    proxy = DelayProxy(host, int(port), args.delay_ms / 1000, args.listen)
    print(f"forwarding 127.0.0.1:{await proxy.start()} → {args.target} "
          f"with {args.delay_ms:g} ms each way", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int, default=0)
    parser.add_argument("--target", required=True, help="HOST:PORT on loopback")
    parser.add_argument("--delay-ms", type=float, required=True)
    try:
        asyncio.run(_main(parser.parse_args()))
    except KeyboardInterrupt:
        pass
