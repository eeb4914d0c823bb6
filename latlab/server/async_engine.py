"""The HTTP side's handle on the engine: requests submitted, each one's outputs as a stream.

The engine's step loop runs in a thread or a process of its own (`engine_core`); commands
(new requests, aborts) go to it, and each step's outputs come back in one event, on the event
loop, where they are fanned out to per-request asyncio queues.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager

from latlab.engine.outputs import EngineStats, RequestOutput
from latlab.engine.sampling_params import SamplingParams
from latlab.engine.sequence import FinishReason
from latlab.server.engine_loop import EngineThread
from latlab.server.engine_messages import (
    Abort,
    Add,
    EngineInfo,
    EngineRequestError,
    Event,
    Failed,
    Ready,
    RequestFailed,
    Stepped,
)
from latlab.server.engine_process import EngineProcess

__all__ = ["AsyncEngine", "EngineNotReady", "EngineRequestError", "QueueFull", "QueueTimeout",
           "RequestFailed", "RequestStream"]


class QueueFull(Exception):
    """The waiting queue is at its limit: the request is turned away (HTTP 429)."""


class EngineNotReady(Exception):
    """The engine is still warming up, or shutting down (HTTP 503)."""


class QueueTimeout(EngineNotReady):
    """The request waited longer than --max-queue-delay without being scheduled (HTTP 503)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestStream:
    """The outputs of one request, as an async iterator that ends after the finished one."""

    def __init__(self, engine: AsyncEngine, request_id: str) -> None:
        self._engine = engine
        self.request_id = request_id
        self._queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self._first: RequestOutput | Exception | None = None
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def started(self) -> None:
        """Wait for the first output, so that a refusal (QueueTimeout) raises here, before a
        response has begun; the output is still the first one iterated."""
        if self._first is None and not self.finished:
            self._first = await self._queue.get()
            if isinstance(self._first, Exception):
                self.finished = True
                raise self._first

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        return self._take(self._first or await self._queue.get())

    def next_ready(self) -> RequestOutput | None:
        """The next output if it is queued already, else None (no wait); raises as
        `__anext__` does. A streaming response sends what a step's wakeup finds queued in
        one write, so that a server behind the engine catches up with fewer writes."""
        if self.finished or (self._first is None and self._queue.empty()):
            return None
        return self._take(self._first or self._queue.get_nowait())

    def _take(self, item: RequestOutput | Exception) -> RequestOutput:
        """`item`, the next output (the first one consumed); an error ends the stream."""
        self._first = None
        if isinstance(item, Exception):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def abort(self) -> None:
        """Stop generating and free the request's KV blocks (a no-op once it has finished)."""
        if not self.finished:
            self.finished = True
            self._engine._abort(self.request_id)

    def _put(self, item: RequestOutput | Exception) -> None:
        self._queue.put_nowait(item)


class AsyncEngine:
    """The engine behind the event loop: `submit` from the event loop, iterate the stream.
    `core` runs the step loop (`engine_core`: a thread or a process)."""

    def __init__(self, core: EngineThread | EngineProcess, max_waiting: int) -> None:
        self.core = core
        self.info: EngineInfo = core.info
        self.max_waiting = max_waiting
        self.stats: EngineStats = core.info.stats
        self.ready = asyncio.Event()
        self.startup_s: float | None = None
        self.failed: str | None = None
        self._streams: dict[str, RequestStream] = {}
        # Requests handed over, and taken in by the engine as of its latest event.
        self._submitted = 0
        self._taken_in = 0
        self.num_preprocessing = 0  # read and being tokenized: they count as waiting
        self._stopping = False
        self._ids = itertools.count()

    def start(self, warmup: bool = True) -> None:
        """Start the engine's loop (call from the event loop); `ready` is set after warm-up."""
        self.core.start(warmup, self._receive)

    def stop(self) -> None:
        """Stop the engine's loop; requests still in flight end with EngineNotReady."""
        self._stopping = True
        self.core.stop()
        self._fail_all(EngineNotReady("the server is shutting down"))

    def _fail_all(self, error: Exception) -> None:
        for stream in self._streams.values():
            stream._put(error)
        self._streams.clear()

    @property
    def num_waiting(self) -> int:
        return self.stats.num_waiting + self._submitted - self._taken_in + self.num_preprocessing

    def _check_capacity(self) -> None:
        if self.num_waiting >= self.max_waiting:
            raise QueueFull(f"{self.num_waiting} requests are already waiting "
                            f"(--max-waiting {self.max_waiting})")

    @contextmanager
    def admitting(self) -> Iterator[None]:
        """Hold a waiting slot while a request is tokenized (raises QueueFull);
        `submit(..., admitted=True)` inside the block hands the slot to the request."""
        self._check_capacity()
        self.num_preprocessing += 1
        try:
            yield
        finally:
            self.num_preprocessing -= 1

    def submit(self, prompt_token_ids: list[int], params: SamplingParams, *, received_ns: int,
               priority: int = 0, tenant: str | None = None,
               admitted: bool = False) -> RequestStream:
        """Queue a request; raises QueueFull or EngineNotReady instead of queueing it."""
        if self.failed:
            raise EngineNotReady(f"the engine failed: {self.failed}")
        if not self.ready.is_set() or self._stopping:
            raise EngineNotReady("the engine is warming up" if not self._stopping
                                 else "the server is shutting down")
        if not admitted:
            self._check_capacity()
        stream = RequestStream(self, str(next(self._ids)))
        self._streams[stream.request_id] = stream
        self._submitted += 1
        self.core.send(Add(stream.request_id, prompt_token_ids, params, received_ns,
                           time.perf_counter_ns(), priority, tenant))
        return stream

    def _abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self.core.send(Abort(request_id))

    def _receive(self, event: Event) -> None:
        """An event of the engine's loop, on the event loop."""
        if isinstance(event, Stepped):
            self.stats, self._taken_in = event.stats, event.taken_in
            self._dispatch(event.errors)
            self._dispatch(event.outputs)
        elif isinstance(event, Ready):
            self.stats, self.startup_s = event.stats, event.startup_s
            self.ready.set()
        elif isinstance(event, Failed):
            self.failed = event.error
            self._fail_all(EngineNotReady(f"the engine failed: {event.error}"))

    def _dispatch(self, items: list[RequestOutput] | list[tuple[str, Exception]]) -> None:
        for item in items:
            request_id, payload = ((item.request_id, item) if isinstance(item, RequestOutput)
                                   else item)
            if getattr(payload, "finish_reason", None) is FinishReason.QUEUE_TIMEOUT:
                delay = self.info.config.max_queue_delay
                payload = QueueTimeout(f"the request waited more than --max-queue-delay {delay:g} "
                                       "s without being scheduled", max(1, round(delay)))
            stream = self._streams.get(request_id)
            if stream is None:
                continue
            if isinstance(payload, RequestOutput) and payload.error is not None:
                payload = RequestFailed(payload.error)
            stream._put(payload)
            if isinstance(payload, Exception) or payload.finished:
                del self._streams[request_id]
