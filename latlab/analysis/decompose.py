"""Where one request's time went: its end-to-end time from schedule split into components.

Whatever server reported the timings (`ServerTiming.source`), the same components, each with
its quality: exact (one measured interval), derived (differences of measured intervals),
estimated (a proxy), unavailable (its time sits in another component). `usage` is when the
event carrying the server's timings arrived (a stream's final event, a body).

    client_wait   = (sent − scheduled) − connection setup                 derived
    connect       = DNS + TCP connect of a new connection                 exact
    tls           = the TLS handshake of a new connection (https)         exact
    network       = transit = (usage − sent) − server.total               derived; with the run's
                    baseline: min(transit, baseline)                      estimated
    intake        = transit − network: the request waited to be read      derived
                    (a frozen or overloaded server; or network jitter)
                    without a server total: one round trip, a null request's (a path no
                    server routes) before the run, else the request's TCP connect   estimated
    preprocess, queue, model_load, prefill, decode, inference
                  = the server's own durations                            exact
    model_call    = the model's time as its caller saw it, where the model server itself
                    said nothing (its stages and the network to it, unsplit)   exact
    queue (when the server does not report it) = server.total − its other stages, or, without a
                    total, (first_token − sent) − network − the server's stages before it
                    (the decode too, when one event carried the whole answer)       derived
    postprocess   = server.postprocess + (done − usage)                   derived (estimated
                                                                          without the former)
    app:NAME      = an application in front of the model (its spans, `server.application`):
                    the time of its spans named NAME outside the model call   exact
    app:other     = the application's total − its spans − the model server's total
                    (its own work, and the network to the model)          derived
    unattributed  = E2E-from-schedule − all of the above                  derived

Behind a gateway whose hop the engine's spans gave (`server.gateway_*`, on the client's clock,
`load/telemetry/upstream.py`) the engine's stages are as above and the time around them is the
gateway's:

    network         = one round trip to the gateway, at most the hop: the kernel's of the
                      run's TCP handshakes, else its quickest TCP connect (a null
                      request's would hold the gateway's own routing; a loaded client's
                      connects carry its own delays)                      estimated
    gateway_intake  = (engine received − sent) − network / 2              derived
    gateway_tail    = (done − engine finished) − network / 2              derived
    postprocess     = server.postprocess (the engine's own)               exact

Without server timings the client can still say: client_wait and connect as above,
`ttft_unsplit` = first_token − sent (derived), decode = last_token − first_token and
postprocess = done − last_token (estimated); network, preprocess, queue and prefill are
unavailable. The components always add up to E2E-from-schedule; the residual is shown, never
folded away.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The vocabulary, read from here by the reports and rules too.
from latlab.analysis.components import (  # noqa: F401
    APP,
    BEFORE_FIRST_TOKEN,
    BUCKETS,
    COMPONENTS,
    DERIVED,
    ESTIMATED,
    EXACT,
    GATEWAY,
    LABELS,
    QUALITIES,
    SERVER_STAGES,
    UNAVAILABLE,
    Component,
    Quality,
    label,
    members,
)
from latlab.analysis.parts import Decomposition, Parts  # noqa: F401 (read from here too)
from latlab.records.columns import ms_between, one_value, present
from latlab.records.spill import Spill
from latlab.records.table import RequestTable, as_table
from latlab.records.timeline import NS_PER_MS, RequestTimeline


@dataclass(frozen=True, slots=True)
class NetworkBaseline:
    """What the run says about its network: the baseline of the transit (observed − server
    total) over its requests, a null request's round trip (else the median TCP connect), and
    one TCP round trip: the kernel's of the new connections' handshakes (median), else (older
    runs, other systems) their quickest connect. A connect's duration holds the client's own
    delays too: a loaded client's reach tens of ms, more than a local gateway's whole hop."""

    transit_ms: float | None = None
    rtt_ms: float | None = None
    tcp_rtt_ms: float | None = None


BLOCK_ROWS = 1 << 16  # requests decomposed at a time
# The order a request's components are summed in (its residual is unattributed).
SERVER_ORDER = ("client_wait", "connect", "tls", "preprocess", "queue", "model_load", "prefill",
                "decode", "inference", "model_call", "network", "intake", "postprocess",
                *GATEWAY)
CLIENT_ORDER = ("client_wait", "connect", "tls", "network", "preprocess", "queue", "prefill",
                "ttft_unsplit", "decode", "postprocess")


def decompose(r: RequestTimeline, base: NetworkBaseline = NetworkBaseline()
              ) -> Decomposition | None:
    """The request's components, or None when it has no E2E (failed, or never sent or done)."""
    return decompose_all(as_table([r]), base).row(0)


