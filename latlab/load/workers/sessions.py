"""When a session's requests go: sessions arrive as single requests would (closed-loop
users run one session after another; open-loop sessions start on the arrival schedule), and
each runs its turns one after the other, every turn through the worker's own request path.

A chat's next turn is scheduled a think time after the last answer ended; an agent's next
call when its tool step has ended (a sleep drawn from the tool-latency distribution, or a
POST to a real tool). `--requests N` bounds the requests of the sessions a worker starts:
a session starts only if all its turns fit in what is left. A session ends early when a
request fails, its history no longer fits the server's context, or the run's time is up.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns
from typing import TYPE_CHECKING

import aiohttp
import numpy as np

from latlab.load.workload.arrivals import arrival_times, sleep_until, user_start_times
from latlab.load.request.client import describe, error_message
from latlab.load.workload.conversation import Conversation

if TYPE_CHECKING:
    from latlab.load.workers.worker import Worker

TOOL_TIMEOUT_S = 60.0
# Why a worker stopped that ends the sessions under way; others (the request budget or the
# arrivals ran out) only stop new sessions from starting, and the run's end is the schedule's.
CUT = ("interrupted", "aborted")
TOOL_OUTPUT_BYTES = 64 << 10


class SessionDriver:
    """Runs a worker's share of the sessions on the worker's event loop and client."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.config = worker.config.workload.sessions
        requests = worker.config.requests
        self.budget = worker.config.share(requests, worker.w) if requests else None
        self.reserved = 0
        self._next = 0  # this worker's sessions and requests so far
        self._requests = 0
        self._tools: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._tools is not None:
            await self._tools.close()

    def _open(self, index: int) -> Conversation | None:
        """Session `index`, or None when its turns do not fit the requests left."""
        conv = Conversation(self.worker.workload, index, f"{self.worker.plan.run_id}-s{index}")
        if self.budget is not None:
            if self.reserved + conv.turns > self.budget:
                return None
            self.reserved += conv.turns
        return conv

    async def open_loop(self) -> None:
        w = self.worker
        for index, offset in enumerate(arrival_times(w.config.arrivals)):
            scheduled = w.t0 + int(offset * 1e9)
            if w.end_ns is not None and scheduled >= w.end_ns:
                return w._stop("duration")
            if index % w.n != w.w:
                continue
            conv = self._open(index)
            if conv is None:
                return w._stop("requests")
            await sleep_until(scheduled)
            if w.stop_reason is not None:
                return
            w.health.note_dispatch(perf_counter_ns() - scheduled)
            if w._cap is not None:
                await w._cap.acquire()  # --max-concurrency caps sessions in flight
            task = asyncio.get_running_loop().create_task(self.run(conv, scheduled))
            w.tasks.add(task)
            task.add_done_callback(w.tasks.discard)
        w._stop("trace")

    async def closed_loop(self) -> None:
        w = self.worker
        starts = user_start_times(w.config.arrivals.users, w.config.arrivals.ramp_s)
        await asyncio.gather(*[self._user(start) for start in starts[w.w::w.n]])

    async def _user(self, start_s: float) -> None:
        w = self.worker
        scheduled = w.t0 + int(start_s * 1e9)
        while w.stop_reason is None:
            if w.end_ns is not None and scheduled >= w.end_ns:
                return w._stop("duration")
            conv = self._open(self._next * w.n + w.w)
            self._next += 1
            if conv is None:
                return w._stop("requests")
            await sleep_until(scheduled)
            w.health.note_dispatch(perf_counter_ns() - scheduled)
            await self.run(conv, scheduled)
            scheduled = perf_counter_ns()

    async def run(self, conv: Conversation, scheduled: int) -> None:
        """Every turn of `conv`, the first at `scheduled`."""
        w = self.worker
        try:
            after = tool = None
            for turn in range(1, conv.turns + 1):
                spec = conv.request(turn, self._requests * w.n + w.w,
                                    tool[3] if tool is not None else None)
                self._requests += 1
                if not w.workload.fit(spec):
                    return  # the history outgrew the server's context
                spec.session.after_ns = after
                if tool is not None:
                    (spec.session.tool_start_ns, spec.session.tool_end_ns,
                     spec.session.tool_error) = tool[:3]
                r, answer = await w._request(spec, scheduled)
                if not r.ok or turn == conv.turns:
                    return
                conv.answered(answer or "", r.completion_tokens)
                after = r.done_ns
                if conv.kind == "agent":
                    tool = await self._tool(conv, turn, answer or "")
                    scheduled = perf_counter_ns()
                else:
                    scheduled = after + int(self._think_s(conv, turn) * 1e9)
                if w.end_ns is not None and scheduled >= w.end_ns:
                    return
                await sleep_until(scheduled)
                if w.stop_reason in CUT:
                    return
        finally:
            if w._cap is not None:
                w._cap.release()

    def _think_s(self, conv: Conversation, turn: int) -> float:
        think = self.config.think_s
        if think is None:
            return 0.0
        return think.draw(np.random.default_rng([self.worker.config.workload.seed, 7,
                                                 conv.index, turn]))

    async def _tool(self, conv: Conversation, turn: int, answer: str
                    ) -> tuple[int, int, str | None, str | None]:
        """The tool step after call `turn`: (start, end, error, output; None: synthetic)."""
        start = perf_counter_ns()
        error = output = None
        if self.config.tool_url is None:
            delay = self.config.tool_ms.draw(np.random.default_rng(
                [self.worker.config.workload.seed, 8, conv.index, turn])) if self.config.tool_ms else 0.0
            await asyncio.sleep(delay / 1e3)
        else:
            try:
                output, error = await self._call_tool(conv, turn, answer)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                error = describe(e)
        return start, perf_counter_ns(), error, output

    async def _call_tool(self, conv: Conversation, turn: int, answer: str
                         ) -> tuple[str | None, str | None]:
        if self._tools is None:
            self._tools = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TOOL_TIMEOUT_S))
        body = {"session": conv.id, "step": turn, "input": answer}
        async with self._tools.post(self.config.tool_url, json=body) as resp:
            raw = await resp.content.read(TOOL_OUTPUT_BYTES)
            if resp.status != 200:
                return None, f"HTTP {resp.status}: {error_message(raw)}"
            return raw.decode("utf-8", "replace"), None
