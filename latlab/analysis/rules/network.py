"""The path to the engine as a large share of the time: the client far from the server, or a
gateway in front of the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from latlab.analysis.decompose import Quality
from latlab.analysis.findings import Finding, Severity, Unevaluated
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

NETWORK_SHARE, NETWORK_MIN_MS = 0.10, 20.0


def network_share(a: RunAnalysis) -> Finding | Unevaluated | None:
    if a.mean is None or a.mean.quality.get("network") in (None, Quality.UNAVAILABLE):
        return Unevaluated("network_share", "needs the network component: server timings "
                                            "with a total, or a measured round trip")
    network, share = a.mean.bucket("network"), a.mean.share("network")
    if network < NETWORK_MIN_MS or share < NETWORK_SHARE:
        return None
    evidence = [f"network (connect + transit): {ms(network)} of a mean {ms(a.mean.total)} "
                f"({pct(share)}), {pct(a.tail.share('network'))} of the p99 tail",
                f"measured as {a.mean.quality['network']} (see the decomposition)"]
    if a.config.target.rtt_ms is not None:
        evidence.append(f"a null request's round trip before the run: {ms(a.config.target.rtt_ms)}")
    return Finding("network_share", Severity.WARNING,
                   f"the network takes {pct(share)} of every request", evidence,
                   where="network: the distance between client and server, proxies, TLS",
                   fix="serve from closer to the callers (same region and zone), keep "
                       "connections alive, remove proxy hops",
                   impact=share)


GATEWAY_SHARE, GATEWAY_MIN_MS = 0.10, 20.0


def gateway_share(a: RunAnalysis) -> Finding | None:
    """A gateway in front of the engine holding a large share of the time (its hop, from the
    engine's spans); nothing to say without a gateway's hop."""
    if a.mean is None or a.hop is None:
        return None
    gateway, share = a.mean.bucket("gateway"), a.mean.share("gateway")
    if gateway < GATEWAY_MIN_MS or share < GATEWAY_SHARE:
        return None
    h = a.hop
    name = h.gateway.name if h.gateway is not None else "the gateway"
    return Finding("gateway_share", Severity.WARNING,
                   f"{name} takes {pct(share)} of every request", [
                       f"gateway intake {ms(a.mean.components['gateway_intake'])} + tail "
                       f"{ms(a.mean.components['gateway_tail'])} of a mean {ms(a.mean.total)}; "
                       f"{pct(a.tail.share('gateway'))} of the p99 tail",
                       f"first token {ms(h.client_ttft_ms)}: intake {ms(h.intake_ms)}, engine "
                       f"{ms(h.engine_ttft_ms)}, forwarding {ms(h.forward_ms)}",
                       f"{h.joined} of {h.requests} requests joined to the engine's spans"],
                   where="gateway: its intake (auth, routing, its own queue) before the engine "
                         "and its tail after it",
                   fix="give the gateway more workers or CPU, or turn off what it does per "
                       "request (logging, cost tracking, callbacks); measure the engine "
                       "directly (--url the engine) to see what it costs",
                   impact=share)
