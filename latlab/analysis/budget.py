"""Aggregate budgets: the mean request, the p99 tail, and breakdowns by prompt length, label
and time.

The **mean budget** is the mean of every component over the decomposed (successful) requests;
an unavailable component counts as 0 there, so the budget still adds up to the mean
E2E-from-schedule, and `coverage` says for which fraction of requests it was measured.
The **p99 tail budget** is the same mean over the requests whose E2E-from-schedule is at or
above the run's p99 (linear interpolation; at least the single slowest request): the
composition of a slow request, which is not the composition of an average one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latlab.analysis.decompose import (
    APP,
    BUCKETS,
    COMPONENTS,
    QUALITIES,
    UNAVAILABLE,
    Parts,
    Quality,
    members,
)
from latlab.analysis.requests import Requests
from latlab.metrics.stats import distribution, percentile
from latlab.records.columns import present
from latlab.records.summary import Distribution

TAIL_PERCENTILE = 99.0
PROMPT_EDGES = (64, 256, 1024, 4096, 16384)
MAX_TIME_WINDOWS = 10
MIN_REQUESTS_PER_WINDOW = 10
TIME_BLOCK = 65_536  # requests put in their time window at a time


@dataclass(slots=True)
class Budget:
    n: int
    total: float
    components: dict[str, float]
    coverage: dict[str, float]
    quality: dict[str, Quality | None]  # each component's most common quality (None: absent)

    def bucket(self, name: str) -> float:
        return sum(self.components[c] for c in members(name, self.components))

    def measured(self, bucket: str) -> bool:
        """Whether any of the bucket's components was measured for any request (else its 0
        is unknown, not zero)."""
        return any(self.coverage.get(c, 0.0) > 0 for c in members(bucket, self.components))

    def buckets(self) -> dict[str, float]:
        """Every bucket a run has time in (the unsplit ones, the gateway and the application
        only when it has components)."""
        return {b: self.bucket(b) for b in BUCKETS
                if (("unsplit" not in b and b != "gateway") or self.bucket(b) != 0.0)
                and (b != "application" or self.application())}

    def application(self) -> list[str]:
        """The application's components (`app:…`), largest first."""
        return sorted(members("application", self.components),
                      key=lambda c: -self.components[c])

    def share(self, component_or_bucket: str) -> float:
        value = (self.bucket(component_or_bucket) if component_or_bucket in BUCKETS
                 else self.components.get(component_or_bucket, 0.0))
        return value / self.total if self.total > 0 else 0.0


def budget(parts: Parts, which: np.ndarray | None = None) -> Budget | None:
    """The mean budget of the decomposed requests among `which` (a mask, or indices; all
    when None)."""
    if which is None or which.dtype == bool:
        chosen = np.flatnonzero(parts.decomposed if which is None else parts.decomposed & which)
    else:
        chosen = which[parts.decomposed[which]]
    n = len(chosen)
    if not n:
        return None
    counts, most_common, ms = {}, {}, {}
    for c, q in parts.quality.items():  # a component at a time: a spilled run's pages given back
        codes = q[chosen]
        # each quality's count (−1, not applicable, left out)
        counts[c] = np.bincount(codes + 1, minlength=len(QUALITIES) + 1)[1:]
        most_common[c] = _most_common(counts[c], codes)
        ms[c] = float(parts.value(c, chosen).sum()) / n
        parts.give_back()
    names = [*COMPONENTS, *(c for c in sorted(parts.ms) if c.startswith(APP) and counts[c].any())]
    return Budget(
        n=n,
        total=float(parts.total[chosen].sum()) / n,
        components={c: ms[c] for c in names},
        coverage={c: int(counts[c].sum() - counts[c][UNAVAILABLE]) / n for c in names},
        quality={c: most_common[c] for c in names},
    )


def _most_common(counts: np.ndarray, codes: np.ndarray) -> Quality | None:
    """The most common quality (`counts` of each); of equally common ones, the first to
    occur in `codes`."""
    if not counts.any():
        return None
    tied = np.flatnonzero(counts == counts.max())
    return QUALITIES[min(tied, key=lambda code: int(np.argmax(codes == code)))
                     if len(tied) > 1 else tied[0]]


def tail_budget(parts: Parts, which: np.ndarray | None = None,
                q: float = TAIL_PERCENTILE) -> Budget | None:
    """The budget of the requests at or above the q-th percentile of E2E from schedule."""
    chosen = parts.decomposed if which is None else parts.decomposed & which
    if not chosen.any():
        return None
    cut = percentile(np.sort(parts.total[chosen]), q)
    return budget(parts, chosen & (parts.total >= cut))


