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

from pathlib import Path

from latlab.engine.engine import LLMEngine
from latlab.records.engine import EngineConfig
from latlab.server.engine_loop import EngineThread
from latlab.server.engine_messages import CoreKind
from latlab.server.engine_process import EngineProcess


def engine_core(kind: CoreKind, config: EngineConfig, step_log: Path | None
                ) -> EngineThread | EngineProcess:
    """The engine (no warm-up yet: `start` runs it) in a thread or a process of its own."""
    config = config.model_copy(update={"warmup": False})
    if kind == "process":
        return EngineProcess(config, step_log)
    return EngineThread(LLMEngine(config), step_log)
