"""Where one request's time went: its end-to-end time from schedule split into components.

With server timings (latlab's protocol), every component but `ttft_unsplit` is measured:

    client_wait   = (sent − scheduled) − connection setup        derived  (pool wait stays here)
    connect       = DNS + TCP + TLS of a new connection          exact    (0 for a reused one)
    network       = (usage − sent) − server.total                derived  (upload + transit + proxies)
    preprocess, queue, prefill, decode                           exact    (server's own clock)
    postprocess   = server.postprocess + (done − usage)          derived  (the stream's tail)
    unattributed  = E2E-from-schedule − all of the above         derived  (incl. server.total − Σ stages)

`usage` is the arrival of the event that carries the server's timings (the final usage event of
a stream, the body of a non-streamed response). Without server timings the client can still say:

    client_wait, connect                                         as above
    ttft_unsplit  = first_token − sent                           derived  (network+preprocess+queue+prefill)
    decode        = last_token − first_token                     estimated (decode as the client sees it)
    postprocess   = done − last_token                            estimated (the stream's tail)

and network, preprocess, queue and prefill are `unavailable` (their time is inside `ttft_unsplit`).
The components always add up to E2E-from-schedule; the residual is shown, never folded away.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from latlab.records.timeline import NS_PER_MS, RequestTimeline, ms_between


class Quality(StrEnum):
    EXACT = "exact"  # one measured interval
    DERIVED = "derived"  # differences of measured intervals
    ESTIMATED = "estimated"  # a client-side proxy for a server-side interval
    UNAVAILABLE = "unavailable"  # not measured; its time sits in another component


COMPONENTS = ("client_wait", "connect", "network", "preprocess", "queue", "prefill", "decode",
              "postprocess", "ttft_unsplit", "unattributed")
SERVER_STAGES = ("preprocess", "queue", "prefill", "decode")

LABELS = {
    "client_wait": "client wait", "connect": "connect", "network": "network",
    "preprocess": "preprocess", "queue": "queue", "prefill": "prefill", "decode": "decode",
    "postprocess": "postprocess", "ttft_unsplit": "first token (unsplit)",
    "unattributed": "unattributed",
}

# The buckets a person reads first; `first token (unsplit)` only appears without server timings.
BUCKETS: dict[str, tuple[str, ...]] = {
    "network": ("connect", "network"),
    "queue & overhead": ("client_wait", "preprocess", "queue", "postprocess", "unattributed"),
    "prefill": ("prefill",),
    "decode": ("decode",),
    "first token (unsplit)": ("ttft_unsplit",),
}


@dataclass(frozen=True, slots=True)
class Component:
    ms: float | None
    quality: Quality


@dataclass(slots=True)
class Decomposition:
    """One request's E2E-from-schedule (ms) and its components, which add up to it."""

    total: float
    components: dict[str, Component]
    has_server: bool

    def ms(self, name: str) -> float:
        """The component's time, 0 when unavailable or not applicable."""
        c = self.components.get(name)
        return c.ms if c is not None and c.ms is not None else 0.0

    def quality(self, name: str) -> Quality | None:
        c = self.components.get(name)
        return c.quality if c is not None else None

    def bucket(self, name: str) -> float:
        return sum(self.ms(c) for c in BUCKETS[name])


def decompose(r: RequestTimeline) -> Decomposition | None:
    """The request's components, or None when it has no E2E (failed, or never sent or done)."""
    if not r.ok or r.sent_ns is None or r.done_ns is None:
        return None
    total = ms_between(r.done_ns, r.origin_ns)
    assert total is not None
    parts: dict[str, Component] = {}

    setup = r.connection.setup_ns / NS_PER_MS if r.connection is not None else None
    wait = ms_between(r.sent_ns, r.scheduled_ns)
    if wait is None:
        parts["client_wait"] = Component(None, Quality.UNAVAILABLE)
        parts["connect"] = Component(None, Quality.UNAVAILABLE)
    elif setup is None:
        parts["client_wait"] = Component(wait, Quality.DERIVED)
        parts["connect"] = Component(None, Quality.UNAVAILABLE)
    else:
        parts["client_wait"] = Component(wait - setup, Quality.DERIVED)
        parts["connect"] = Component(setup, Quality.EXACT)

    s = r.server
    if s is not None:
        arrived = r.usage_ns if r.usage_ns is not None else r.done_ns
        observed = ms_between(arrived, r.sent_ns)
        network = observed - s.total if observed is not None and s.total is not None else None
        parts["network"] = _measured(network, Quality.DERIVED)
        for stage in SERVER_STAGES:
            parts[stage] = _measured(getattr(s, stage), Quality.EXACT)
        tail = ms_between(r.done_ns, arrived) or 0.0
        post = (s.postprocess or 0.0) + tail
        parts["postprocess"] = Component(post, Quality.DERIVED if s.postprocess is not None
                                         else Quality.ESTIMATED)
    else:
        for name in ("network", *SERVER_STAGES[:3]):
            parts[name] = Component(None, Quality.UNAVAILABLE)
        first = r.first_token_ns if r.first_token_ns is not None else r.done_ns
        last = r.last_token_ns if r.last_token_ns is not None else first
        parts["ttft_unsplit"] = Component(ms_between(first, r.sent_ns), Quality.DERIVED)
        parts["decode"] = Component(ms_between(last, first), Quality.ESTIMATED)
        parts["postprocess"] = Component(ms_between(r.done_ns, last), Quality.ESTIMATED)

    accounted = sum(c.ms for c in parts.values() if c.ms is not None)
    parts["unattributed"] = Component(total - accounted, Quality.DERIVED)
    return Decomposition(total=total, components=parts, has_server=s is not None)


def _measured(value: float | None, quality: Quality) -> Component:
    return Component(value, quality) if value is not None else Component(None, Quality.UNAVAILABLE)
