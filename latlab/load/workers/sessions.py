"""Sessions as what one arrival runs: a closed-loop user runs one session after another, an
open-loop session starts on the arrival schedule (`loop.ScheduleLoop`), and each runs its
turns one after the other, every turn through the worker's request path.

A chat's next turn is scheduled a think time after the last answer ended; an agent's next
call when its tool step has ended (a sleep drawn from the tool-latency distribution, or a
POST to a real tool). `--requests N` bounds the requests of the sessions a worker starts:
a session starts only if all its turns fit in what is left. A session ends early when a
request fails, its history no longer fits the server's context, or the run's time is up.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns

import aiohttp
import numpy as np

from latlab.load.request.errors import describe, error_message
from latlab.load.workers.loop import ScheduleLoop, Send
from latlab.load.workload.arrivals import sleep_until
from latlab.load.workload.conversation import Conversation
from latlab.load.workload.requests import Workload
from latlab.records.bench import BenchConfig

TOOL_TIMEOUT_S = 60.0
# Why a worker stopped that ends the sessions under way; others (the request budget or the
# arrivals ran out) only stop new sessions from starting, and the run's end is the schedule's.
CUT = ("interrupted", "aborted")
TOOL_OUTPUT_BYTES = 64 << 10


class Sessions:
    """A worker's sessions, on the worker's event loop and client."""

    limit = None  # --requests bounds whole sessions: `open` reserves their turns

    def __init__(self, config: BenchConfig, workload: Workload, schedule: ScheduleLoop,
                 send: Send, run_id: str) -> None:
        self.config = config.workload.sessions
        self.seed = config.workload.seed
        self.workload, self.schedule, self.send, self.run_id = workload, schedule, send, run_id
        requests = config.requests
        self.budget = config.share(requests, schedule.worker) if requests else None
        self.reserved = 0
        self._requests = 0  # this worker's session requests so far
        self._tools: aiohttp.ClientSession | None = None

    def arrival_offsets(self):
        return self.workload.arrival_times()

    def owner(self, index: int, workers: int) -> int:
        return index % workers

    async def close(self) -> None:
        if self._tools is not None:
            await self._tools.close()

    def open(self, index: int) -> Conversation | None:
        """Session `index`, or None when its turns do not fit the requests left."""
        conv = Conversation(self.workload, index, f"{self.run_id}-s{index}")
        if self.budget is not None:
            if self.reserved + conv.turns > self.budget:
                return None
            self.reserved += conv.turns
        return conv

    async def run(self, conv: Conversation, scheduled: int) -> None:
        """Every turn of `conv`, the first at `scheduled`."""
        s = self.schedule
        after = tool = None
        for turn in range(1, conv.turns + 1):
            spec = conv.request(turn, s.index(self._requests),
                                tool[3] if tool is not None else None)
            self._requests += 1
            if not self.workload.fit(spec):
                return  # the history outgrew the server's context
            spec.session.after_ns = after
            if tool is not None:
                (spec.session.tool_start_ns, spec.session.tool_end_ns,
                 spec.session.tool_error) = tool[:3]
            r, answer = await self.send(spec, scheduled)
            if not r.ok or turn == conv.turns:
                return
            conv.answered(answer or "", r.completion_tokens)
            after = r.done_ns
            if conv.kind == "agent":
                tool = await self._tool(conv, turn, answer or "")
                scheduled = perf_counter_ns()
            else:
                scheduled = after + int(self._think_s(conv, turn) * 1e9)
            if s.end_ns is not None and scheduled >= s.end_ns:
                return
            await sleep_until(scheduled)
            if s.stop_reason in CUT:
                return

    def _think_s(self, conv: Conversation, turn: int) -> float:
        think = self.config.think_s
        if think is None:
            return 0.0
        return think.draw(np.random.default_rng([self.seed, 7, conv.index, turn]))

    async def _tool(self, conv: Conversation, turn: int, answer: str
                    ) -> tuple[int, int, str | None, str | None]:
        """The tool step after call `turn`: (start, end, error, output; None: synthetic)."""
        start = perf_counter_ns()
        error = output = None
        if self.config.tool_url is None:
            delay = self.config.tool_ms.draw(np.random.default_rng(
                [self.seed, 8, conv.index, turn])) if self.config.tool_ms else 0.0
            await asyncio.sleep(delay / 1e3)
        else:
            try:
                output, error = await self._call_tool(conv, turn, answer)
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
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
