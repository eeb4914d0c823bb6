"""Where the engine's step loop runs (`--engine-core`): a thread beside the HTTP server, or a
process of its own, as vLLM's engine core runs apart from its API server.

The loop (`EngineLoop`) is the same in both: it takes the commands queued since the last step
(new requests, aborts), runs one step and publishes the step's outputs with the engine's
stats in one event. In a thread (`EngineThread`) commands and events are Python objects
handed over a queue and `call_soon_threadsafe`; the HTTP side's Python (parsing, tokenizing,
SSE, metrics) then takes turns with the steps on one core, under one GIL. In a process
(`EngineProcess`) they are pickled over two pipes and the HTTP side runs on another core;
text is still detokenized in the engine, so that a stop string ends a request in the step
that makes it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Literal, Protocol

import orjson

from latlab.engine.config import ModelConfig
from latlab.engine.engine import LLMEngine
from latlab.engine.loader import ModelLoadError
from latlab.engine.outputs import EngineStats, RequestOutput
from latlab.engine.sampling_params import SamplingParams
from latlab.engine.sequence import FinishReason, StageTimes
from latlab.records.engine import ConfigError, EngineConfig
from latlab.records.steps import FEATURE_FIELDS
from latlab.tokenizer import Tokenizer

log = logging.getLogger("latlab.serve")
CoreKind = Literal["thread", "process"]
STOP_TIMEOUT_S = 30  # for the step in flight (or a warm-up) to end


@dataclass(frozen=True, slots=True)
class Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    received_ns: int
    enqueued_ns: int
    priority: int
    tenant: str | None


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class Start:
    warmup: bool


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = Add | Abort | Start | Stop


@dataclass(frozen=True)
class EngineInfo:
    """What the HTTP side needs of the engine, known once the model is loaded."""

    config: EngineConfig  # resolved: the context and the KV pool as the engine sized them
    model_config: ModelConfig
    tokenizer: Tokenizer
    num_kv_blocks: int
    device: str
    stats: EngineStats  # before the first step

    @classmethod
    def of(cls, engine: LLMEngine) -> EngineInfo:
        return cls(engine.config, engine.model_config, engine.tokenizer,
                   engine.block_manager.num_blocks, engine.device.type, engine.stats())


@dataclass(frozen=True, slots=True)
class Ready:
    startup_s: float
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class Stepped:
    """A step's outputs (or requests the engine refused), with the stats after it and how
    many requests the engine has taken in so far."""

    outputs: list[RequestOutput]
    errors: list[tuple[str, Exception]]
    stats: EngineStats
    taken_in: int


@dataclass(frozen=True, slots=True)
class Failed:
    error: str


Event = Ready | Stepped | Failed


class EngineRequestError(Exception):
    """The engine refused the request (e.g. a token id outside the vocabulary)."""


class RequestFailed(Exception):
    """The engine failed this one request (HTTP 500); it serves the others as before."""


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
                    for o in outputs], errors, EngineStats(*stats), taken_in)


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


def engine_core(kind: CoreKind, config: EngineConfig, step_log: Path | None
                ) -> EngineThread | EngineProcess:
    """The engine (no warm-up yet: `start` runs it) in a thread or a process of its own."""
    config = config.model_copy(update={"warmup": False})
    if kind == "process":
        return EngineProcess(config, step_log)
    return EngineThread(LLMEngine(config), step_log)
