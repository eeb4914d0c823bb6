"""Where one request's time went: its end-to-end time from schedule split into components.

Whatever server reported the timings (`ServerTiming.source`), the same components, each with
its quality: exact (one measured interval), derived (differences of measured intervals),
estimated (a proxy), unavailable (its time sits in another component). `usage` is when the
event carrying the server's timings arrived (a stream's final event, a body).

    client_wait   = (sent − scheduled) − connection setup                 derived
    connect       = DNS + TCP + TLS of a new connection                   exact
    network       = transit = (usage − sent) − server.total               derived; with the run's
                    baseline: min(transit, baseline)                      estimated
    intake        = transit − network: the request waited to be read      derived
                    (a frozen or overloaded server; or network jitter)
                    without a server total: one round trip, a null request's (GET /health)
                    measured before the run, else the request's TCP connect   estimated
    preprocess, queue, model_load, prefill, decode, inference
                  = the server's own durations                            exact
    queue (when the server does not report it) = server.total − its other stages, or, without a
                    total, (first_token − sent) − network − the server's stages before it   derived
    postprocess   = server.postprocess + (done − usage)                   derived (estimated
                                                                          without the former)
    app:NAME      = an application in front of the model (its spans, `server.application`):
                    the time of its spans named NAME outside the model call   exact
    app:other     = the application's total − its spans − the model server's total
                    (its own work, and the network to the model)          derived
    unattributed  = E2E-from-schedule − all of the above                  derived

Without server timings the client can still say: client_wait and connect as above,
`ttft_unsplit` = first_token − sent (derived), decode = last_token − first_token and
postprocess = done − last_token (estimated); network, preprocess, queue and prefill are
unavailable. The components always add up to E2E-from-schedule; the residual is shown, never
folded away.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Iterable

from latlab.records.timeline import NS_PER_MS, RequestTimeline, ServerTiming, ms_between


class Quality(StrEnum):
    EXACT = "exact"  # one measured interval
    DERIVED = "derived"  # differences of measured intervals
    ESTIMATED = "estimated"  # a proxy for an interval nobody measured
    UNAVAILABLE = "unavailable"  # not measured; its time sits in another component


COMPONENTS = ("client_wait", "connect", "network", "intake", "preprocess", "queue",
              "model_load", "prefill", "decode", "inference", "postprocess", "ttft_unsplit",
              "unattributed")
SERVER_STAGES = ("preprocess", "queue", "prefill", "decode")
BEFORE_FIRST_TOKEN = ("preprocess", "model_load", "prefill")

LABELS = {
    "client_wait": "client wait", "connect": "connect", "network": "network",
    "intake": "server intake", "preprocess": "preprocess", "queue": "queue",
    "model_load": "model load", "prefill": "prefill", "decode": "decode",
    "inference": "prefill + decode (unsplit)", "postprocess": "postprocess",
    "ttft_unsplit": "first token (unsplit)", "unattributed": "unattributed",
}

APP = "app:"  # an application component's prefix: `app:retrieval`, `app:other`

# The buckets a person reads first; the unsplit ones only appear when a server does not split,
# the application when an application's spans gave its components.
BUCKETS: dict[str, tuple[str, ...]] = {
    "network": ("connect", "network"),
    "queue & overhead": ("client_wait", "intake", "preprocess", "queue", "model_load",
                         "postprocess", "unattributed"),
    "application": (),  # every `app:` component
    "prefill": ("prefill",),
    "decode": ("decode",),
    "prefill + decode (unsplit)": ("inference",),
    "first token (unsplit)": ("ttft_unsplit",),
}


def label(component: str) -> str:
    """What a person calls a component: `app:retrieval` is "retrieval"."""
    if component == APP + "other":
        return "application, other"
    return component[len(APP):] if component.startswith(APP) else LABELS[component]


def members(bucket: str, components: Iterable[str]) -> list[str]:
    """The components of `components` that belong to `bucket`."""
    if bucket == "application":
        return [c for c in components if c.startswith(APP)]
    return list(BUCKETS[bucket])


@dataclass(frozen=True, slots=True)
class Component:
    ms: float | None
    quality: Quality


@dataclass(frozen=True, slots=True)
class NetworkBaseline:
    """What the run says about its network: the baseline of the transit (observed − server
    total) over its requests, and the median TCP connect time of its new connections."""

    transit_ms: float | None = None
    rtt_ms: float | None = None


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
        return sum(self.ms(c) for c in members(name, self.components))


def decompose(r: RequestTimeline, base: NetworkBaseline = NetworkBaseline()
              ) -> Decomposition | None:
    """The request's components, or None when it has no E2E (failed, or never sent or done)."""
    if not r.ok or r.sent_ns is None or r.done_ns is None:
        return None
    total = ms_between(r.done_ns, r.origin_ns)
    parts: dict[str, Component] = {}
    setup = r.connection.setup_ns / NS_PER_MS if r.connection is not None else None
    wait = ms_between(r.sent_ns, r.scheduled_ns)
    if wait is None:
        parts["client_wait"] = parts["connect"] = Component(None, Quality.UNAVAILABLE)
    elif setup is None:
        parts["client_wait"] = Component(wait, Quality.DERIVED)
        parts["connect"] = Component(None, Quality.UNAVAILABLE)
    else:
        parts["client_wait"] = Component(wait - setup, Quality.DERIVED)
        parts["connect"] = Component(setup, Quality.EXACT)
    if r.server is not None:
        _with_server(r, r.server, base, parts)
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
    return Decomposition(total=total, components=parts, has_server=r.server is not None)


