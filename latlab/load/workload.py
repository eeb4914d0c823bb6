"""What to send: prompts and output lengths, synthetic or from a dataset, with labels.

Request `i` depends only on `(seed, i)`, so worker processes that share a schedule build
the same requests, and a rerun with the same config sends the same prompts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field, model_validator

from latlab.tokenizer import Tokenizer, TokenizerError
from latlab.load.datasets import load_dataset

Api = Literal["completions", "chat"]
_WORD = re.compile(r" [a-z]{2,12}")


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
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.integers(int(self.a), int(self.b), endpoint=True)
        elif self.kind == "normal":
            value = rng.normal(self.a, self.b)
        else:
            sigma2 = np.log1p((self.b / self.a) ** 2)
            value = rng.lognormal(np.log(self.a) - sigma2 / 2, np.sqrt(sigma2))
        return max(1, int(round(value)))


class WorkloadConfig(BaseModel):
    """The requests of a run. A dataset replaces the synthetic prompts (and, where it gives
    one, the output length); a `prefix_tokens` system prompt is shared by a `prefix_fraction`
    of the requests; labels are drawn per request by weight."""

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

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        for option, weights in (("--tenant", self.tenants), ("--priority", self.priorities)):
            if any(w <= 0 for w in weights.values()):
                raise ValueError(f"{option}: weights must be positive")
        return self


@dataclass(slots=True)
class RequestSpec:
    """One request's content: a prompt (completions) or messages (chat), and its labels."""

    index: int
    prompt: str | None
    messages: list[dict[str, Any]] | None
    prompt_tokens: int | None
    max_tokens: int
    tenant: str | None = None
    priority: int | None = None


class Workload:
    """Builds request `i` of a run from its `WorkloadConfig`."""

    def __init__(self, config: WorkloadConfig) -> None:
        self.config = config
        try:
            self.tokenizer = Tokenizer.load(config.tokenizer)
        except TokenizerError as e:
            raise WorkloadError(f"--tokenizer: {e}") from None
        self._words = _word_pool(self.tokenizer)
        self._dataset = load_dataset(config.dataset) if config.dataset else None
        self._prefix = self._text(np.random.default_rng([config.seed, 1]), config.prefix_tokens)
        self._tenants = _choice(config.tenants)
        self._priorities = _choice(config.priorities)

    def request(self, index: int) -> RequestSpec:
        c = self.config
        rng = np.random.default_rng([c.seed, 0, index])
        shared = c.prefix_tokens > 0 and rng.random() < c.prefix_fraction
        spec = RequestSpec(index=index, prompt=None, messages=None, prompt_tokens=None,
                           max_tokens=0, tenant=self._tenants(rng),
                           priority=self._priorities(rng))
        if self._dataset is None:
            self._synthetic(spec, rng, shared)
        else:
            self._from_dataset(spec, rng, shared)
        return spec

    def _synthetic(self, spec: RequestSpec, rng: np.random.Generator, shared: bool) -> None:
        n = self.config.prompt_tokens.sample(rng)
        own = self._text(rng, n)
        spec.max_tokens = self.config.output_tokens.sample(rng)
        spec.prompt_tokens = n + (self.config.prefix_tokens if shared else 0)
        if self.config.api == "chat":
            system = [{"role": "system", "content": self._prefix}] if shared else []
            spec.messages = system + [{"role": "user", "content": own}]
        else:
            spec.prompt = self._prefix + own if shared else own

    def _from_dataset(self, spec: RequestSpec, rng: np.random.Generator, shared: bool) -> None:
        entry = self._dataset[spec.index % len(self._dataset)]
        max_tokens = entry.output_tokens
        if max_tokens is None and entry.output_text is not None:
            max_tokens = max(1, len(self.tokenizer.encode(entry.output_text)))
        spec.max_tokens = max_tokens or self.config.output_tokens.sample(rng)
        spec.tenant = entry.tenant or spec.tenant
        spec.priority = entry.priority if entry.priority is not None else spec.priority
        prefix = self._prefix if shared else ""
        if self.config.api == "chat":
            messages = entry.messages or [{"role": "user", "content": entry.prompt}]
            system = [{"role": "system", "content": prefix}] if prefix else []
            spec.messages = system + messages
            spec.prompt_tokens = sum(len(self.tokenizer.encode(str(m.get("content") or "")))
                                     for m in spec.messages)
        else:
            text = entry.prompt
            if text is None:
                text = self.tokenizer.apply_chat_template(entry.messages)
            spec.prompt = prefix + text
            spec.prompt_tokens = len(self.tokenizer.encode(spec.prompt))

    def _text(self, rng: np.random.Generator, n_tokens: int) -> str:
        """Words that are one token each, drawn at random: exactly `n_tokens` tokens."""
        if n_tokens == 0:
            return ""
        words = self._words
        return "".join([words[i] for i in rng.integers(0, len(words), n_tokens)])


def _word_pool(tokenizer: Tokenizer) -> list[str]:
    """Lower-case words that encode to exactly one token, alone and after one another."""
    backend = tokenizer.backend
    texts = backend.decode_batch([[i] for i in range(tokenizer.vocab_size)])
    candidates = [(i, t) for i, t in enumerate(texts) if _WORD.fullmatch(t)]
    encoded = backend.encode_batch([t for _, t in candidates], add_special_tokens=False)
    words = [t for (i, t), e in zip(candidates, encoded) if e.ids == [i]]
    probe = words[:200]
    if len(words) < 100 or len(tokenizer.encode("".join(probe))) != len(probe):
        raise WorkloadError("--tokenizer: cannot build prompts of exact token counts with it "
                            "(no single-token words found); use --dataset")
    return words


def _choice(weights: dict[Any, float]):
    if not weights:
        return lambda rng: None
    labels = list(weights)
    p = np.asarray([weights[k] for k in labels], dtype=float)
    p /= p.sum()
    return lambda rng: labels[int(rng.choice(len(labels), p=p))]
