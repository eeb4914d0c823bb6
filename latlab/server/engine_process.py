"""The engine's step loop in a process of its own (`engine_core`): commands and events
pickled over two pipes, each written by a thread of its own."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection
from pathlib import Path

from latlab.engine.engine import LLMEngine
from latlab.engine.loader import ModelLoadError
from latlab.engine.outputs import EngineStats, RequestOutput
from latlab.engine.sequence import FinishReason, StageTimes
from latlab.records.engine import ConfigError, EngineConfig
from latlab.server.engine_loop import STOP_TIMEOUT_S, EngineLoop
from latlab.server.engine_messages import (
    Command,
    CoreKind,
    EngineInfo,
    Event,
    Failed,
    Start,
    Stepped,
    Stop,
)

log = logging.getLogger("latlab.serve")


class PipeInbox:
    """Commands from the server's process, in the engine's process."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def take(self) -> list[Command]:
        commands: list[Command] = []
        try:
            while self._connection.poll():
                commands.append(self._connection.recv())
        except (EOFError, OSError):  # the server's process is gone
            commands.append(Stop())
        return commands

    def wait(self, timeout: float | None) -> bool:
        return self._connection.poll(timeout)


@dataclass(frozen=True, slots=True)
class _LoadFailed:
    error: Exception


def _packed(event: Event) -> Event | tuple:
    """A step's outputs as tuples of plain values: pickled several times faster than the
    dataclasses (the pickling is a step's cost in the engine's process)."""
    if not isinstance(event, Stepped):
        return event
    outputs = [(o.request_id, o.text, o.num_prompt_tokens, o.num_cached_tokens,
                o.num_output_tokens, o.token_time_ns, o.finish_reason and o.finish_reason.value,
                _values(o.times, _TIMES), o.error, o.num_draft_tokens, o.num_accepted_tokens)
               for o in event.outputs]
    return outputs, event.errors, _values(event.stats, _STATS), event.taken_in


def _values(record: object, names: tuple[str, ...]) -> tuple:
    return tuple(getattr(record, name) for name in names)


_TIMES = tuple(f.name for f in fields(StageTimes))
_STATS = tuple(f.name for f in fields(EngineStats))


def _unpacked(message: Event | tuple) -> Event:
    if not isinstance(message, tuple):
        return message
    outputs, errors, stats, taken_in = message
    return Stepped([RequestOutput(*o[:6], o[6] and FinishReason(o[6]), StageTimes(*o[7]), *o[8:])
                    for o in outputs], errors, EngineStats(**dict(zip(_STATS, stats))), taken_in)


class _Sender:
    """Events to the server's process, sent by a thread of their own: a step never waits on
    a full pipe while the HTTP side catches up."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._queue: queue.SimpleQueue[Event | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._send, name="latlab-engine-sender",
                                         daemon=True)
        self._thread.start()

    def __call__(self, event: Event) -> None:
        self._queue.put(event)

    def _send(self) -> None:
        while (event := self._queue.get()) is not None:
            try:
                self._connection.send(_packed(event))
            except OSError:  # the server's process is gone
                return

    def close(self) -> None:
        """Send what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout=STOP_TIMEOUT_S)


def _engine_process(config: EngineConfig, step_log: Path | None, commands: Connection,
                    events: Connection) -> None:
    """The engine's process: load the model, say what it is, wait for `Start`, loop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops this
    try:
        engine = LLMEngine(config)
    except (ConfigError, ModelLoadError) as e:
        events.send(_LoadFailed(e))
        return
    except Exception as e:
        events.send(_LoadFailed(RuntimeError(f"{type(e).__name__}: {e}")))
        return
    events.send(EngineInfo.of(engine))
    first = commands.recv()
    if isinstance(first, Start):
        sender = _Sender(events)
        EngineLoop(engine, PipeInbox(commands), sender, step_log).run(first.warmup)
        sender.close()


class EngineProcess:
    """The loop in a process of its own, spawned (CUDA does not survive a fork). Commands
    are pickled by a writer thread, so that the event loop never waits on a full pipe;
    events are read on the event loop as the pipe becomes readable."""

    kind: CoreKind = "process"

    def __init__(self, config: EngineConfig, step_log: Path | None = None) -> None:
        context = multiprocessing.get_context("spawn")
        commands_in, self._commands = context.Pipe(duplex=False)
        self._events, events_out = context.Pipe(duplex=False)
        self._process = context.Process(target=_engine_process, name="latlab-engine",
                                        args=(config, step_log, commands_in, events_out),
                                        daemon=True)
        self._process.start()
        commands_in.close()
        events_out.close()
        self._outbox: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, name="latlab-engine-writer",
                                        daemon=True)
        self._writer.start()
        self.info = self._loaded()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    def _loaded(self) -> EngineInfo:
        """Wait for the model to load; raise what loading raised."""
        try:
            first = self._events.recv()
        except EOFError:
            self._outbox.put(None)
            self._process.join(timeout=5)
            raise RuntimeError(f"the engine process exited while loading the model "
                               f"(exit code {self._process.exitcode})") from None
        if isinstance(first, _LoadFailed):
            self._outbox.put(None)
            self._process.join(timeout=STOP_TIMEOUT_S)
            raise first.error
        return first

    def start(self, warmup: bool, receive: Callable[[Event], None]) -> None:
        """Let the engine warm up and serve; events reach `receive` on this event loop."""
        self._loop = asyncio.get_running_loop()
        self._receive = receive
        self._loop.add_reader(self._events.fileno(), self._read)
        self.send(Start(warmup))

    def _read(self) -> None:
        try:
            while self._events.poll():
                self._receive(_unpacked(self._events.recv()))
        except (EOFError, OSError):
            self._loop.remove_reader(self._events.fileno())
            if not self._stopping:
                self._process.join(timeout=5)
                self._receive(Failed(f"the engine process exited (exit code "
                                     f"{self._process.exitcode})"))

    def send(self, command: Command) -> None:
        self._outbox.put(command)

    def _write(self) -> None:
        while (command := self._outbox.get()) is not None:
            try:
                self._commands.send(command)
            except OSError:  # the engine process is gone; `_read` says so
                return

    def stop(self) -> None:
        """Stop the loop, and the process (terminated if it does not end in time)."""
        self._stopping = True
        if self._loop is not None and not self._events.closed:
            self._loop.remove_reader(self._events.fileno())
        self.send(Stop())
        self._outbox.put(None)
        self._process.join(timeout=STOP_TIMEOUT_S)
        if self._process.is_alive():
            log.warning("the engine process did not stop in %s s: terminated", STOP_TIMEOUT_S)
            self._process.terminate()
            self._process.join(timeout=5)
        self._events.close()
        self._commands.close()
