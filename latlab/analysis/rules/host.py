"""The host: the one the load generator ran on, busy with other work (the timings are
unreliable), and the server's, when its CPU and not its accelerator sets the step time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from latlab.analysis.advice import host_bound_advice, server_of
from latlab.analysis.findings import Finding, Severity, Unevaluated
from latlab.analysis.host_bound import host_bound

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


def host_bound_server(a: RunAnalysis) -> Finding | Unevaluated | None:
    """The server's host, not its accelerator, set the step time (`host_bound`)."""
    client = a.client
    if client is None or client.host is None:
        return None  # busy_host says what is missing
    if client.host.server is None:
        return Unevaluated("host_bound_server", "needs the serving process's CPU over the run "
                                                "(an embedded engine, or a server listening "
                                                "on this host's loopback)")
    bound = host_bound(a)
    if bound is None:
        return None
    _, kind = server_of(a)
    return Finding("host_bound_server", Severity.INFO,
                   f"the server is host-bound: {bound.summary}", list(bound.evidence),
                   where="the serving process's CPU work between the accelerator's steps",
                   fix=host_bound_advice(bound, kind).text, impact=0.0)
