"""Arrival stamps taken when the socket is read, not when the reading coroutine resumes.

aiohttp hands a response's bytes to the reading coroutine one event-loop turn after the
socket read; at hundreds of streams that turn is spent on every other readable socket and
every other coroutine, and a stamp taken in the coroutine carries all of it. `StampedHandler`
(the connection's protocol) stamps each read as it happens, with the body's byte count after
it; `read_stamped` cuts what the coroutine reads at those counts, so every piece gets the
time its bytes were read. The protocol does nothing else in the read, so the stamps of the
sockets later in one loop turn wait only for the reads before them, not for their parsing.
"""

from __future__ import annotations

import functools
import socket
import struct
import sys
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from time import perf_counter_ns
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler


class StampedHandler(ResponseHandler):
    """aiohttp's response protocol, keeping `(read_ns, body_bytes_after)` for each socket
    read of the response being received."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # made when the TCP connection is up, before a TLS handshake on it (asyncio makes the
        # protocol first, then wraps it in TLS)
        self.made_ns = perf_counter_ns()
        self.stamps: deque[tuple[int, int]] = deque()
        self.stamped: object = None  # the payload the stamps count

    def data_received(self, data: bytes) -> None:
        t = perf_counter_ns()
        before = self._payload
        super().data_received(data)
        payload = self._payload or before
        if payload is None:
            return
        if payload is not self.stamped:
            self.stamped, self.stamps = payload, deque()
        self.stamps.append((t, payload.total_bytes))


# The TLS handshake of the connection the current request just opened (ns), for its
# connection trace (`connection.connection_trace`); None over plain TCP.
HANDSHAKE_NS: ContextVar[int | None] = ContextVar("latlab_handshake_ns", default=None)


# The round trip the kernel measured on the handshake of the connection the current request
# just opened (ns), for its connection trace; None where the kernel does not say.
HANDSHAKE_RTT_NS: ContextVar[int | None] = ContextVar("latlab_handshake_rtt_ns", default=None)
TCPI_RTT_AT = 68  # tcpi_rtt (µs) in Linux's struct tcp_info


def kernel_rtt_ns(transport: Any) -> int | None:
    """The smoothed round trip the kernel keeps for `transport`'s TCP socket (TCP_INFO's
    tcpi_rtt: right after the handshake, the handshake's), free of the event loop's delays
    that a connect's duration carries; None off Linux or off TCP."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sys.platform != "linux" or not hasattr(socket, "TCP_INFO"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except OSError:
        return None
    if len(info) < TCPI_RTT_AT + 4:
        return None
    rtt_us = struct.unpack_from("=I", info, TCPI_RTT_AT)[0]
    return rtt_us * 1000 if rtt_us > 0 else None


class StampingConnector(aiohttp.TCPConnector):
    """A TCPConnector whose connections are `StampedHandler`s, timing each TLS handshake and
    reading the kernel's round trip of each new connection."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._factory = functools.partial(StampedHandler, loop=self._loop)

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        proto = await super()._create_connection(req, traces, timeout)
        secure = req.is_ssl() and isinstance(proto, StampedHandler)
        HANDSHAKE_NS.set(perf_counter_ns() - proto.made_ns if secure else None)
        HANDSHAKE_RTT_NS.set(kernel_rtt_ns(getattr(proto, "transport", None)))
        return proto


async def read_stamped(resp: aiohttp.ClientResponse, feed: Callable[[bytes, int], None]) -> None:
    """Feed `resp`'s body to `feed(piece, read_ns)` until its end, each piece stamped with
    the socket read that brought it (now, on a connection that is not a `StampedHandler`)."""
    content = resp.content
    handler = getattr(resp, "_protocol", None)  # kept after the connection is released
    offset = 0
    while chunk := await content.readany():
        if isinstance(handler, StampedHandler) and handler.stamped is content:
            for piece, t in split_at_reads(chunk, offset, handler.stamps):
                feed(piece, t or perf_counter_ns())
        else:
            feed(chunk, perf_counter_ns())
        offset += len(chunk)


def split_at_reads(chunk: bytes, offset: int,
                   stamps: deque[tuple[int, int]]) -> list[tuple[bytes, int | None]]:
    """`chunk` (the body's bytes from `offset` on) cut where the socket reads in `stamps`
    ended, each piece with its read's stamp (None past the last stamp), consuming `stamps`."""
    end, pos, out = offset + len(chunk), 0, []
    while stamps and stamps[0][1] <= end:
        t, upto = stamps.popleft()
        if upto - offset > pos:
            out.append((chunk[pos:upto - offset], t))
            pos = upto - offset
    if pos < len(chunk):
        out.append((chunk[pos:], stamps[0][0] if stamps else None))
    return out