@dataclass(slots=True)
class Group:
    """A slice of the run: its requests' budget and their TTFT and E2E-from-schedule."""

    label: str
    n: int
    failed: int
    budget: Budget | None
    ttft: Distribution
    e2e: Distribution
    seconds: float | None = None  # a time window's length (`over_time`)


def group(label: str, requests: Requests, members: np.ndarray) -> Group:
    """The group of the requests where `members` (a mask) holds."""
    ok = members & requests.table.ok
    return Group(
        label=label,
        n=int(members.sum()),
        failed=int(members.sum() - ok.sum()),
        budget=budget(requests.parts, ok),
        ttft=distribution(requests.metrics.ttft[ok]),
        e2e=distribution(requests.metrics.e2e_sched[ok]),
    )


def group_by(requests: Requests, keys: np.ndarray, labels: list[str], order: np.ndarray
             ) -> list[Group]:
    """One group per key (codes into `labels`, −1: left out), in order of first appearance
    along `order` (the indices of the requests considered)."""
    ordered = keys[order]
    found, first = np.unique(ordered[ordered >= 0], return_index=True)
    considered = np.zeros(len(keys), bool)
    considered[order] = True
    return [group(labels[k], requests, considered & (keys == k))
            for k in found[np.argsort(first)]]


def prompt_bucket(tokens: float | None) -> str | None:
    if tokens is None or np.isnan(tokens):
        return None
    low = 0
    for edge in PROMPT_EDGES:
        if tokens < edge:
            return f"{low}–{edge - 1}"
        low = edge
    return f"≥{low}"


PROMPT_BUCKETS = [prompt_bucket(e - 1) for e in PROMPT_EDGES] + [prompt_bucket(PROMPT_EDGES[-1])]


def prompt_buckets(tokens: np.ndarray) -> np.ndarray:
    """Each request's prompt-length bucket: an index into PROMPT_BUCKETS, −1 without a count
    (a byte a request)."""
    buckets = np.searchsorted(PROMPT_EDGES, tokens, side="right").astype(np.int8)
    buckets[np.isnan(tokens)] = -1
    return buckets


def by_prompt_length(requests: Requests, which: np.ndarray) -> list[Group]:
    """A group per prompt-length bucket, shortest first (the buckets do not overlap)."""
    keys = prompt_buckets(requests.prompt_tokens)
    considered = which & (keys >= 0)
    return [group(PROMPT_BUCKETS[k], requests, considered & (keys == k))
            for k in np.unique(keys[considered]).tolist()]


def by_tenant(requests: Requests, which: np.ndarray) -> list[Group]:
    tenant = requests.table.tenant
    groups = group_by(requests, tenant.codes, list(tenant.names), np.flatnonzero(which))
    return sorted(groups, key=lambda g: g.label)


def by_priority(requests: Requests, which: np.ndarray) -> list[Group]:
    priority = requests.table.priority
    levels = np.unique(priority[~np.isnan(priority)])
    keys = np.where(np.isnan(priority), -1, np.searchsorted(levels, priority))
    groups = group_by(requests, keys, [str(int(p)) for p in levels], np.flatnonzero(which))
    return sorted(groups, key=lambda g: int(g.label))


def over_time(requests: Requests) -> list[Group]:
    """Consecutive windows of the run by schedule time, each with enough requests to mean
    something."""
    origin = requests.table.origin_ns
    timed = present(origin)
    n = int(timed.sum())
    if not n:
        return []
    start, last = int(origin[timed].min()), int(origin[timed].max())
    count = max(1, min(MAX_TIME_WINDOWS, n // MIN_REQUESTS_PER_WINDOW))
    width = (last - start + 1) / count
    keys = np.full(len(origin), -1, np.int16)  # each request's window, a block at a time
    for at in range(0, len(origin), TIME_BLOCK):
        block, shown = origin[at:at + TIME_BLOCK], timed[at:at + TIME_BLOCK]
        keys[at:at + TIME_BLOCK][shown] = np.floor((block[shown] - start) / width)
    labels = [f"{i * width / 1e9:.1f}–{(i + 1) * width / 1e9:.1f} s"
              for i in range(keys.max() + 1)]
    # the windows follow the schedule: first appearance in time is their order
    groups = [group(labels[k], requests, timed & (keys == k))
              for k in np.unique(keys[timed]).tolist()]
    for g in groups:
        g.seconds = width / 1e9
    return groups
