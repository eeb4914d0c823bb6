"""Diagnosis: every rule over the measured evidence, findings most severe first.

A rule is a function `(RunAnalysis) -> Finding | Unevaluated | None`: a finding carries the
numbers behind it, where the time goes and what to try first; `Unevaluated` says what data
the rule would need; None means it was evaluated and found nothing (it stays silent).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from latlab.analysis import rules_run, rules_timing
from latlab.analysis.findings import Finding, Unevaluated

if TYPE_CHECKING:
    from latlab.analysis.run import RunAnalysis

Rule = Callable[["RunAnalysis"], "Finding | Unevaluated | None"]

RULES: tuple[Rule, ...] = (
    rules_run.failures,
    rules_run.rejections,
    rules_run.client_bottleneck,
    rules_run.explodes_at_peak,
    rules_timing.load_growth,
    rules_timing.tiny_prompts_slow,
    rules_timing.prefill_dominates,
    rules_timing.stutter,
    rules_timing.tenant_interference,
    rules_run.cold_start,
    rules_run.unattributed,
)
ALWAYS = (rules_run.failures, rules_run.rejections)


def diagnose(analysis: RunAnalysis) -> tuple[list[Finding], list[Unevaluated]]:
    """The findings (most severe, then most impact, first) and the rules that could not run."""
    findings: list[Finding] = []
    unevaluated: list[Unevaluated] = []
    for rule in RULES:
        if not analysis.decomposed and rule not in ALWAYS:
            unevaluated.append(Unevaluated(rule.__name__, "needs successful requests"))
            continue
        result = rule(analysis)
        if isinstance(result, Finding):
            findings.append(result)
        elif isinstance(result, Unevaluated):
            unevaluated.append(result)
    findings.sort(key=lambda f: (-f.severity, -f.impact))
    return findings, unevaluated
