"""Lengths drawn per request: token counts (and durations) from a distribution written
`fixed:N`, `uniform:LOW,HIGH`, `normal:MEAN,STD` or `lognormal:MEAN,STD`."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field, model_validator


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

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        """Also the command line's form, `lognormal:256,128` (a bare number is fixed)."""
        return _parsed(data) if isinstance(data, (str, int, float)) else data

    @classmethod
    def parse(cls, text: str, option: str) -> LengthDistribution:
        """`text` as a distribution; `WorkloadError` names `option` and what is wrong."""
        try:
            return cls.model_validate(text)
        except ValueError as e:
            errors = getattr(e, "errors", None)
            reason = errors()[0]["msg"].removeprefix("Value error, ") if errors else str(e)
            raise WorkloadError(f"{option} {text!r}: {reason}") from None

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


_ARITY = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}


def _parsed(text: str | int | float) -> dict[str, Any]:
    """`"lognormal:256,128"` → its fields; a ValueError says what is wrong."""
    kind, _, params = str(text).strip().partition(":")
    if not params and kind.replace(".", "", 1).isdigit():
        kind, params = "fixed", kind
    if kind not in _ARITY:
        raise ValueError(f"unknown distribution {kind!r} (one of {', '.join(_ARITY)})")
    try:
        values = [float(v) for v in params.split(",")]
    except ValueError:
        values = []
    if len(values) != _ARITY[kind]:
        shape = {"fixed": "N", "uniform": "LOW,HIGH"}.get(kind, "MEAN,STD")
        raise ValueError(f"expected {kind}:{shape}")
    if values[0] <= 0 or min(values) < 0:
        raise ValueError("lengths must be positive")
    return {"kind": kind, "a": values[0], "b": values[1] if len(values) > 1 else 0.0}


