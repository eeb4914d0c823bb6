"""Connection phases from aiohttp's tracing: pool wait, DNS, connect, the TLS handshake
(`stamps.StampingConnector` times it), and `sent`.

The request's `RequestTimeline` is the trace's request context. `sent` is stamped when aiohttp
hands the request's body (with its headers) to the socket; a request whose body is never
written keeps the time its connection was ready (new or reused). Between the two lie
aiohttp's building of the request and, on Python < 3.12, one event-loop turn: client wait.
"""

from __future__ import annotations

from time import perf_counter_ns
from types import SimpleNamespace
from typing import Any

import aiohttp

from latlab.load.request.stamps import HANDSHAKE_NS, HANDSHAKE_RTT_NS
from latlab.records.timeline import ConnectionTiming


def connection_trace() -> aiohttp.TraceConfig:
    """Connection phases into `RequestTimeline.connection`, and `sent` once the connection is
    ready (the request's timeline is the trace's request context)."""
    trace = aiohttp.TraceConfig()

    async def queued_start(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        ctx.queued_ns = perf_counter_ns()

    async def queued_end(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        ctx.pool_wait_ns = perf_counter_ns() - ctx.queued_ns

    async def create_start(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        ctx.create_ns = perf_counter_ns()

    async def dns_start(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        ctx.dns_start_ns = perf_counter_ns()

    async def dns_end(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        ctx.dns_ns = perf_counter_ns() - ctx.dns_start_ns

    async def create_end(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        r = ctx.trace_request_ctx
        r.sent_ns = perf_counter_ns()
        dns, tls, rtt = getattr(ctx, "dns_ns", None), HANDSHAKE_NS.get(), HANDSHAKE_RTT_NS.get()
        HANDSHAKE_NS.set(None)
        HANDSHAKE_RTT_NS.set(None)
        connect = r.sent_ns - ctx.create_ns - (dns or 0) - (tls or 0)
        r.connection = ConnectionTiming(new=True, pool_wait_ns=getattr(ctx, "pool_wait_ns", None),
                                        dns_ns=dns, connect_ns=connect, tls_ns=tls, rtt_ns=rtt)
        ctx.body_sent = False

    async def reuse(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        r = ctx.trace_request_ctx
        r.sent_ns = perf_counter_ns()
        r.connection = ConnectionTiming(new=False, pool_wait_ns=getattr(ctx, "pool_wait_ns", None))
        ctx.body_sent = False

    async def chunk_sent(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        if getattr(ctx, "body_sent", True):
            return
        ctx.body_sent = True
        ctx.trace_request_ctx.sent_ns = perf_counter_ns()  # aiohttp writes right after this

    trace.on_connection_queued_start.append(queued_start)
    trace.on_connection_queued_end.append(queued_end)
    trace.on_connection_create_start.append(create_start)
    trace.on_dns_resolvehost_start.append(dns_start)
    trace.on_dns_resolvehost_end.append(dns_end)
    trace.on_connection_create_end.append(create_end)
    trace.on_connection_reuseconn.append(reuse)
    trace.on_request_chunk_sent.append(chunk_sent)
    return trace
