"""What a diagnosis rule returns: a finding with its evidence and what to try (`Advice`, and
the setting it changes: `Change`), or what it would need."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal

import numpy as np

Knob = Literal["step_tokens", "prefix_caching", "max_num_seqs", "fair_share"]


class Severity(IntEnum):
    INFO = 1
    WARNING = 2
    CRITICAL = 3

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Change:
    """A setting to try, in the server's own options: what `latlab ab` measures (`args`
    added to the server's command) and what `latlab predict` simulates (`knob` = `value`)."""

    knob: Knob
    value: int | bool
    server: str
    args: str

    def to_json(self) -> dict[str, object]:
        return {"knob": self.knob, "value": self.value, "server": self.server,
                "args": self.args}


@dataclass(frozen=True)
class Advice:
    """One thing to try, in words, and the setting it changes when it names one."""

    text: str
    change: Change | None = None


@dataclass(slots=True)
class Finding:
    """A symptom the evidence shows, where the time goes, and what to try first."""

    rule: str
    severity: Severity
    title: str
    evidence: list[str]
    where: str
    fix: str
    impact: float  # the share of time or requests it touches (0..1): orders equal severities
    tries: list[Advice] = field(default_factory=list)  # `fix`, one suggestion at a time
    metric: tuple[str, str] | None = None  # the metric and percentile the finding is about
    notes: list[str] = field(default_factory=list)  # each change's predicted effect, its `ab`

    @property
    def changes(self) -> list[Change]:
        """The settings `fix` names."""
        return [t.change for t in self.tries if t.change is not None]

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "severity": str(self.severity), "title": self.title,
                "evidence": self.evidence, "where": self.where, "fix": self.fix,
                "impact": round(self.impact, 4),
                "changes": [c.to_json() for c in self.changes],
                "metric": list(self.metric) if self.metric else None, "notes": self.notes}


@dataclass(slots=True)
class Unevaluated:
    """A rule that could not be evaluated on this run, and the data it needs."""

    rule: str
    needs: str


def mean(values: Sequence[float] | np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else 0.0
