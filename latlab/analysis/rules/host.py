"""The host the load generator ran on, busy with other work: the timings are unreliable."""

from __future__ import annotations

from typing import TYPE_CHECKING

from latlab.analysis.findings import Finding, Severity, Unevaluated

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis


def busy_host(a: RunAnalysis) -> Finding | Unevaluated | None:
    """Other processes (neither the client nor the server), or the hypervisor's steal, took
    the host's CPU while the client idled: late timestamps are the host's doing, and more
    client workers would only add load."""
    client = a.client
    if client is None or client.host is None:
        return Unevaluated("busy_host", "needs the host's CPU over the run (summary.json → "
                                        "client.host, recorded by latlab bench)")
    if not client.host_busy:
        return None
    h = client.host
    return Finding("busy_host", Severity.WARNING,
                   "the host was busy with other work: the timings are unreliable",
                   list(client.host_reasons),
                   where="the machine latlab ran on, not the server under test",
                   fix="rerun on a quiet host (or give the load generator cores of its own); "
                       "adding --workers would only add load",
                   impact=min(1.0, h.other.mean / h.cpus))
