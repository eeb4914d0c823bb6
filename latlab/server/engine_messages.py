"""What the HTTP side and the engine's step loop tell each other (`engine_core`): commands
to the loop, events from it, and what the HTTP side needs to know of the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from latlab.engine.config import ModelConfig
from latlab.engine.outputs import EngineStats, RequestOutput
from latlab.engine.sampling_params import SamplingParams
from latlab.records.engine import EngineConfig
from latlab.tokenizer import Tokenizer

if TYPE_CHECKING:
    from latlab.engine.engine import LLMEngine

CoreKind = Literal["thread", "process"]  # where the step loop runs


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


