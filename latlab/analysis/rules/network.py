"""The network as a large share of the time: the client far from the server, or proxies."""

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
