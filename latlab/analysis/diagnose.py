"""Diagnosis: every rule over the measured evidence, findings most severe first.

A rule is a function `(RunAnalysis) -> Finding | Unevaluated | None`: a finding carries the
numbers behind it, where the time goes and what to try first; `Unevaluated` says what data
the rule would need; None means it was evaluated and found nothing (it stays silent).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from latlab.analysis.findings import Finding, Unevaluated
from latlab.analysis.rules import (
    client,
    compute,
    coverage,
    host,
    network,
    outcomes,
    peaks,
    queueing,
    server_state,
    serving,
    sessions,
    tenants,
)

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

Rule = Callable[["RunAnalysis"], "Finding | Unevaluated | None"]

RULES: tuple[Rule, ...] = (
    outcomes.failures,
    outcomes.rejections,
    serving.nothing_in_window,
    client.client_bottleneck,
    host.busy_host,
    host.host_bound_server,
    queueing.overload,
    queueing.queueing_under_load,
    peaks.peak_hours,
    queueing.slow_small_requests,
    serving.one_at_a_time,
    network.network_share,
    network.gateway_share,
    sessions.application_time,
    sessions.ttft_grows_with_turns,
    sessions.tool_time,
    compute.prefill_bound,
    compute.decode_stalls,
    tenants.noisy_neighbour,
    server_state.kv_cache_full,
    server_state.server_pause,
    coverage.cold_start,
    coverage.unattributed,
)
ALWAYS = (outcomes.failures, outcomes.rejections, serving.nothing_in_window)
# Rules that read each request's token events. Calls observed from their spans carry none (a
# model server's span gives the first token at most): whether they streamed is unknown, not 0.
TOKEN_EVENTS = (serving.one_at_a_time, compute.decode_stalls)
OBSERVED_STREAMS = ("needs each call's token events: calls observed from their spans carry none "
                    "(which of them streamed: observe.json)")


def diagnose(analysis: RunAnalysis) -> tuple[list[Finding], list[Unevaluated]]:
    """The findings (most severe, then most impact, first) and the rules that could not run."""
    findings: list[Finding] = []
    unevaluated: list[Unevaluated] = []
    eventless = analysis.config.kind == "observed" and not (analysis.table.events > 0).any()
    for rule in RULES:
        if not analysis.ok.any() and rule not in ALWAYS:
            unevaluated.append(Unevaluated(rule.__name__, "needs successful requests"))
            continue
        if eventless and rule in TOKEN_EVENTS:
            unevaluated.append(Unevaluated(rule.__name__, OBSERVED_STREAMS))
            continue
        result = rule(analysis)
        analysis.requests.give_back()  # the pages its columns read (a spilled analysis)
        if isinstance(result, Finding):
            findings.append(result)
        elif isinstance(result, Unevaluated):
            unevaluated.append(result)
    findings.sort(key=lambda f: (-f.severity, -f.impact))
    return findings, unevaluated
