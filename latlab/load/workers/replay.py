"""A replayed trace's requests as what each arrival runs: one request at the trace's time,
except that a session's next turn waits for the answer to the turn before it (a user sends
the next message once they have read the last answer). The wait is the session's, not the
client's: the turn is then scheduled when the answer ended, and its record says so
(`session.after_ns`). A session's turns all go to one worker, chosen by its id.
"""

from __future__ import annotations

import asyncio
import zlib
from time import perf_counter_ns

from latlab.load.workers.loop import SingleRequests
from latlab.load.workload.arrivals import sleep_until
from latlab.load.workload.requests import RequestSpec


class TraceReplay(SingleRequests):
    """The trace's requests, its sessions' turns one after the other."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._last: dict[str, asyncio.Future[int]] = {}  # a session's last turn: its end

    def owner(self, index: int, workers: int) -> int:
        replayed = self.workload.trace.get(index)
        session = replayed.row.session if replayed is not None else None
        if session is None:
            return index % workers
        return zlib.crc32(session.encode()) % workers

    async def run(self, item: RequestSpec, scheduled_ns: int) -> None:
        step = item.session
        if step is None:
            await self.send(item, scheduled_ns)
            return
        before = self._last.get(step.id)
        ended = asyncio.get_running_loop().create_future()
        self._last[step.id] = ended
        end = perf_counter_ns()
        try:
            if before is not None:
                step.after_ns = await before
                if step.after_ns > scheduled_ns:
                    scheduled_ns = step.after_ns
                    await sleep_until(scheduled_ns)
            record, _ = await self.send(item, scheduled_ns)
            end = record.end_ns or perf_counter_ns()
        finally:
            ended.set_result(end)
            if self._last.get(step.id) is ended:
                del self._last[step.id]
