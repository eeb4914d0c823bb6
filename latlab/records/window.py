"""The measurement window: the span of the client's monotonic clock whose requests count,
after warmup and before cooldown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from latlab.records.columns import present
from latlab.records.config import RunConfig
from latlab.records.table import RequestTable, as_table
from latlab.records.timeline import RequestTimeline


@dataclass(frozen=True, slots=True)
class Window:
    """`[start_ns, end_ns)` on the client's monotonic clock."""

    start_ns: int
    end_ns: int

    @property
    def duration_s(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e9

    def __contains__(self, t_ns: int | None) -> bool:
        return t_ns is not None and self.start_ns <= t_ns < self.end_ns

    @classmethod
    def of_run(
        cls,
        records: Sequence[RequestTimeline] | RequestTable,
        start_ns: int | None = None,
        end_ns: int | None = None,
        warmup_s: float = 0.0,
        cooldown_s: float = 0.0,
    ) -> Window | None:
        """The window of a run that started at `start_ns` (default: first scheduled request)
        and ended at `end_ns` (default: last request done), less warmup and cooldown."""
        t = as_table(records)
        if start_ns is None:
            starts = t.origin_ns[present(t.origin_ns)]
            if not len(starts):
                return None
            start_ns = int(starts.min())
        if end_ns is None:
            ends = np.concatenate([c[present(c)] for c in (t.done_ns, t.last_token_ns, t.sent_ns)])
            if not len(ends):
                return None
            end_ns = int(ends.max()) + 1
        window = cls(start_ns + int(warmup_s * 1e9), end_ns - int(cooldown_s * 1e9))
        return window if window.end_ns > window.start_ns else None


def run_window(config: RunConfig, records: Sequence[RequestTimeline] | RequestTable
               ) -> Window | None:
    """The measurement window of a run from its config.json (`clock.t0_ns`, `clock.end_ns`,
    `warmup_s`, `cooldown_s`), also for a partial run whose window was never closed."""
    return Window.of_run(records, start_ns=config.clock.t0_ns, end_ns=config.clock.end_ns,
                         warmup_s=config.warmup_s or 0.0, cooldown_s=config.cooldown_s or 0.0)
