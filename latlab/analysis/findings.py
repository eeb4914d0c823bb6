"""What a diagnosis rule returns: a finding with its evidence, or what it would need."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Sequence

import numpy as np


class Severity(IntEnum):
    INFO = 1
    WARNING = 2
    CRITICAL = 3

    def __str__(self) -> str:
        return self.name.lower()


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

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "severity": str(self.severity), "title": self.title,
                "evidence": self.evidence, "where": self.where, "fix": self.fix,
                "impact": round(self.impact, 4)}


@dataclass(slots=True)
class Unevaluated:
    """A rule that could not be evaluated on this run, and the data it needs."""

    rule: str
    needs: str


def mean(values: Sequence[float] | np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else 0.0
