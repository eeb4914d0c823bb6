"""Connection phases from aiohttp's tracing: pool wait, DNS, connect, and `sent`.

The request's `RequestTimeline` is the trace's request context. `sent` is stamped the moment
a connection is ready for it (new or reused), just before aiohttp writes the request.
"""

from __future__ import annotations

from time import perf_counter_ns
from types import SimpleNamespace
from typing import Any

import aiohttp

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
        dns = getattr(ctx, "dns_ns", None)
        r.connection = ConnectionTiming(new=True, pool_wait_ns=getattr(ctx, "pool_wait_ns", None),
                                        dns_ns=dns, connect_ns=r.sent_ns - ctx.create_ns - (dns or 0))

    async def reuse(_s: Any, ctx: SimpleNamespace, _p: Any) -> None:
        r = ctx.trace_request_ctx
        r.sent_ns = perf_counter_ns()
        r.connection = ConnectionTiming(new=False, pool_wait_ns=getattr(ctx, "pool_wait_ns", None))

    trace.on_connection_queued_start.append(queued_start)
    trace.on_connection_queued_end.append(queued_end)
    trace.on_connection_create_start.append(create_start)
    trace.on_dns_resolvehost_start.append(dns_start)
    trace.on_dns_resolvehost_end.append(dns_end)
    trace.on_connection_create_end.append(create_end)
    trace.on_connection_reuseconn.append(reuse)
    return trace
