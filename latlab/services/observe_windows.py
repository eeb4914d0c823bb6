"""`latlab observe`'s windows: the calls by the window they started in (windows of `window_s`
aligned to the clock, so a minute's window is that minute, each call in its own start time's
window however late it arrives), each analysed and appended to windows.jsonl once the
watermark (`load.telemetry.watermark`: every call that started before it is in) has passed
its end; until then the live view shows it as provisional. A call that arrives after its
window was written (later than the calls before it had been, or than --max-lateness) is
counted late. A rolling window of the last
`window_s` seconds before the watermark for the live view.

At the end the windows written are checked against every call observed (`check`): a window
whose late calls were left out is analysed again over all of its calls, and keeps only the
findings that analysis also makes; the peak-hours finding is the rule's over the windows so
corrected. So an undercounted window (the slowest calls are the late ones) cannot make a
finding that the calls themselves do not support; live, the peak rule leaves out the windows
that late calls are known to have left short.

An open window's calls wait on disk (their JSON lines, requests.jsonl's, in the run folder's
scratch directory, `observe_scratch`): memory holds each open call's start (8 bytes), the
rolling window's numbers and the kept windows' one-line summaries, whatever the run's length;
a window's calls are read (as columns, a segment at a time, each straight to its rows) only
to analyse it, without what its analysis never reads (the ids), and a column no call has
costs nothing.

    with Windows(run, config, window_ns, bound_ns) as windows:
        windows.add(records, lines)         # the calls complete now
        windows.close(watermark_ns)         # the windows the watermark passed, analysed
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import orjson

from latlab.analysis.findings import Finding
from latlab.analysis.windows import analyze_window, peak_over, quantiles
from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder
from latlab.records.observe import WINDOWS, ObservedWindow, Quantiles
from latlab.records.table import RequestTable
from latlab.records.timeline import RequestTimeline
from latlab.services.observe_memory import release
from latlab.services.observe_scratch import Scratch


@dataclass
class Rolling:
    """The last `seconds` of calls: their rate, TTFT and E2E (ms)."""

    seconds: float
    calls: int
    failed: int
    rate: float
    ttft: Quantiles
    e2e: Quantiles


@dataclass(frozen=True, slots=True)
class Provisional:
    """The latest window the clock has passed but the watermark has not: its calls so far."""

    start_ns: int
    end_ns: int
    calls: int


@dataclass(frozen=True, slots=True)
class _Recent:
    """The numbers of a batch of calls, as they completed, for the rolling window."""

    start: np.ndarray  # ns
    ttft: np.ndarray  # ms, NaN where none (failed calls too)
    e2e: np.ndarray
    ok: np.ndarray

    @classmethod
    def of(cls, records: list[RequestTimeline]) -> _Recent:
        def ms(first: int | None, last: int | None, ok: bool) -> float:
            return (last - first) / 1e6 if ok and first and last else np.nan

        return cls(np.array([r.origin_ns for r in records], dtype=np.int64),
                   np.array([ms(r.sent_ns, r.first_token_ns, r.ok) for r in records]),
                   np.array([ms(r.sent_ns, r.done_ns, r.ok) for r in records]),
                   np.array([r.ok for r in records], dtype=bool))


@dataclass
class Windows:
    run: RunFolder
    config: RunConfig
    window_ns: int
    bound_ns: int  # --max-lateness: no call comes later than this after its window's end
    since_ns: int | None = None  # when observe began listening (None: a file)
    kept: list[ObservedWindow] = field(default_factory=list)
    peak: Finding | None = None
    unsupported_peak: Finding | None = None  # the windows' peak, not held over all calls
    late: int = 0  # calls that came after their window was written
    _open: dict[int, int] = field(default_factory=dict)  # the open windows' calls so far
    _written: dict[int, ObservedWindow] = field(default_factory=dict)  # `kept`, by key
    _closed_before: int | None = None  # every window starting before this is written
    _first: int | None = None  # the window of the first call seen
    _recent: deque[_Recent] = field(default_factory=deque)  # the last calls' numbers
    _newest: int = 0
    _scratch: Scratch = field(init=False)

    def __post_init__(self) -> None:
        self._scratch = Scratch(self.run.path)

    def __enter__(self) -> Windows:
        self._scratch.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._scratch.__exit__(*exc)
        self._recent.clear()  # the rolling window's, shown live only

    def add(self, records: list[RequestTimeline], lines: list[bytes]) -> None:
        """The calls complete now, and each one's JSON line (requests.jsonl's)."""
        by_window: dict[int, tuple[list[bytes], list[int]]] = {}
        undercounted = False
        timed = [r for r in records if r.origin_ns is not None]
        for r, line in zip(records, lines):
            start = r.origin_ns
            if start is None:
                continue
            key = start // self.window_ns
            if self._closed_before is not None and key < self._closed_before:
                self.late += 1
                written = self._written.get(key)
                if written is not None:  # it undercounts: the peak rule leaves it out
                    written.late += 1
                    undercounted = True
            else:
                window_lines, starts = by_window.setdefault(key, ([], []))
                window_lines.append(line)
                starts.append(start)
                self._first = key if self._first is None else min(self._first, key)
        for key, (window_lines, starts) in by_window.items():
            self._scratch.append(key, window_lines, starts)
            self._open[key] = self._open.get(key, 0) + len(window_lines)
        if undercounted:
            self.peak = peak_over(self.kept)
        if timed:
            recent = _Recent.of(timed)
            self._recent.append(recent)
            self._newest = max(self._newest, int(recent.start.max()))
        self._forget(self._newest - self.bound_ns - 2 * self.window_ns)  # what `rolling` shows

    def close(self, watermark_ns: int | None = None) -> list[ObservedWindow]:
        """Analyse and keep every window with calls that ends by `watermark_ns` (all without
        it: the observation's end), in order."""
        if watermark_ns is not None:  # what `rolling` may show from now on
            self._forget(watermark_ns - self.window_ns)
        if not self._open:
            return []
        last = max(self._open) if watermark_ns is None else \
            watermark_ns // self.window_ns - 1
        closed = []
        for key in sorted(k for k in self._open if k <= last):
            start = key * self.window_ns
            partial = (key == self._first or (watermark_ns is None and key == last)
                       or (self.since_ns is not None and start < self.since_ns))
            table = self._table(key)
            release()  # the segments' parsing, handed back before the analysis allocates
            window = analyze_window(self.run, self.config, table, start,
                                    start + self.window_ns)[0]  # its analysis let go
            del table
            window.partial = partial
            closed.append(window)
            self._written[key] = window
            release()
        if closed:
            self._closed_before = max(last + 1, self._closed_before or 0)
            self.kept += closed
            with open(self.run.path / WINDOWS, "ab") as f:
                f.write(_lines(closed))
            self.peak = peak_over(self.kept)
        return closed

    def check(self, table: RequestTable) -> None:
        """Check the windows written against `table`, every call observed (requests.jsonl,
        the late ones included), and rewrite windows.jsonl with what holds."""
        order = np.argsort(table.origin_ns, kind="stable")
        starts = table.origin_ns[order]
        every = []  # each window over all of its calls
        for w in self.kept:
            # The last call's window was cut where the observation ended, though live it
            # may have been written before the end: partial either way, as from the file.
            w.partial = w.partial or (len(starts) > 0
                                      and w.start_ns <= int(starts[-1]) < w.end_ns)
            first, end = np.searchsorted(starts, [w.start_ns, w.end_ns])
            w.late = max(0, int(end - first) - w.calls)
            if not w.late:
                every.append(w)
                continue
            full, _ = analyze_window(self.run, self.config, table.take(order[first:end]),
                                     w.start_ns, w.end_ns)
            full.partial = w.partial
            held = {f.rule for f in full.findings}
            w.unsupported = [f for f in w.findings if f.rule not in held]
            w.findings = [f for f in w.findings if f.rule in held]
            every.append(full)
        found = peak_over(every)
        if self.peak is not None and found is None:
            self.unsupported_peak = self.peak
        self.peak = found
        written = self.run.path / WINDOWS
        if self.kept:
            scratch = written.with_name(WINDOWS + ".checked")
            scratch.write_bytes(_lines(self.kept))
            scratch.replace(written)

    def provisional(self, now_ns: int) -> Provisional | None:
        """The latest window that has ended by `now_ns` and is not written yet."""
        ended = [k for k in self._open if (k + 1) * self.window_ns <= now_ns]
        if not ended:
            return None
        key = max(ended)
        return Provisional(key * self.window_ns, (key + 1) * self.window_ns, self._open[key])

    def _table(self, key: int) -> RequestTable:
        """A window's calls as columns, in start order."""
        del self._open[key]
        return self._scratch.take(key)

    def rolling(self, watermark_ns: int) -> Rolling:
        """The calls that started in the window's length before the watermark."""
        start = watermark_ns - self.window_ns
        self._forget(start - self.window_ns)
        seconds = self.window_ns / 1e9
        if not self._recent:
            return Rolling(seconds, 0, 0, 0.0, Quantiles(), Quantiles())
        batches = list(self._recent)
        starts = np.concatenate([b.start for b in batches])
        chosen = (starts >= start) & (starts < watermark_ns)
        calls, ok = int(chosen.sum()), int((chosen & np.concatenate([b.ok for b in batches])).sum())
        return Rolling(seconds, calls, calls - ok, calls / seconds,
                       quantiles(np.concatenate([b.ttft for b in batches])[chosen]),
                       quantiles(np.concatenate([b.e2e for b in batches])[chosen]))

    def _forget(self, before_ns: int) -> None:
        """Drop the batches of calls that all started before `before_ns`."""
        while self._recent and self._recent[0].start.max() < before_ns:
            self._recent.popleft()


def _lines(windows: list[ObservedWindow]) -> bytes:
    return b"".join(orjson.dumps(w.model_dump(mode="json"), option=orjson.OPT_APPEND_NEWLINE)
                    for w in windows)
