"""Regression gates for CI: `--fail-if 'p99_ttft>+10%'` checked against a `Comparison`.

    KEY OP VALUE[UNIT]
    KEY    a comparison key: STAT_METRIC (p50_ttft, p99_e2e_sched, mean_tpot, ...),
           output_tokens_per_s, achieved_rate, goodput, error_rate
    OP     > (trips when the change is above VALUE) or < (below VALUE)
    VALUE  a signed change: +10% relative to the baseline, or absolute in the key's unit
           (+20ms or +0.02s for latencies, -5 for tok/s or req/s, +1 for error-rate points)

A gate trips when the change is past VALUE and its verdict is better or worse; it cannot tell
(inconclusive) when the change is past VALUE without a verdict, or when the change's interval
reaches past VALUE; else it passes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from latlab.analysis.compare import Change, Comparison
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

    def check(self, comparison: Comparison) -> GateResult:
        """Whether the gate trips, passes, or cannot tell (the change has no verdict, or its
        interval reaches the gate). Raises `GateError` for an unknown key."""
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
        if not self.relative:
            observed = change.delta
        elif change.a:
            observed = 100 * change.delta / change.a
        else:  # from 0 (an error rate): none is no change, any is past every relative gate
            observed = math.copysign(math.inf, change.delta) if change.delta else 0.0
        unit = "%" if self.relative else f" {change.unit}"
        moved = (f"{change.label} changed by {observed:+.1f}{unit} ({number(change.a, '{:.4g}')}"
                 f" → {number(change.b, '{:.4g}')} {change.unit})")
        beyond = observed > self.value if self.above else observed < self.value
        if not change.judged:  # a percentile of too few requests a block: no interval at all
            return GateResult(self, "inconclusive", f"{self.text}: {moved}, but not judged: "
                              f"{change.why}")
        if beyond:
            if change.decided and change.verdict != "same":
                return GateResult(self, "tripped", f"{self.text}: {moved}")
            return GateResult(self, "inconclusive", f"{self.text}: {moved}, but "
                              f"{change.why or 'it is no change'}: too noisy to gate")
        reach = self._reach(change)
        if reach is not None and (reach > self.value if self.above else reach < self.value):
            return GateResult(self, "inconclusive", f"{self.text}: {moved}, and its interval "
                              f"reaches {reach:+.3g}{unit}: too noisy to gate")
        return GateResult(self, "passed", f"{self.text}: {moved}")

    def _reach(self, change: Change) -> float | None:
        """How far the change's interval reaches towards the gate, in the gate's terms."""
        if change.interval is None or change.a is None:
            return None
        edge = change.interval.high if self.above else change.interval.low
        return 100 * edge if self.relative else edge * change.a


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    status: Literal["passed", "tripped", "inconclusive"]
    message: str
