"""What one load-generator process measured about itself while it ran (the raw material of
the client self-check in `latlab.metrics.client`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class WorkerHealth:
    """Event-loop lag and dispatch lateness samples (ms, with their stamps), CPU and load."""

    worker: int
    node: str | None = None  # the Ray node it ran on (`--ray`)
    loop_lag_ms: list[float] = field(default_factory=list)
    loop_lag_at_ns: list[int] = field(default_factory=list)
    dispatch_lateness_ms: list[float] = field(default_factory=list)
    dispatch_at_ns: list[int] = field(default_factory=list)
    cpu_mean: float = 0.0
    cpu_max: float = 0.0
    load_average: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerHealth:
        return cls(**data)
