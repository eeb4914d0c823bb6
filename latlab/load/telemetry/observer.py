"""Spans arriving from a live service, turned into call records (`latlab observe`).

Spans come in batches, a trace's spans in several (each service exports its own, seconds
apart), so they are grouped per trace until the trace has been quiet for a while (`trace_wait`:
learnt from the gaps seen between a trace's spans, or --trace-wait), as an OpenTelemetry
Collector's group-by-trace processor does; then its LLM calls become records
(`calls`). Memory stays bounded: at most `max_spans` spans wait, each with only the
attributes its calls are made from (`held`: about 0.5 KB a span), past it the trace quiet the
longest is explained with the spans it has (`forced`). A call seen by one side only that names
the other's id (a client that did not propagate its trace context, so its model server's span
is in another trace) waits as long again for its other half, then goes alone.

Each call's lateness (its first span's arrival after its start) and the earliest start still
waiting give the `watermark`: the start time before which every call is in (`watermark`).

    observer = Observer(TraceWait(), max_spans=200_000, mark=Watermark(5e9, 120e9))
    observer.add(spans, now_ns)            # from the receiver's thread
    records = observer.ready(now_ns)       # complete calls, from the main thread
    for record in observer.complete(now_ns): ...   # ... or one at a time
    observer.watermark(now_ns)             # calls that started before it are all in
    observer.accepting(now_ns)             # False: refuse the export (503), it comes again
    records += observer.finish()           # at the end: everything still waiting

`now_ns` is the clock traces are quiet by: the arrival time live; a file's span end times.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from latlab.load.telemetry.attributes import Attributes
from latlab.load.telemetry.calls import Call, calls_of, joined, record_of, steps_of, streamed
from latlab.load.telemetry.conventions import KEPT, MODEL
from latlab.load.telemetry.trace_wait import TraceWait
from latlab.load.telemetry.watermark import EXPORT_DELAY_NS, Watermark
from latlab.records.spans import NO_EVENTS, Span
from latlab.records.timeline import RequestTimeline

DEFAULT_BOUND_NS = 120 * 10**9  # --max-lateness's default
EXPLAINED_KEPT = 50_000  # trace ids explained lately, to tell a split trace's late spans


@dataclass(slots=True)
class _Waiting:
    """A trace's spans so far: when its first and last arrived, its earliest start; its id
    (the one string its spans share)."""

    trace_id: str
    spans: list[Span]
    first_ns: int
    last_ns: int
    start_ns: int


@dataclass(slots=True)
class _Half:
    """A call seen by one side only, waiting until `due_ns` for its other half; when its
    trace's first span arrived, and its trace's earliest start."""

    call: Call
    due_ns: int
    first_ns: int
    start_ns: int


def held(s: Span) -> Span:
    """`s` as it waits for its trace: only the attributes its calls are made from (`KEPT`),
    compact, and no events (what the receiver decodes for observe; a file's spans and those
    kept whole for --keep-spans are cut to it here)."""
    return replace(s, attributes=KEPT.of(s.attributes.items()), events=NO_EVENTS)


class Observer:
    def __init__(self, wait: TraceWait | float, max_spans: int,
                 mark: Watermark | None = None) -> None:
        """`wait`: the trace wait, or a fixed one in ns."""
        self.wait = wait if isinstance(wait, TraceWait) else TraceWait(int(wait))
        self.max_spans = max_spans
        self.mark = mark or Watermark(EXPORT_DELAY_NS, DEFAULT_BOUND_NS)
        self.spans = self.traces = self.calls = 0
        self.traces_without_call = self.forced = self.unseen_model = self.malformed = 0
        self.sources: Counter[str] = Counter()
        self.streamed: Counter[bool | None] = Counter()  # True, False, None: unknown
        self.models: Counter[str] = Counter()
        self._pending: OrderedDict[str, _Waiting] = OrderedDict()  # the quiet longest first
        self._held = 0
        self._halves: OrderedDict[str, _Half] = OrderedDict()
        # Trace → its last arrival, by the id's hash: the id's own string was made with its
        # spans, and keeping it would keep their memory pages from being reused (two ids of one
        # 64-bit hash would at worst count a split too many).
        self._explained: OrderedDict[int, int] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def pending_spans(self) -> int:
        return self._held

    def add(self, spans: Iterable[Span], now_ns: int) -> None:
        """Spans that arrived at `now_ns`."""
        with self._lock:
            for s in spans:
                if not isinstance(s.attributes, Attributes):
                    s = held(s)
                entry = self._pending.pop(s.trace_id, None)
                if entry is None:
                    entry = _Waiting(s.trace_id, [], now_ns, now_ns, s.start_ns)
                    explained = self._explained.pop(hash(s.trace_id), None)
                    if explained is not None:
                        self.wait.split(now_ns - explained)
                else:
                    self.wait.gap(now_ns - entry.last_ns)
                    s.trace_id = entry.trace_id
                entry.spans.append(s)
                entry.last_ns = now_ns
                entry.start_ns = min(entry.start_ns, s.start_ns)
                self._pending[s.trace_id] = entry
                self._held += 1
                self.spans += 1

    def accepting(self, now_ns: int) -> bool:
        """Whether to take more spans at `now_ns`: not while `max_spans` wait (the exporter is
        asked to send them again later, and the watermark waits for them)."""
        if self._held < self.max_spans:
            return True
        with self._lock:
            self.mark.refused(now_ns)
        return False

    def watermark(self, now_ns: int) -> int:
        """The start time before which every call is in, at `now_ns` (`Watermark.at`)."""
        with self._lock:
            starts = [w.start_ns for w in self._pending.values()]
            starts += [half.start_ns for half in self._halves.values()]
            return self.mark.at(now_ns, min(starts, default=None))

    def ready(self, now_ns: int) -> list[RequestTimeline]:
        """The calls of every trace quiet for the trace wait (and of the oldest beyond the
        memory bound), and the halves that waited long enough for their other half."""
        return list(self.complete(now_ns))

    def finish(self) -> list[RequestTimeline]:
        """Every call still waiting, with the spans it has."""
        return list(self.remaining())

    def complete(self, now_ns: int) -> Iterator[RequestTimeline]:
        """`ready`'s calls a trace at a time: each trace's spans are let go as its calls are
        made, so a backlog (the first traces wait 10 s) is never held twice."""
        while (waiting := self._quiet(now_ns)) is not None:
            yield from self._trace(waiting, now_ns)
        while self._halves:
            key, half = next(iter(self._halves.items()))
            if half.due_ns > now_ns:
                break
            del self._halves[key]
            yield self._record(half.call, half.first_ns)

    def remaining(self) -> Iterator[RequestTimeline]:
        """`finish`'s calls, a trace at a time."""
        yield from self.complete(1 << 62)
        while self._halves:
            _, half = self._halves.popitem(last=False)
            yield self._record(half.call, half.first_ns)

    def _quiet(self, now_ns: int) -> _Waiting | None:
        """The trace quiet the longest, taken out, if it has been quiet for the trace wait
        (or the memory bound is passed)."""
        with self._lock:
            if not self._pending:
                return None
            trace_id, waiting = next(iter(self._pending.items()))
            quiet = waiting.last_ns + self.wait.ns <= now_ns
            if not quiet and self._held <= self.max_spans:
                return None
            del self._pending[trace_id]
            self._held -= len(waiting.spans)
            self.wait.traces += 1
            if not quiet:
                self.forced += 1  # its later spans are the memory bound's, not the wait's
                return waiting
            self._explained[hash(trace_id)] = waiting.last_ns
            if len(self._explained) > EXPLAINED_KEPT:
                self._explained.popitem(last=False)
            return waiting

    def _trace(self, waiting: _Waiting, now_ns: int) -> list[RequestTimeline]:
        self.traces += 1
        calls = calls_of(waiting.spans)
        first = waiting.first_ns
        timed = [c for c in calls if 0 < c.outer.start_ns <= c.outer.end_ns]
        self.malformed += len(calls) - len(timed)
        calls = timed
        if not calls:
            self.traces_without_call += 1
            return []
        if len(calls) == 1 and self._half(calls[0]):
            key = calls[0].id
            other = self._halves.pop(key, None)
            if other is None:
                self._halves[key] = _Half(calls[0], now_ns + self.wait.ns, first,
                                          waiting.start_ns)
                return []
            pair = (calls[0], other.call) if calls[0].client else (other.call, calls[0])
            return [self._record(joined(*pair), min(first, other.first_ns))]
        return [self._record(c, first, step) for c, step in zip(calls, steps_of(calls))]

    @staticmethod
    def _half(call: Call) -> bool:
        """A call seen by one side only that names an id the other side knows."""
        alone = (call.client is None) != (call.server is None)
        return alone and call.id is not None and (call.client is not None or
                                                  call.server.parent_span_id is None)

    def _record(self, call: Call, first_ns: int, step=None) -> RequestTimeline:
        """The call's record; `first_ns`: when its trace's first span arrived."""
        r = record_of(call, self.calls, step)
        self.calls += 1
        self.mark.saw(first_ns - r.origin_ns)
        self.unseen_model += call.server is None
        self.streamed[streamed(call)] += 1
        if r.server is not None and r.server.source:
            self.sources[r.server.source] += 1
        model = next((s.attributes.get(k) for s in (call.server, call.client) if s is not None
                      for k in MODEL
                      if isinstance(s.attributes.get(k), str)), None)
        if model is not None:
            self.models[model] += 1
        return r
