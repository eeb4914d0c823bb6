"""The engine's step loop, and the loop in a thread of the server's process (`engine_core`)."""

from __future__ import annotations

import asyncio
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import orjson

from latlab.engine.engine import LLMEngine
from latlab.records.steps import FEATURE_FIELDS
from latlab.server.engine_messages import (
    Abort,
    Add,
    Command,
    CoreKind,
    EngineInfo,
    EngineRequestError,
    Event,
    Failed,
    Ready,
    RequestFailed,
    Stepped,
    Stop,
)

log = logging.getLogger("latlab.serve")
STOP_TIMEOUT_S = 30  # for the step in flight (or a warm-up) to end


class Inbox(Protocol):
    def take(self) -> list[Command]:
        """The commands queued now, without waiting."""

    def wait(self, timeout: float | None) -> bool:
        """Wait for a command (at most `timeout` s); False if none came."""


class EngineLoop:
    """The step loop: commands in, one event per step out (`publish`)."""

    def __init__(self, engine: LLMEngine, inbox: Inbox, publish: Callable[[Event], None],
                 step_log: Path | None) -> None:
        self.engine, self.inbox, self.publish = engine, inbox, publish
        self.step_log = step_log
        self.taken_in = 0
        self._stop = False

    def run(self, warmup: bool) -> None:
        try:
            # unbuffered: each step's line is written as it ends (a killed server loses none)
            with open(self.step_log, "ab", buffering=0) if self.step_log else _Nothing() as f:
                self._serve(warmup, f)
        except Exception as e:  # a bug in the engine: fail loudly, never hang the clients
            log.exception("the engine loop failed")
            self.publish(Failed(f"{type(e).__name__}: {e}"))

    def _serve(self, warmup: bool, step_log) -> None:
        engine = self.engine
        started = time.perf_counter()
        if warmup:
            engine.warmup()
        freeze_heap()
        if step_log is not None:  # after the warm-up: only the steps that serve
            engine.on_step = lambda start, end, features: step_log.write(orjson.dumps(
                dict(zip(("start_ns", "end_ns", *FEATURE_FIELDS), (start, end, *features))))
                + b"\n")
        self.publish(Ready(time.perf_counter() - started, engine.stats()))
        idle_unload = engine.config.idle_unload
        while True:
            errors = self._apply(self.inbox.take())
            if self._stop:
                return
            if not engine.has_unfinished():
                self.publish(Stepped([], errors, engine.stats(), self.taken_in))
                woken = self.inbox.wait(None if engine.is_sleeping else idle_unload)
                if not (woken or engine.is_sleeping):
                    gc.unfreeze()  # so that unloading collects the model's cycles too
                    engine.sleep()  # idle for --idle-unload seconds: scale to zero
                    log.info("idle for %s s: the model is unloaded", idle_unload)
                continue
            was_sleeping = engine.is_sleeping
            outputs = engine.step()
            if was_sleeping:
                freeze_heap()  # the model just loaded again
            self.publish(Stepped(outputs, errors, engine.stats(), self.taken_in))

    def _apply(self, commands: list[Command]) -> list[tuple[str, Exception]]:
        errors = []
        for command in commands:
            if isinstance(command, Stop):
                self._stop = True
            elif isinstance(command, Abort):
                self.engine.abort(command.request_id)
            elif isinstance(command, Add):
                try:
                    self.engine.add_request(
                        command.request_id, command.prompt_token_ids, command.params,
                        received_ns=command.received_ns, enqueued_ns=command.enqueued_ns,
                        priority=command.priority, tenant=command.tenant)
                except ValueError as e:
                    errors.append((command.request_id, EngineRequestError(str(e))))
                except Exception as e:
                    log.error("request %s failed in the engine", command.request_id,
                              exc_info=e)
                    errors.append((command.request_id,
                                   RequestFailed(f"{type(e).__name__}: {e}")))
                self.taken_in += 1
        return errors


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def freeze_heap() -> None:
    """Move every object alive now (the model, tokenizer, app: about 200,000 of them) out of
    the cyclic collector's reach, as vLLM does after start-up: a full collection over them
    takes about 100 ms on a CPU core, a stop of every stream; what requests allocate later
    is still collected."""
    gc.collect()
    gc.freeze()


class QueueInbox:
    """Commands from the event loop's thread to the engine thread."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._wakeup = threading.Event()

    def put(self, command: Command) -> None:
        self._queue.put(command)
        self._wakeup.set()

    def take(self) -> list[Command]:
        commands = []
        while True:
            try:
                commands.append(self._queue.get_nowait())
            except queue.Empty:
                return commands

    def wait(self, timeout: float | None) -> bool:
        woken = self._wakeup.wait(timeout)
        self._wakeup.clear()  # what came meanwhile is in the queue, taken next
        return woken


class EngineThread:
    """The loop in a thread of the server's process."""

    kind: CoreKind = "thread"

    def __init__(self, engine: LLMEngine, step_log: Path | None = None) -> None:
        self.engine = engine
        self.info = EngineInfo.of(engine)
        self.step_log = step_log
        self._inbox = QueueInbox()
        self._thread: threading.Thread | None = None

    def start(self, warmup: bool, receive: Callable[[Event], None]) -> None:
        """Start the loop (from the event loop, which `receive` then runs on)."""
        loop = asyncio.get_running_loop()

        def publish(event: Event) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(receive, event)

        run = EngineLoop(self.engine, self._inbox, publish, self.step_log).run
        self._thread = threading.Thread(target=run, args=(warmup,), name="latlab-engine",
                                        daemon=True)
        self._thread.start()

    def send(self, command: Command) -> None:
        self._inbox.put(command)

    def stop(self) -> None:
        self._inbox.put(Stop())
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)
