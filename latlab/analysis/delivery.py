"""How the streams reached the client: token by token, or in bursts.

The client stamps every socket read (`load/request/stamps.py`), so token events that came in
one read share one time. A server streams each event as it has it; a proxy that buffers the
stream (nginx with `proxy_buffering on` for a server that does not send `X-Accel-Buffering:
no`) passes it on a buffer at a time: most events then come in the same read as the one
before, the gaps between them are 0 and the buffer's wait is one long gap. The gaps between
tokens (ITL, each stream's longest pause, TPOT) then measure the proxy's buffer, not the
server: a pause the server made is hidden inside a burst, a pause it never made is the
buffer filling.

Without a gateway named in front, events sharing reads are not enough to call a buffer: a
server with its whole answer at once sends it in one read (no stream then waits between
reads), and a busy client's reads fall late and take whatever came. Neither is called one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from latlab.metrics.throughput import zero_gaps

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

# Of the gaps between token events: this many in one read make a stream delivered in bursts.
# A buffer of a few KiB holds tens of events, gzip the whole stream (1.0 through nginx:
# tests/fixtures/gateways/nginx-gzip); a client reading late on a loaded host through an
# unbuffered nginx reached 0.66, LiteLLM merging some events 0.50-0.74.
BURST_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class Bursts:
    """Streams delivered in bursts: the share of the gaps between token events that were 0
    (the event came in the same read as the one before), and through what."""

    share: float
    gaps: int
    through: str | None  # the gateway named in front of the server, if one was

    def line(self) -> str:
        via = f" through {self.through}" if self.through else ""
        return (f"{100 * self.share:.0f}% of the {self.gaps} gaps between token events were 0 "
                f"(the event came in the same read as the one before): the streams arrived in "
                f"bursts{via}, so their gaps are a buffer's, not the server's")


def bursts(a: RunAnalysis) -> Bursts | None:
    """The streams of the run's measured successful requests, if they came in bursts."""
    counted = zero_gaps(a.table, a.ok)
    if counted.share is None or counted.share < BURST_SHARE:
        return None
    gateway = a.config.target.gateway
    if gateway is None and (counted.zero == counted.gaps or _client_busy(a)):
        return None
    return Bursts(counted.share, counted.gaps, gateway.name if gateway is not None else None)


def _client_busy(a: RunAnalysis) -> bool:
    """The load generator busy, itself (`client_bottleneck`) or its host with other work
    (`busy_host`): its reads fall late and take several events at once, with no buffer on
    the way."""
    return a.client is not None and (a.client.bottleneck or a.client.host_busy)
