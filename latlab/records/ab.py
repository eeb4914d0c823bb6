"""`ab.json`: an A/B of two settings: the runs of each round, every metric's change with its
confidence interval and verdict, and the server counters that explain it."""

from __future__ import annotations

from typing import Literal

from latlab.records.summary import Record

AB_JSON = "ab.json"


class ABRound(Record):
    side: Literal["A", "B"]
    round: int
    run: str  # the round's run folder


class ABChange(Record):
    """B against A for one metric (`latlab compare`'s row)."""

    key: str
    label: str
    unit: str
    a: float | None
    b: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    significant: bool | None = None
    verdict: Literal["better", "worse", "same"]


class ABRecord(Record):
    created: float
    a: str  # the setting: serve args, or a URL
    b: str
    rounds: list[ABRound] = []
    changes: list[ABChange] = []
    counters: dict[Literal["A", "B"], dict[str, float]] = {}  # explainer → value, per side
    workload_differences: list[str] = []
    interrupted: bool = False
