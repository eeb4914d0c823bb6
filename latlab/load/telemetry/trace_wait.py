"""How long a trace must be quiet before it is complete (`latlab observe`'s --trace-wait),
derived from how its spans were seen to arrive.

A trace's spans come in several export requests: each service exports its own, and the
OpenTelemetry SDK's BatchSpanProcessor sends a batch every 5 s, so two spans of a trace that
end a moment apart can arrive 5 s apart (more, plus the time between their ends). Waiting
exactly the SDK's delay splits traces; waiting much longer holds every trace's spans (memory,
and the spans a second observe can take within --max-pending-spans).

So the wait is learnt: the longest gap seen between two arrivals of one trace's spans, doubled
(`MARGIN`), between `FLOOR_NS` and `CEILING_NS`. Until `LEARNING_TRACES` traces have been seen
it is at least `INITIAL_NS` (twice the SDK's delay), so the first traces are not split while
the gaps are learnt; a span that arrives for a trace already explained (a split: its gap was
longer than the wait) is counted and lengthens it. A --trace-wait given fixes it.

    wait = TraceWait(fixed_ns=None)
    wait.gap(arrival_ns - previous_arrival_ns)   # a span joined a waiting trace
    wait.split(arrival_ns - completed_ns)        # ... or one already explained
    wait.ns                                      # the wait now
"""

from __future__ import annotations

from dataclasses import dataclass

S = 10**9
INITIAL_NS = 10 * S  # twice the SDK's 5 s batch delay
FLOOR_NS = 1 * S
CEILING_NS = 30 * S
MARGIN = 2
LEARNING_TRACES = 200


@dataclass(slots=True)
class TraceWait:
    fixed_ns: int | None = None  # --trace-wait, when given
    gap_ns: int = 0  # the longest gap seen between two arrivals of one trace's spans
    traces: int = 0  # traces complete so far
    splits: int = 0  # spans that arrived for a trace already explained

    def gap(self, ns: int) -> None:
        self.gap_ns = max(self.gap_ns, ns)

    def split(self, ns: int) -> None:
        self.splits += 1
        self.gap(ns)

    @property
    def ns(self) -> int:
        if self.fixed_ns is not None:
            return self.fixed_ns
        learnt = min(CEILING_NS, max(FLOOR_NS, MARGIN * self.gap_ns))
        return max(learnt, INITIAL_NS) if self.traces < LEARNING_TRACES else learnt
