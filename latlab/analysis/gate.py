"""Regression gates for CI: `--fail-if 'p99_ttft>+10%'` checked against a `Comparison`.

    KEY OP VALUE[UNIT]
    KEY    a comparison key: STAT_METRIC (p50_ttft, p99_e2e_sched, mean_tpot, ...),
           output_tokens_per_s, achieved_rate, goodput, error_rate
    OP     > (trips when the change is above VALUE) or < (below VALUE)
    VALUE  a signed change: +10% relative to the baseline, or absolute in the key's unit
           (+20ms or +0.02s for latencies, -5 for tok/s or req/s, +1 for error-rate points)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from latlab.analysis.compare import Comparison
from latlab.units import number

_GATE = re.compile(r"^\s*(?P<key>[a-z0-9_.]+)\s*(?P<op>[<>])\s*(?P<value>[+-]?[0-9.]+)"
                   r"\s*(?P<unit>%|ms|s)?\s*$")


class GateError(ValueError):
    """A threshold that cannot be parsed or does not name a compared metric."""


@dataclass(frozen=True)
class Gate:
    text: str
    key: str
    above: bool
    value: float
    relative: bool

    @classmethod
    def parse(cls, text: str) -> Gate:
        match = _GATE.match(text)
        if not match:
            raise GateError(f"--fail-if {text!r}: expected KEY>VALUE or KEY<VALUE, "
                            "e.g. 'p99_ttft>+10%' or 'output_tokens_per_s<-5%'")
        value = float(match["value"])
        unit = match["unit"]
        if unit == "s":
            value *= 1000.0
        return cls(text.strip(), match["key"], match["op"] == ">", value, unit == "%")

    def check(self, comparison: Comparison, require_significance: bool = False) -> str | None:
        """A message when the gate trips, else None. Raises `GateError` for an unknown key."""
        change = comparison.change(self.key)
        if change is None and self.key == "goodput":
            raise GateError(f"--fail-if {self.text!r}: goodput needs both runs judged by the "
                            "same SLOs: give compare --slo (e.g. --slo ttft=500ms)")
        if change is None:
            keys = ", ".join(c.key for c in comparison.changes)
            raise GateError(f"--fail-if {self.text!r}: unknown metric {self.key!r} (one of {keys})")
        if change.delta is None:
            missing = " and ".join(n for n, v in (("A", change.a), ("B", change.b)) if v is None)
            raise GateError(f"--fail-if {self.text!r}: {change.label} was not measured in "
                            f"run {missing}")
        observed = change.relative * 100 if self.relative else change.delta
        if observed is None:
            return None
        tripped = observed > self.value if self.above else observed < self.value
        if not tripped or (require_significance and change.significant is False):
            return None
        unit = "%" if self.relative else f" {change.unit}"
        noise = "" if change.significant is not False else " (within noise: not significant)"
        return (f"{self.text}: {change.label} changed by {observed:+.1f}{unit} "
                f"({number(change.a, '{:.4g}')} → {number(change.b, '{:.4g}')} {change.unit})"
                f"{noise}")
