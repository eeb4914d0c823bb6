"""What a run sends and when: the workload (prompt and output lengths, dataset, labels) and
the arrivals (closed loop, open-loop processes, trace replay). Request `i` of a workload
depends only on `(seed, i)`; `latlab.load.workload.requests` builds it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, model_validator

Api = Literal["completions", "chat", "ollama", "ollama-chat"]
CHAT_APIS = ("chat", "ollama-chat")  # the APIs that take messages, not a prompt
Process = Literal["closed", "poisson", "gamma", "constant", "trace"]
OPEN_LOOP = ("poisson", "gamma", "constant")


class WorkloadError(ValueError):
    """A workload option or dataset that cannot be used; the message names it."""


class LengthDistribution(BaseModel):
    """Token counts: `fixed:N`, `uniform:LOW,HIGH`, `normal:MEAN,STD`, `lognormal:MEAN,STD`.

    The lognormal's MEAN and STD are those of the lengths themselves, not of their logs.
    Samples are rounded and clipped to at least 1.
    """

    kind: Literal["fixed", "uniform", "normal", "lognormal"]
    a: float = Field(gt=0)
    b: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> LengthDistribution:
        if self.kind == "uniform" and self.b < self.a:
            raise ValueError(f"uniform:{self.a:g},{self.b:g}: HIGH must be at least LOW")
        return self

    @classmethod
    def parse(cls, text: str, option: str) -> LengthDistribution:
        kind, _, params = text.strip().partition(":")
        if not params and kind.replace(".", "", 1).isdigit():
            kind, params = "fixed", kind
        arity = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}
        if kind not in arity:
            raise WorkloadError(f"{option} {text!r}: unknown distribution {kind!r} "
                                f"(one of {', '.join(arity)})")
        try:
            values = [float(v) for v in params.split(",")]
        except ValueError:
            values = []
        if len(values) != arity[kind]:
            shape = {"fixed": "N", "uniform": "LOW,HIGH"}.get(kind, "MEAN,STD")
            raise WorkloadError(f"{option} {text!r}: expected {kind}:{shape}")
        if values[0] <= 0 or min(values) < 0:
            raise WorkloadError(f"{option} {text!r}: lengths must be positive")
        try:
            return cls(kind=kind, a=values[0], b=values[1] if len(values) > 1 else 0.0)
        except ValueError as e:
            raise WorkloadError(f"{option} {text!r}: {e.errors()[0]['msg']}") from None

    def __str__(self) -> str:
        return f"{self.kind}:{self.a:g}" + (f",{self.b:g}" if self.kind != "fixed" else "")

    def sample(self, rng: np.random.Generator) -> int:
        if self.kind == "uniform":
            return max(1, int(rng.integers(int(self.a), int(self.b), endpoint=True)))
        return max(1, int(round(self.draw(rng))))

    def draw(self, rng: np.random.Generator) -> float:
        """One value, unrounded (a duration), at least 0."""
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.uniform(self.a, self.b)
        elif self.kind == "normal":
            value = rng.normal(self.a, self.b)
        else:
            sigma2 = np.log1p((self.b / self.a) ** 2)
            value = rng.lognormal(np.log(self.a) - sigma2 / 2, np.sqrt(sigma2))
        return max(0.0, float(value))

    def sample_many(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` samples at once (the simulator's workloads): the distribution of `sample`,
        not its sequence of draws."""
        if self.kind == "fixed":
            values = np.full(n, self.a)
        elif self.kind == "uniform":
            values = rng.integers(int(self.a), int(self.b), n, endpoint=True)
        elif self.kind == "normal":
            values = rng.normal(self.a, self.b, n)
        else:
            sigma2 = np.log1p((self.b / self.a) ** 2)
            values = rng.lognormal(np.log(self.a) - sigma2 / 2, np.sqrt(sigma2), n)
        return np.maximum(1, np.rint(values)).astype(np.int64)


SessionKind = Literal["chat", "agent"]


class SessionConfig(BaseModel):
    """Requests in sessions. A chat (`kind="chat"`) of `turns` turns: every turn's prompt is
    the whole history plus a new user message, the model's real answers included, with
    `think_s` seconds (a distribution; None: none) between a turn's end and the next one.
    An agent task (`agent`) of `turns` model calls with a tool step between two: `tool_ms`
    (a distribution) or a real HTTP tool at `tool_url` (POSTed the model's answer), whose
    output is the next message. `turns` None replays a dataset's conversations whole."""

    kind: SessionKind = "chat"
    turns: LengthDistribution | None = LengthDistribution(kind="fixed", a=4)
    think_s: LengthDistribution | None = None
    tool_ms: LengthDistribution | None = None
    tool_url: str | None = None
    message_tokens: LengthDistribution | None = None  # a new message's length (None: prompt_tokens)


class WorkloadConfig(BaseModel):
    """The requests of a run. A dataset replaces the synthetic prompts (and, where it gives
    one, the output length); a `prefix_tokens` system prompt is shared by a `prefix_fraction`
    of the requests; labels are drawn per request by weight. A `prompt_salt` changes every
    prompt's words (not its length), so a server's prompt cache keeps nothing from another
    run; a dataset's prompts get a few salt words in front."""

    api: Api = "completions"
    prompt_tokens: LengthDistribution = LengthDistribution(kind="lognormal", a=256, b=128)
    output_tokens: LengthDistribution = LengthDistribution(kind="lognormal", a=64, b=32)
    dataset: Path | None = None
    prefix_tokens: int = Field(default=0, ge=0)
    prefix_fraction: float = Field(default=1.0, ge=0, le=1)
    tenants: dict[str, float] = {}
    priorities: dict[int, float] = {}
    tokenizer: str | None = None
    seed: int = 0
    prompt_salt: int | None = None  # other prompt words per salt, the same lengths
    context_tokens: int | None = None  # the server's context: max_tokens is lowered to fit it
    sessions: SessionConfig | None = None  # None: independent single-turn requests

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        if self.sessions is not None and self.sessions.turns is None and self.dataset is None:
            raise ValueError("--turns all replays a dataset's conversations: give --dataset")
        for option, weights in (("--tenant", self.tenants), ("--priority", self.priorities)):
            if any(w <= 0 for w in weights.values()):
                raise ValueError(f"{option}: weights must be positive")
        return self


class ArrivalConfig(BaseModel):
    """Closed loop: `users` each send their next request when the last one ends.
    Open loop: `rate` requests/s with Poisson, gamma (`burstiness` is its shape: 1 is
    Poisson, below 1 burstier, CV = 1/sqrt(burstiness)) or constant gaps, or the
    timestamps of a `trace`. `max_concurrency` caps requests in flight (late sends show as
    lateness); `ramp_s` grows the rate (or the number of users) linearly from zero."""

    process: Process = "closed"
    users: int = Field(default=4, ge=1)
    rate: float | None = Field(default=None, gt=0)
    burstiness: float = Field(default=1.0, gt=0)
    max_concurrency: int | None = Field(default=None, ge=1)
    ramp_s: float = Field(default=0.0, ge=0)
    trace: Path | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> ArrivalConfig:
        if self.process in OPEN_LOOP and self.rate is None:
            raise ValueError(f"a {self.process} arrival process needs a rate")
        if self.process == "trace" and self.trace is None:
            raise ValueError("trace replay needs a trace file")
        return self

    @property
    def open_loop(self) -> bool:
        return self.process != "closed"
