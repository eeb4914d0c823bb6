"""The gateway's hop over a run: where a request's time to first token went between the
client, the gateway and the engine behind it, and how many requests say so.

Over the successful requests in the window whose engine spans were joined (`server.gateway_*`,
`load/telemetry/upstream.py`), means that add up:

    client TTFT = gateway intake + engine TTFT + forwarding
    engine TTFT = the engine's preprocess + queue + prefill (its receipt to its first token)
    forwarding  = the engine's first token to the client's (the gateway relaying it)

and, after the answer's last token, the gateway's tail: the engine's end to the client's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latlab.records.columns import ms_between
from latlab.records.config import Gateway
from latlab.records.spans import SpanJoin
from latlab.records.table import RequestTable

ENGINE_TTFT = ("preprocess", "queue", "prefill")


@dataclass(frozen=True, slots=True)
class Hop:
    """The mean request's hop (ms) over the `joined` of `requests` (successful, in the
    window); how the spans were joined (requests per way, `SpanJoin.joined_by`)."""

    gateway: Gateway | None
    requests: int
    joined: int
    joined_by: dict[str, int]
    client_ttft_ms: float
    intake_ms: float
    engine_ttft_ms: float
    forward_ms: float
    tail_ms: float
    engine_ms: float | None

    @property
    def coverage(self) -> float:
        return self.joined / self.requests if self.requests else 0.0


def hop(t: RequestTable, ok: np.ndarray, gateway: Gateway | None, join: SpanJoin | None
        ) -> Hop | None:
    """The hop of the `ok` requests (a mask), or None when none has one."""
    s = t.server
    engine_ttft = sum(np.nan_to_num(s[stage]) for stage in ENGINE_TTFT)
    joined = ok & ~np.isnan(s["gateway_intake"]) & ~np.isnan(s["gateway_forward"]) \
        & ~np.isnan(s["gateway_tail"]) & ~np.isnan(s["prefill"])
    if not joined.any():
        return None

    def mean(v: np.ndarray) -> float:
        return float(np.mean(v[joined]))

    totals = s["total"][joined]
    totals = totals[~np.isnan(totals)]  # an engine span may lack its total

    return Hop(gateway=gateway, requests=int(ok.sum()), joined=int(joined.sum()),
               joined_by=dict(join.joined_by) if join is not None else {},
               client_ttft_ms=mean(ms_between(t.first_token_ns, t.sent_ns)),
               intake_ms=mean(s["gateway_intake"]), engine_ttft_ms=mean(engine_ttft),
               forward_ms=mean(s["gateway_forward"]), tail_ms=mean(s["gateway_tail"]),
               engine_ms=float(totals.mean()) if len(totals) else None)