def _with_server(r: RequestTimeline, s: ServerTiming, base: NetworkBaseline,
                 parts: dict[str, Component]) -> None:
    # An application's total runs to its response's end, past the usage event it relays.
    arrived = r.usage_ns if r.usage_ns is not None and not s.application else r.done_ns
    for stage in ("preprocess", "queue", "model_load", "prefill", "decode", "inference"):
        value = getattr(s, stage)
        parts[stage] = Component(value, Quality.EXACT if value is not None
                                 else Quality.UNAVAILABLE)
    for name, value in (s.application or {}).items():
        parts[APP + name] = Component(value, Quality.DERIVED if name == "other"
                                      else Quality.EXACT)
    if s.total is not None:
        transit = ms_between(arrived, r.sent_ns) - s.total
        if base.transit_ms is None:
            parts["network"] = Component(transit, Quality.DERIVED)
        else:
            network = min(transit, base.transit_ms)
            parts["network"] = Component(network, Quality.ESTIMATED)
            parts["intake"] = Component(transit - network, Quality.DERIVED)
    else:
        parts["network"] = _round_trip(r, base)
    if s.queue is None:
        parts["queue"] = _derived_queue(r, s, parts)
    tail = ms_between(r.done_ns, arrived) or 0.0
    parts["postprocess"] = Component((s.postprocess or 0.0) + tail, Quality.DERIVED
                                     if s.postprocess is not None else Quality.ESTIMATED)


def _round_trip(r: RequestTimeline, base: NetworkBaseline) -> Component:
    """Without a server total, the network is estimated as one round trip: the run's (a null
    request's, measured before the run), else this request's TCP connect time."""
    if base.rtt_ms is not None:
        return Component(base.rtt_ms, Quality.ESTIMATED)
    c = r.connection
    if c is not None and c.new and c.connect_ns is not None:
        return Component(c.connect_ns / NS_PER_MS, Quality.ESTIMATED)
    return Component(None, Quality.UNAVAILABLE)


def _derived_queue(r: RequestTimeline, s: ServerTiming, parts: dict[str, Component]
                   ) -> Component:
    """The wait the server did not report: its total less its other stages, or, without a
    total, the time to first token less the network and the server's stages before it."""
    if s.total is not None:
        stages = [s.preprocess, s.model_load, s.prefill, s.decode, s.inference, s.postprocess,
                  *(s.application or {}).values()]
        if s.prefill is None and s.inference is None:
            return Component(None, Quality.UNAVAILABLE)
        return Component(s.total - sum(v for v in stages if v is not None), Quality.DERIVED)
    if s.prefill is None or r.first_token_ns is None:
        return Component(None, Quality.UNAVAILABLE)
    before = sum(getattr(s, stage) or 0.0 for stage in BEFORE_FIRST_TOKEN)
    network = parts["network"].ms or 0.0
    return Component(ms_between(r.first_token_ns, r.sent_ns) - network - before,
                     Quality.DERIVED)