def decompose_all(t: RequestTable, base: NetworkBaseline = NetworkBaseline(),
                  spill: Spill | None = None) -> Parts:
    """Every request's components (see the module's docstring for each formula), a block of
    `BLOCK_ROWS` requests at a time: the formulas' intermediate columns are a block's, not
    the run's (a million requests' were 0.4 GB); with a `spill`, each block's columns are
    written to it as they are made (`records.spill`), so no column is held in memory."""
    blocks = (_decompose(t.block(lo, min(lo + BLOCK_ROWS, len(t))), base)
              for lo in range(0, len(t), BLOCK_ROWS))
    if spill is not None and len(t):
        return Parts.spilled(blocks, spill)
    if len(t) <= BLOCK_ROWS:
        return _decompose(t, base)
    return Parts.concat(list(blocks))


def _decompose(t: RequestTable, base: NetworkBaseline) -> Parts:
    n = len(t)
    done = t.ok & present(t.sent_ns) & present(t.done_ns)
    names = [*COMPONENTS, *(APP + name for name in t.application)]
    unset = np.broadcast_to(np.nan, n)  # a component no request has a time for: no memory
    ms = dict.fromkeys(names, unset)
    quality = {c: np.full(n, -1, np.int8) for c in names}

    def put(name: str, where: np.ndarray, value: np.ndarray | float, code) -> None:
        where = where & done
        values = value[where] if isinstance(value, np.ndarray) else value
        if ms[name] is unset and not np.isnan(values).all():
            ms[name] = np.full(n, np.nan)
        if ms[name] is not unset:
            ms[name][where] = values
        quality[name][where] = code[where] if isinstance(code, np.ndarray) else code

    phases = [np.nan_to_num(t.phases[p]) for p in ("dns_ns", "connect_ns", "tls_ns")]
    setup = np.where(t.has_connection, sum(phases) / NS_PER_MS, np.nan)
    wait = ms_between(t.sent_ns, t.scheduled_ns)
    waited, set_up = ~np.isnan(wait), ~np.isnan(setup)
    put("client_wait", np.ones(n, bool), np.where(set_up, wait - setup, wait),
        np.where(waited, DERIVED, UNAVAILABLE))
    handshake = t.phases["tls_ns"] / NS_PER_MS
    shaken = set_up & ~np.isnan(handshake)
    put("connect", np.ones(n, bool), np.where(waited, setup - np.nan_to_num(handshake), np.nan),
        np.where(waited & set_up, EXACT, UNAVAILABLE))
    put("tls", shaken, handshake, EXACT)
    _with_server(t, base, t.has_server, put, ms)
    _client_only(t, ~t.has_server, put)
    apps = tuple(APP + name for name in t.application)
    cut = SERVER_ORDER.index("model_call") + 1  # the application's after the server's own
    order = {True: (*SERVER_ORDER[:cut], *apps, *SERVER_ORDER[cut:]), False: CLIENT_ORDER}
    accounted = {k: sum(np.nan_to_num(ms[c]) for c in summed) for k, summed in order.items()}
    total = np.where(done, ms_between(t.done_ns, t.origin_ns), np.nan)
    put("unattributed", np.ones(n, bool),
        total - np.where(t.has_server, accounted[True], accounted[False]), DERIVED)
    # A component no request has (NaN throughout), or of one quality throughout, held once.
    return Parts(total=total, ms={c: one_value(v) for c, v in ms.items()},
                 quality={c: one_value(v) for c, v in quality.items()},
                 has_server=t.has_server & done, decomposed=done)


def arrival_ns(t: RequestTable) -> np.ndarray:
    """When the event carrying the server's timings arrived: its usage event, else its end;
    an application's total runs to its response's end, past the usage event it relays."""
    relayed = t.has_application & (sum(~np.isnan(v) for v in t.application.values()) > 0)
    return np.where(present(t.usage_ns) & ~relayed, t.usage_ns, t.done_ns)


