"""The engine's step loop in its own thread, so it never blocks the HTTP event loop.

Requests and aborts reach the engine thread through a queue it drains before every step; each
step's outputs come back to the event loop in one `call_soon_threadsafe` call and are fanned
out to per-request asyncio queues.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson

from latlab.engine.engine import LLMEngine
from latlab.engine.outputs import EngineStats, RequestOutput
from latlab.engine.sampling_params import SamplingParams
from latlab.engine.sequence import FinishReason
from latlab.records.steps import FEATURE_FIELDS

log = logging.getLogger("latlab.serve")


class QueueFull(Exception):
    """The waiting queue is at its limit: the request is turned away (HTTP 429)."""


class EngineNotReady(Exception):
    """The engine is still warming up, or shutting down (HTTP 503)."""


class EngineRequestError(Exception):
    """The engine refused the request (e.g. a token id outside the vocabulary)."""


class RequestFailed(Exception):
    """The engine failed this one request (HTTP 500); it serves the others as before."""


class QueueTimeout(EngineNotReady):
    """The request waited longer than --max-queue-delay without being scheduled (HTTP 503)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    received_ns: int
    enqueued_ns: int
    priority: int
    tenant: str | None


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


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
        item, self._first = self._first or await self._queue.get(), None
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
    """Runs an `LLMEngine` in a thread; `submit` from the event loop, iterate the stream."""

    def __init__(self, engine: LLMEngine, max_waiting: int, step_log: Path | None = None
                 ) -> None:
        self.engine = engine
        # unbuffered: each step's line is written as it ends (a killed server loses none)
        self._step_log = open(step_log, "ab", buffering=0) if step_log else None
        self.max_waiting = max_waiting
        self.stats: EngineStats = engine.stats()
        self.ready = asyncio.Event()
        self.startup_s: float | None = None
        self.failed: str | None = None
        self._streams: dict[str, RequestStream] = {}
        self._commands: queue.SimpleQueue[_Add | _Abort] = queue.SimpleQueue()
        # Requests handed over and taken in: each counter is written by one thread only.
        self._submitted = 0
        self._taken_in = 0
        self.num_preprocessing = 0  # read and being tokenized: they count as waiting
        self._wakeup = threading.Event()
        self._stopping = False
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, warmup: bool = True) -> None:
        """Start the engine thread (call from the event loop); `ready` is set after warm-up."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, args=(warmup,),
                                        name="latlab-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the engine thread; requests still in flight end with EngineNotReady."""
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._fail_all(EngineNotReady("the server is shutting down"))
        if self._step_log is not None:
            self._step_log.close()

    def _log_step(self, start_ns: int, end_ns: int, features: list[int]) -> None:
        self._step_log.write(orjson.dumps(dict(zip(("start_ns", "end_ns", *FEATURE_FIELDS),
                                                   (start_ns, end_ns, *features)))) + b"\n")

    def _fail_all(self, error: Exception) -> None:
        for stream in self._streams.values():
            stream._put(error)
        self._streams.clear()

    @property
    def num_waiting(self) -> int:
        return (len(self.engine.scheduler.waiting) + self._submitted - self._taken_in
                + self.num_preprocessing)

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
        self._commands.put(_Add(stream.request_id, prompt_token_ids, params, received_ns,
                                time.perf_counter_ns(), priority, tenant))
        self._wakeup.set()
        return stream

    def _abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._commands.put(_Abort(request_id))
        self._wakeup.set()

    def _run(self, warmup: bool) -> None:
        try:
            self._serve(warmup)
        except Exception as e:  # a bug in the engine: fail loudly, never hang the clients
            log.exception("the engine thread failed")
            self.failed = f"{type(e).__name__}: {e}"
            self._loop.call_soon_threadsafe(self._fail_all, EngineNotReady(self.failed))

    def _serve(self, warmup: bool) -> None:
        started = time.perf_counter()
        if warmup:
            self.engine.warmup()
        if self._stopping:
            return
        freeze_heap()
        if self._step_log is not None:  # after the warm-up: only the steps that serve
            self.engine.on_step = self._log_step
        self.startup_s = time.perf_counter() - started
        self.stats = self.engine.stats()
        self._loop.call_soon_threadsafe(self.ready.set)
        idle_unload = self.engine.config.idle_unload
        while not self._stopping:
            errors = self._drain_commands()
            if errors:
                self._loop.call_soon_threadsafe(self._dispatch, errors)
            if not self.engine.has_unfinished():
                self.stats = self.engine.stats()
                woken = self._wakeup.wait(None if self.engine.is_sleeping else idle_unload)
                if not (woken or self._stopping or self.engine.has_unfinished()):
                    gc.unfreeze()  # so that unloading collects the model's cycles too
                    self.engine.sleep()  # idle for --idle-unload seconds: scale to zero
                    log.info("idle for %s s: the model is unloaded", idle_unload)
                    self.stats = self.engine.stats()
                self._wakeup.clear()
                continue
            was_sleeping = self.engine.is_sleeping
            outputs = self.engine.step()
            if was_sleeping:
                freeze_heap()  # the model just loaded again
            self.stats = self.engine.stats()
            if outputs:
                self._loop.call_soon_threadsafe(self._dispatch, outputs)

    def _drain_commands(self) -> list[tuple[str, Exception]]:
        errors = []
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return errors
            if isinstance(command, _Abort):
                self.engine.abort(command.request_id)
                continue
            try:
                self.engine.add_request(command.request_id, command.prompt_token_ids,
                                        command.params, received_ns=command.received_ns,
                                        enqueued_ns=command.enqueued_ns,
                                        priority=command.priority, tenant=command.tenant)
            except ValueError as e:
                errors.append((command.request_id, EngineRequestError(str(e))))
            except Exception as e:
                log.error("request %s failed in the engine", command.request_id, exc_info=e)
                errors.append((command.request_id, RequestFailed(f"{type(e).__name__}: {e}")))
            self._taken_in += 1

    def _dispatch(self, items: list[RequestOutput] | list[tuple[str, Exception]]) -> None:
        for item in items:
            request_id, payload = ((item.request_id, item) if isinstance(item, RequestOutput)
                                   else item)
            if getattr(payload, "finish_reason", None) is FinishReason.QUEUE_TIMEOUT:
                delay = self.engine.config.max_queue_delay
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


def freeze_heap() -> None:
    """Move every object alive now (the model, tokenizer, app: about 200,000 of them) out of
    the cyclic collector's reach, as vLLM does after start-up: a full collection over them
    takes about 100 ms on a CPU core, a stop of every stream; what requests allocate later
    is still collected."""
    gc.collect()
    gc.freeze()
