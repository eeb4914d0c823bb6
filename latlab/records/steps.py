"""The engine's steps as `latlab serve --step-log FILE` writes them: one JSON object a line,
appended as each step ends. What a step's time depends on is `STEP_FEATURES`
(`records.calibration`); `latlab calibrate` fits served steps, and a step log shows what the
engine did under a run's load."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from latlab.records.calibration import STEP_FEATURES

FEATURE_FIELDS = tuple(name for name in STEP_FEATURES if name != "step")


class StepRecord(BaseModel):
    """One engine step: when it started and ended (the server's perf_counter, ns: the
    machine's CLOCK_MONOTONIC), and what it scheduled (counts in tokens)."""

    model_config = ConfigDict(frozen=True)

    start_ns: int
    end_ns: int
    tokens: int
    decodes: int
    prefills: int
    sampled: int
    decode_groups: int
    decode_context: int
    prefill_attention: int

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    def features(self) -> list[int]:
        """In `batching.step_features`' order."""
        return [getattr(self, name) for name in FEATURE_FIELDS]


class StepLogError(ValueError):
    """A step log that cannot be read: its path and line say where."""


def read_step_log(path: Path) -> list[StepRecord]:
    """Every step in `path`; a torn last line (the server was killed mid-write) is skipped."""
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as e:
        raise StepLogError(f"{path}: {e.strerror or e}") from None
    steps = []
    for number, line in enumerate(lines, 1):
        try:
            steps.append(StepRecord.model_validate_json(line))
        except ValidationError as e:
            if number == len(lines):
                break
            raise StepLogError(f"{path}:{number}: not a step record "
                               f"({e.errors()[0]['msg']})") from None
    return steps