def _with_server(t: RequestTable, base: NetworkBaseline, rows: np.ndarray, put, ms) -> None:
    s = t.server
    arrived = arrival_ns(t)
    for stage in ("preprocess", "queue", "model_load", "prefill", "decode", "inference",
                  "model_call"):
        put(stage, rows, s[stage], np.where(np.isnan(s[stage]), UNAVAILABLE, EXACT))
    for name, values in t.application.items():
        put(APP + name, rows & ~np.isnan(values), values, DERIVED if name == "other" else EXACT)
    totalled = rows & ~np.isnan(s["total"])
    transit = ms_between(arrived, t.sent_ns) - s["total"]
    if base.transit_ms is None:
        put("network", totalled, transit, DERIVED)
    else:
        network = np.minimum(transit, base.transit_ms)
        put("network", totalled, network, ESTIMATED)
        put("intake", totalled, transit - network, DERIVED)
    _round_trip(t, base, rows & np.isnan(s["total"]), put)
    unqueued = rows & np.isnan(s["queue"])
    stages = sum(np.nan_to_num(s[x]) for x in ("preprocess", "model_load", "prefill", "decode",
                                               "inference", "postprocess"))
    stages = stages + sum(np.nan_to_num(v) for v in t.application.values())
    computed = ~np.isnan(s["prefill"]) | ~np.isnan(s["inference"])
    put("queue", unqueued & totalled, np.where(computed, s["total"] - stages, np.nan),
        np.where(computed, DERIVED, UNAVAILABLE))
    before = sum(np.nan_to_num(s[x]) for x in BEFORE_FIRST_TOKEN)
    # one event carrying the whole answer (not streamed): it came after the decode too
    whole = (t.events <= 1) & (np.nan_to_num(t.completion_tokens) > 1)
    before = before + np.where(whole, np.nan_to_num(s["decode"]) + np.nan_to_num(s["inference"]),
                               0.0)
    timed = ~np.isnan(s["prefill"]) & present(t.first_token_ns)
    queue = ms_between(t.first_token_ns, t.sent_ns) - np.nan_to_num(ms["network"]) - before
    put("queue", unqueued & ~totalled, np.where(timed, queue, np.nan),
        np.where(timed, DERIVED, UNAVAILABLE))
    tail = np.nan_to_num(ms_between(t.done_ns, arrived))
    post = s["postprocess"]
    put("postprocess", rows, np.nan_to_num(post) + tail,
        np.where(np.isnan(post), ESTIMATED, DERIVED))
    _gateway(t, base, rows & ~np.isnan(s["gateway_intake"]) & ~np.isnan(s["gateway_tail"]), put)


def _gateway(t: RequestTable, base: NetworkBaseline, rows: np.ndarray, put) -> None:
    """The gateway's hop around the engine: its intake before the engine saw the request and
    its tail after the engine finished, less one TCP round trip to it (a null request's
    holds the gateway's routing)."""
    s = t.server
    intake, tail = s["gateway_intake"], s["gateway_tail"]
    rtt = base.tcp_rtt_ms
    trip = np.minimum(rtt, intake + tail) if rtt is not None else np.nan
    put("network", rows, trip, UNAVAILABLE if rtt is None else ESTIMATED)
    half = np.nan_to_num(trip) / 2
    put("gateway_intake", rows, intake - half, DERIVED)
    put("gateway_tail", rows, tail - half, DERIVED)
    put("intake", rows, np.nan, -1)
    post = s["postprocess"]
    put("postprocess", rows, post, np.where(np.isnan(post), UNAVAILABLE, EXACT))


def _round_trip(t: RequestTable, base: NetworkBaseline, rows: np.ndarray, put) -> None:
    """Without a server total, the network is estimated as one round trip: the run's (a null
    request's, measured before the run), else this request's TCP connect time."""
    if base.rtt_ms is not None:
        put("network", rows, base.rtt_ms, ESTIMATED)
        return
    connect = np.where(t.new_connection, t.phases["connect_ns"] / NS_PER_MS, np.nan)
    put("network", rows, connect, np.where(np.isnan(connect), UNAVAILABLE, ESTIMATED))


def _client_only(t: RequestTable, rows: np.ndarray, put) -> None:
    """Without server timings: the time to first token unsplit, decode and postprocess
    estimated from the token events; the server's stages unavailable."""
    for name in ("network", *SERVER_STAGES[:3]):
        put(name, rows, np.nan, UNAVAILABLE)
    first = np.where(present(t.first_token_ns), t.first_token_ns, t.done_ns)
    last = np.where(present(t.last_token_ns), t.last_token_ns, first)
    put("ttft_unsplit", rows, ms_between(first, t.sent_ns), DERIVED)
    put("decode", rows, ms_between(last, first), ESTIMATED)
    put("postprocess", rows, ms_between(t.done_ns, last), ESTIMATED)
