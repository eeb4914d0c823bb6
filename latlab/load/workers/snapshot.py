"""What a worker reports of its progress every half second, for the live line: counts so far
and the TTFTs that ended since its last snapshot. It crosses to the driver pickled, through
the worker processes' queue or a Ray actor's poll."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerSnapshot:
    worker: int
    dispatched: int
    done: int
    failed: int
    in_flight: int
    tokens: int  # output tokens received, those of requests in flight included
    ttft_ms: list[float]  # of the requests that ended well since the last snapshot
