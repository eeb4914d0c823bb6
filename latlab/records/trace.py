"""`latlab trace`: what it is asked (a trace's window, as `--trace` replays it) and what it
finds (`TraceProfile`: the traffic's rate and burstiness, its lengths, prefix sharing and
sessions, and the synthetic workload that comes closest to it)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, model_validator

from latlab.records.arrivals import ArrivalConfig
from latlab.records.settings import OUTPUT, TRACE, setting
from latlab.records.summary import Record


class TraceWindow(BaseModel):
    """Which part of the trace: from --trace-start, ended by --duration (seconds of replay)
    or --requests."""

    duration_s: float | None = setting(None, "Seconds of the trace (at --trace-speed) from "
                                       "--trace-start (default: to its end).", group=TRACE,
                                       gt=0)
    requests: int | None = setting(None, "At most this many requests.", group=TRACE, ge=1)


class TraceConfig(TraceWindow):
    """`latlab trace SOURCE`: a trace or run folder (`arrivals.trace`), the window and shape
    of its replay, and where to export it."""

    arrivals: ArrivalConfig
    export: Path | None = setting(None, "Write the window as Mooncake-style JSONL (times, "
                                  "lengths, hash ids, sessions; no text), to share traffic "
                                  "without its prompts.", group=OUTPUT)

    @model_validator(mode="after")
    def _check(self) -> TraceConfig:
        if self.export is not None and self.arrivals.length_scale != 1:
            raise ValueError("--export writes the trace's own lengths: scale them when you "
                             "replay it (--length-scale on bench, predict)")
        return self


class Lengths(Record):
    """A length's distribution (tokens), and a histogram on log-spaced bins."""

    n: int
    mean: float
    std: float
    p50: float
    p90: float
    p99: float
    max: float
    histogram: list[tuple[float, int]] = []  # (a bin's lower edge, its requests)


class Sharing(Record):
    """Prefix sharing through the trace's blocks (each `block_tokens` tokens): what an
    unbounded prefix cache would hold, and how far back a reused prefix was last used."""

    block_tokens: int
    with_blocks: float  # share of requests that carry blocks
    blocks: int  # distinct blocks
    reused_blocks: int  # seen in more than one request
    cacheable_share: float  # prompt tokens in a prefix of blocks seen before, of all
    hit_requests: float  # share of requests whose first block was seen before
    reuse_requests_p50: float | None = None  # requests since its deepest cached block's last use
    reuse_requests_p90: float | None = None
    reuse_s_p50: float | None = None  # ... in seconds
    reuse_s_p90: float | None = None
    common_first_share: float = 0.0  # requests starting with the most common first block


class SessionStats(Record):
    sessions: int
    requests: float  # share of requests in a session
    turns_mean: float
    turns_max: int
    gap_s_p50: float | None = None  # between a session's consecutive requests
    gap_s_p90: float | None = None


class TraceProfile(Record):
    """What `latlab trace` finds in a trace's window."""

    source: str
    format: str
    requests: int
    skipped: str | None = None
    span_s: float
    rate: float  # mean requests/s over the span
    peak_rate: float  # the busiest bin's
    bin_s: float
    rate_series: list[float] = []  # requests/s per bin of `bin_s`, from the window's start
    interarrival_cv: float | None = None
    gamma_shape: float | None = None  # 1/CV²: 1 is Poisson, below 1 burstier
    dispersion: float | None = None  # variance / mean of per-second counts (Poisson: 1)
    prompt: Lengths | None = None
    output: Lengths | None = None
    sharing: Sharing | None = None
    sessions: SessionStats | None = None
    flags: list[str] = []  # the synthetic workload closest to it (`latlab bench` flags)
