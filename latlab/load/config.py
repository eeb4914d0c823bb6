"""`BenchConfig`: everything a bench run needs, validated before any load is sent.

Its JSON dump (`model_dump(mode="json")`) goes into config.json and rebuilds the run.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, model_validator

from latlab.load.arrivals import ArrivalConfig
from latlab.load.workload import WorkloadConfig
from latlab.metrics import SLO_METRICS


class BenchError(Exception):
    """A run that could not start: the message says why and what to change."""


class BenchConfig(BaseModel):
    """A bench run: the target, the workload, the arrivals and when to stop."""

    url: str | None = None
    model: str | None = None
    api_key: SecretStr | None = Field(default=None, exclude=True)
    serve_args: list[str] = []
    workload: WorkloadConfig = WorkloadConfig()
    arrivals: ArrivalConfig = ArrivalConfig()
    duration_s: float | None = Field(default=20.0, gt=0)
    requests: int | None = Field(default=None, ge=1)
    warmup_s: float = Field(default=0.0, ge=0)
    cooldown_s: float = Field(default=0.0, ge=0)
    timeout_s: float = Field(default=300.0, gt=0)
    workers: int = Field(default=1, ge=1, le=64)
    ignore_eos: bool = True
    continuous_usage: bool = True
    slos: dict[str, float] = {}
    out: Path = Path("runs")
    name: str = "bench"
    tags: list[str] = []

    @model_validator(mode="after")
    def _check(self) -> BenchConfig:
        if self.duration_s is None and self.requests is None and self.arrivals.process != "trace":
            raise ValueError("give --duration or --requests")
        if self.duration_s is not None and self.warmup_s + self.cooldown_s >= self.duration_s:
            raise ValueError(f"--warmup {self.warmup_s:g} s + --cooldown {self.cooldown_s:g} s "
                             f"leave nothing of --duration {self.duration_s:g} s")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url {self.url!r}: expected http://HOST:PORT or https://...")
        a = self.arrivals
        if a.process == "closed" and a.users < self.workers:
            raise ValueError(f"--users {a.users} cannot be shared by --workers {self.workers}")
        if a.max_concurrency is not None and a.max_concurrency < self.workers:
            raise ValueError(f"--max-concurrency {a.max_concurrency} cannot be shared by "
                             f"--workers {self.workers}")
        for name, limit in self.slos.items():
            if name not in SLO_METRICS or limit <= 0:
                raise ValueError(f"--slo {name}={limit}: unknown metric or non-positive limit")
        return self

    def share(self, total: int, worker: int) -> int:
        """Worker `worker`'s share of `total` users or concurrency slots."""
        return total // self.workers + (1 if worker < total % self.workers else 0)
