"""When a window of observed calls is complete (`latlab observe`): the watermark, the start
time before which every call is believed to be in.

A call's spans reach latlab well after it started: the call runs, the exporters batch its
spans (the OpenTelemetry SDK's BatchSpanProcessor sends them up to 5 s after they end), and a
trace is complete only once quiet (`--trace-wait`). The watermark is the earliest of

* the clock less the lag: how late a call's first span has been seen to arrive after the
  call's start (the largest lateness so far, with a margin), at least an exporter's batch
  delay;
* the earliest start of what is still waiting (a trace not yet quiet, a call waiting for its
  other half), whose calls are known to be coming; and
* while observe refuses exports (503: too many spans waiting) and for `RETRY_GAP_NS` after the
  last refusal, where it was when the refusals began: a refused export's calls are sent again
  (OTLP exporters retry, backing off up to about 30 s), and started at most the lag before
  their refusal;

and never more than `bound` behind the clock: a call later than that is counted late, so that
a stalled exporter cannot hold every window open (and their calls in memory) for ever.

    mark = Watermark(floor_ns=EXPORT_DELAY_NS, bound_ns=120 * 10**9)
    mark.saw(first_arrival_ns - call_start_ns)     # each call as it becomes a record
    mark.refused(now_ns)                           # an export refused (503) at now_ns
    mark.at(now_ns, earliest_waiting_ns)           # windows ending before it are final

Live, the clock is the receiver's (arrival times); from a file, the latest span end read so
far (the file is in export order), so both close the same windows on the same spans.
"""

from __future__ import annotations

from dataclasses import dataclass

# A margin over the largest lateness seen: the next call may be a little later still.
MARGIN = 1.25
EXPORT_DELAY_NS = 5 * 10**9  # the OpenTelemetry SDK's batch delay: the least lag
# The longest an exporter waits between two tries of a refused export (the OpenTelemetry SDK's
# last backoff is 32 s, a Collector's max_interval 30 s), with the margin.
RETRY_GAP_NS = int(32 * 10**9 * MARGIN)


@dataclass(slots=True)
class Watermark:
    floor_ns: int  # the least lag: an exporter's batch delay
    bound_ns: int  # the most: later calls are counted late
    latest_ns: int = 0  # the largest lateness seen
    held_ns: int | None = None  # while exports are refused: the earliest their calls started
    refused_ns: int = 0  # the last refusal

    def saw(self, lateness_ns: int) -> None:
        """A call whose first span arrived `lateness_ns` after it started."""
        self.latest_ns = max(self.latest_ns, lateness_ns)

    def refused(self, now_ns: int) -> None:
        """An export refused at `now_ns`: its calls will come again."""
        if not self._holding(now_ns):
            self.held_ns = now_ns - self.lag_ns
        self.refused_ns = now_ns

    @property
    def lag_ns(self) -> int:
        """How far behind the clock windows close."""
        return min(self.bound_ns, max(self.floor_ns, int(self.latest_ns * MARGIN)))

    def at(self, now_ns: int, earliest_waiting_ns: int | None) -> int:
        """The watermark at `now_ns`, with the earliest start still waiting (None: none)."""
        mark = now_ns - self.lag_ns
        if earliest_waiting_ns is not None:
            mark = min(mark, earliest_waiting_ns)
        if self._holding(now_ns):
            mark = min(mark, self.held_ns)
        return max(mark, now_ns - self.bound_ns)

    def _holding(self, now_ns: int) -> bool:
        """Whether refused exports may still come again."""
        return self.held_ns is not None and now_ns - self.refused_ns <= RETRY_GAP_NS
