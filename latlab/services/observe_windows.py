"""`latlab observe`'s windows: the calls by the window they started in (windows of `window_s`
aligned to the clock, so a minute's window is that minute), each analysed and appended to
windows.jsonl once the clock is `close_after` past its end (its last calls complete); a
rolling window of the last `window_s` seconds for the live view. Memory holds the open
windows' calls (as their JSON lines, half the size of the records) and the kept windows'
one-line summaries, whatever the run's length.
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
from latlab.records.reader import read_requests
from latlab.records.table import RequestTable
from latlab.records.timeline import RequestTimeline

SCRATCH = ".window.jsonl"


@dataclass
class Rolling:
    """The last `seconds` of calls: their rate, TTFT and E2E (ms)."""

    seconds: float
    calls: int
    failed: int
    rate: float
    ttft: Quantiles
    e2e: Quantiles


@dataclass
class Windows:
    run: RunFolder
    config: RunConfig
    window_ns: int
    close_after_ns: int
    kept: list[ObservedWindow] = field(default_factory=list)
    peak: Finding | None = None
    _open: dict[int, list[bytes]] = field(default_factory=dict)  # a window's calls, as JSON
    _closed_before: int | None = None  # every window starting before this is closed
    _late: int = 0
    _recent: deque = field(default_factory=deque)  # (start, ttft, e2e, ok) of the last calls
    _newest: int = 0

    def add(self, records: list[RequestTimeline], lines: list[bytes]) -> None:
        """The calls complete now, and each one's JSON line (requests.jsonl's)."""
        for r, line in zip(records, lines):
            start = r.origin_ns
            if start is None:
                continue
            key = start // self.window_ns
            if self._closed_before is not None and key < self._closed_before:
                self._late += 1
            else:
                self._open.setdefault(key, []).append(line)
            ttft = r.first_token_ns - r.sent_ns if r.first_token_ns and r.sent_ns else None
            e2e = r.done_ns - r.sent_ns if r.done_ns and r.sent_ns else None
            self._recent.append((start, ttft, e2e, r.ok))
            self._newest = max(self._newest, start)
        horizon = self._newest - self.close_after_ns - self.window_ns
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()

    def close(self, now_ns: int | None = None) -> list[ObservedWindow]:
        """Analyse and keep every window with calls the clock is `close_after` past (all
        without `now_ns`), in order."""
        if not self._open:
            return []
        last = max(self._open) if now_ns is None else \
            (now_ns - self.close_after_ns) // self.window_ns - 1
        closed = []
        for key in sorted(k for k in self._open if k <= last):
            window, _ = analyze_window(self.run, self.config, self._table(key),
                                       key * self.window_ns, (key + 1) * self.window_ns)
            window.late, self._late = self._late, 0
            closed.append(window)
        if closed:
            self._closed_before = max(last + 1, self._closed_before or 0)
            self.kept += closed
            with open(self.run.path / WINDOWS, "ab") as f:
                f.write(b"".join(orjson.dumps(w.model_dump(mode="json"),
                                              option=orjson.OPT_APPEND_NEWLINE) for w in closed))
            self.peak = peak_over(self.kept)
        return closed

    def _table(self, key: int) -> RequestTable:
        """A window's calls as columns, parsed by the run's own reader (DuckDB) from a
        scratch file: a dict per call would take a few times their lines' memory."""
        scratch = self.run.path / SCRATCH
        scratch.write_bytes(b"".join(self._open.pop(key, [])))
        try:
            return read_requests(scratch)
        finally:
            scratch.unlink()

    def rolling(self, now_ns: int) -> Rolling:
        """The calls that started in the last window's length before the clock's complete
        part (`now_ns` less `close_after`)."""
        start = now_ns - self.close_after_ns - self.window_ns
        while self._recent and self._recent[0][0] < start:
            self._recent.popleft()
        rows = [row for row in self._recent if row[0] < start + self.window_ns]
        ok = [row for row in rows if row[3]]
        seconds = self.window_ns / 1e9

        def ms(i: int) -> np.ndarray:
            return np.asarray([row[i] / 1e6 for row in ok if row[i] is not None], dtype=float)

        return Rolling(seconds, len(rows), len(rows) - len(ok), len(rows) / seconds,
                       quantiles(ms(1)), quantiles(ms(2)))
