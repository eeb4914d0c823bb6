"""Aggregate budgets: the mean request, the p99 tail, and breakdowns by prompt length, label and time.

The **mean budget** is the mean of every component over the decomposed (successful) requests;
an unavailable component counts as 0 there, so the budget still adds up to the mean
E2E-from-schedule, and `coverage` says for which fraction of requests it was measured.
The **p99 tail budget** is the same mean over the requests whose E2E-from-schedule is at or
above the run's p99 (linear interpolation; at least the single slowest request): the
composition of a slow request, which is not the composition of an average one.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from latlab.analysis.decompose import APP, BUCKETS, COMPONENTS, Decomposition, Quality, members
from latlab.metrics.request import RequestMetrics
from latlab.metrics.stats import distribution, percentile
from latlab.records.summary import Distribution
from latlab.records.timeline import RequestTimeline

TAIL_PERCENTILE = 99.0
PROMPT_EDGES = (64, 256, 1024, 4096, 16384)
MAX_TIME_WINDOWS = 10
MIN_REQUESTS_PER_WINDOW = 10


@dataclass(slots=True)
class Row:
    """One request with everything derived from it."""

    record: RequestTimeline
    metrics: RequestMetrics
    parts: Decomposition | None
    in_flight: int  # other requests in flight when it was sent


@dataclass(slots=True)
class Budget:
    n: int
    total: float
    components: dict[str, float]
    coverage: dict[str, float]
    quality: dict[str, Quality | None]  # each component's most common quality (None: absent)

    def bucket(self, name: str) -> float:
        return sum(self.components[c] for c in members(name, self.components))

    def buckets(self) -> dict[str, float]:
        """Every bucket a run has time in (the unsplit ones and the application only when
        it has components)."""
        return {b: self.bucket(b) for b in BUCKETS
                if ("unsplit" not in b or self.bucket(b) != 0.0)
                and (b != "application" or self.application())}

    def application(self) -> list[str]:
        """The application's components (`app:…`), largest first."""
        return sorted(members("application", self.components),
                      key=lambda c: -self.components[c])

    def share(self, component_or_bucket: str) -> float:
        value = (self.bucket(component_or_bucket) if component_or_bucket in BUCKETS
                 else self.components.get(component_or_bucket, 0.0))
        return value / self.total if self.total > 0 else 0.0


def budget(parts: Sequence[Decomposition]) -> Budget | None:
    if not parts:
        return None
    n = len(parts)
    names = [*COMPONENTS, *sorted({c for p in parts for c in p.components if c.startswith(APP)})]
    return Budget(
        n=n,
        total=sum(p.total for p in parts) / n,
        components={c: sum(p.ms(c) for p in parts) / n for c in names},
        coverage={c: sum(p.quality(c) not in (None, Quality.UNAVAILABLE) for p in parts) / n
                  for c in names},
        quality={c: _most_common(p.quality(c) for p in parts) for c in names},
    )


def _most_common(qualities: Iterable[Quality | None]) -> Quality | None:
    counts = Counter(q for q in qualities if q is not None)
    return counts.most_common(1)[0][0] if counts else None


def tail_budget(parts: Sequence[Decomposition], q: float = TAIL_PERCENTILE) -> Budget | None:
    if not parts:
        return None
    cut = percentile(sorted(p.total for p in parts), q)
    return budget([p for p in parts if p.total >= cut])


@dataclass(slots=True)
class Group:
    """A slice of the run: its requests' budget and their TTFT and E2E-from-schedule."""

    label: str
    n: int
    failed: int
    budget: Budget | None
    ttft: Distribution
    e2e: Distribution


def group(label: str, rows: Sequence[Row]) -> Group:
    ok = [r for r in rows if r.record.ok]
    return Group(
        label=label,
        n=len(rows),
        failed=len(rows) - len(ok),
        budget=budget([r.parts for r in ok if r.parts is not None]),
        ttft=distribution(r.metrics.ttft for r in ok),
        e2e=distribution(r.metrics.e2e_sched for r in ok),
    )


def group_by(rows: Sequence[Row], key: Callable[[Row], str | None]) -> list[Group]:
    """One group per distinct key, in order of first appearance; rows without a key are left out."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        k = key(row)
        if k is not None:
            groups.setdefault(k, []).append(row)
    return [group(k, members) for k, members in groups.items()]


def prompt_tokens(row: Row) -> int | None:
    r = row.record
    return r.prompt_tokens if r.prompt_tokens is not None else r.prompt_tokens_planned


def prompt_bucket(tokens: int | None) -> str | None:
    if tokens is None:
        return None
    low = 0
    for edge in PROMPT_EDGES:
        if tokens < edge:
            return f"{low}–{edge - 1}"
        low = edge
    return f"≥{low}"


def by_prompt_length(rows: Sequence[Row]) -> list[Group]:
    ordered = sorted((r for r in rows if prompt_tokens(r) is not None), key=prompt_tokens)
    return group_by(ordered, lambda r: prompt_bucket(prompt_tokens(r)))


def by_tenant(rows: Sequence[Row]) -> list[Group]:
    return sorted(group_by(rows, lambda r: r.record.tenant), key=lambda g: g.label)


def by_priority(rows: Sequence[Row]) -> list[Group]:
    keyed = group_by(rows, lambda r: None if r.record.priority is None else str(r.record.priority))
    return sorted(keyed, key=lambda g: int(g.label))


def over_time(rows: Sequence[Row]) -> list[Group]:
    """Consecutive windows of the run by schedule time, each with enough requests to mean something."""
    timed = sorted((r for r in rows if r.record.origin_ns is not None),
                   key=lambda r: r.record.origin_ns)
    if not timed:
        return []
    start = timed[0].record.origin_ns
    span = timed[-1].record.origin_ns - start + 1
    count = max(1, min(MAX_TIME_WINDOWS, len(timed) // MIN_REQUESTS_PER_WINDOW))
    width = span / count
    return group_by(timed, lambda r: _window_label(start, width, r.record.origin_ns))


def _window_label(start: int, width: float, t: int) -> str:
    i = math.floor((t - start) / width)
    return f"{i * width / 1e9:.1f}–{(i + 1) * width / 1e9:.1f} s"


def in_flight_at(starts: Sequence[int], ends: Sequence[int], times: Sequence[int]) -> np.ndarray:
    """For each time, how many of the intervals `[start, end)` contain it."""
    return (np.searchsorted(np.sort(np.asarray(starts, dtype=np.int64)), times, side="right")
            - np.searchsorted(np.sort(np.asarray(ends, dtype=np.int64)), times, side="right"))


def in_flight_at_send(records: Sequence[RequestTimeline]) -> list[int]:
    """For each record, how many other requests had been sent and were not finished when it was sent."""
    sent = [r for r in records if r.sent_ns is not None]
    counts = iter(in_flight_at([r.sent_ns for r in sent], [r.end_ns for r in sent],
                               [r.sent_ns for r in sent]))
    return [max(int(next(counts)) - 1, 0) if r.sent_ns is not None else 0 for r in records]
