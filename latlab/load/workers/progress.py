"""The live line during a run: elapsed/remaining, done and in flight, errors, rolling TTFT
p50/p99 and tokens/s, merged from every worker's periodic `WorkerSnapshot`."""

from __future__ import annotations

import time
from collections import deque

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.text import Text

from latlab.load.workers.snapshot import WorkerSnapshot

ROLLING_TTFT = 500
RATE_WINDOW_S = 2.0


class ProgressDisplay:
    def __init__(self, console: Console, duration_s: float | None, requests: int | None) -> None:
        self.console = console
        self.duration_s = duration_s
        self.requests = requests
        self._workers: dict[int, WorkerSnapshot] = {}
        self._ttft: deque[float] = deque(maxlen=ROLLING_TTFT)
        self._tokens: deque[tuple[float, int]] = deque()
        self._start = time.monotonic()
        self._live = Live(Text("starting…"), console=console, auto_refresh=False, transient=True)

    def __enter__(self) -> ProgressDisplay:
        self._start = time.monotonic()
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()

    def update(self, snapshot: WorkerSnapshot) -> None:
        self._ttft.extend(snapshot.ttft_ms)
        self._workers[snapshot.worker] = snapshot
        now = time.monotonic()
        self._tokens.append((now, sum(w.tokens for w in self._workers.values())))
        while len(self._tokens) > 2 and now - self._tokens[1][0] >= RATE_WINDOW_S:
            self._tokens.popleft()
        self._live.update(self.render(now), refresh=True)

    def render(self, now: float) -> Text:
        workers = self._workers.values()
        done, failed = sum(w.done for w in workers), sum(w.failed for w in workers)
        elapsed = now - self._start
        line = Text()
        line.append(f"{elapsed:5.1f} s", style="bold")
        if self.duration_s:
            line.append(f" / {self.duration_s:g} s")
        line.append(f"  done {done}" + (f"/{self.requests}" if self.requests else ""))
        line.append(f"  in flight {sum(w.in_flight for w in workers)}")
        line.append(f"  errors {failed}", style="red" if failed else "")
        if self._ttft:
            p50, p99 = np.percentile(np.asarray(self._ttft), [50, 99])
            line.append(f"  TTFT p50 {p50:.0f} p99 {p99:.0f} ms")
        (t_a, n_a), (t_b, n_b) = self._tokens[0], self._tokens[-1]
        if t_b > t_a:
            line.append(f"  {(n_b - n_a) / (t_b - t_a):,.0f} tok/s")
        return line
