"""`summary.json`: a run's metrics, written once at its end (recomputable from the records).

Latencies are in milliseconds. A failure-adjusted percentile can be infinite: JSON has no
infinity, so it is written as the string "inf" and read back as `math.inf`.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, ConfigDict, PlainSerializer

from latlab.records import SCHEMA_VERSION
from latlab.records.spans import SpanJoin


def _inf_as_text(value: float | None) -> float | str | None:
    return "inf" if value is not None and math.isinf(value) else value


Unbounded = Annotated[float, PlainSerializer(_inf_as_text, return_type=float | str,
                                             when_used="json")]
"""A float that may be infinite (written as "inf", read back as `math.inf`)."""
Ms = Unbounded


class Record(BaseModel):
    """A part of a file on disk: unknown fields (from a newer latlab) are ignored."""

    model_config = ConfigDict(extra="ignore")


class Percentile(Record):
    """A percentile and its 95% confidence interval from the order statistics (the sample's
    own uncertainty); a predicted run's also carries `lo`–`hi`, the interval its draws
    spanned (`Prediction`), where `hi` is infinite when the queue may grow without end."""

    value: Ms | None
    ci_low: Ms | None
    ci_high: Ms | None
    reliable: bool
    lo: Ms | None = None
    hi: Ms | None = None


class Distribution(Record):
    n: int
    mean: Ms | None = None
    min: Ms | None = None
    max: Ms | None = None
    percentiles: dict[str, Percentile] = {}

    def __getitem__(self, name: str) -> float | None:
        """The percentile's value (`d["p99"]`) or the mean (`d["mean"]`), None when there is
        none."""
        if name == "mean":
            return self.mean
        p = self.percentiles.get(name)
        return p.value if p is not None else None


class Throughput(Record):
    """Rates over the measurement window.

    `offered_rate` and `sent_rate` are over the window's arrivals: the window, or up to its
    last arrival when the arrivals stopped inside it; both are None for a burst, whose
    arrivals span under 10% of the window.
    `backlog_growth` is how many more requests were in flight when the window's last request
    arrived than at the window's start: about zero (± a few) when the target keeps up, the
    growing queue when it does not.
    `fell_behind` needs both an achieved rate under 95% of the offered one and a backlog
    growth beyond the noise of a stable queue, so a short window's edge effects do not
    raise a false alarm. `users`: a closed loop's users, whose rate is what the server let
    them send, not an offered load (None: an open loop).
    """

    window_s: float
    offered_rate: float | None
    sent_rate: float | None
    achieved_rate: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    mean_concurrency: float
    backlog_growth: int
    fell_behind: bool
    users: int | None = None


class Goodput(Record):
    slos: dict[str, float]
    good: int
    fraction: float
    requests_per_s: float | None


class LoopLag(Record):
    p50: float | None = None
    p99: float | None = None
    max: float | None = None


class WorkerCpu(Record):
    worker: int
    mean: float
    max: float


class CpuPercent(Record):
    mean: float | None = None
    max: float | None = None
    per_process: list[WorkerCpu] = []


class Machine(Record):
    cpus: int
    load_average_max: float


class Usage(Record):
    """CPU cores in use (or a share, for steal): the mean over the run and the largest
    one-second sample."""

    mean: float
    max: float


class HostLoad(Record):
    """The host the load generator ran on, over the run: how busy its CPUs were and with
    whom — the client's own processes, the target's server when it runs here, every other
    process — and the share of CPU time the hypervisor gave to others (steal)."""

    cpus: int
    seconds: float
    busy: Usage
    client: Usage
    server: Usage | None = None
    server_found: str | None = None  # how the server's processes were found
    other: Usage
    steal: Usage | None = None
    load_average_max: float = 0.0


class ClientCheck(Record):
    """The load generator's self-check: is the client the bottleneck (`reasons`), or was
    the host busy with other work (`host_reasons`: the results are unreliable), and why."""

    workers: int
    loop_lag_ms: LoopLag = LoopLag()
    cpu_percent: CpuPercent = CpuPercent()
    lateness_p99_ms: float | None = None
    machine: Machine | None = None
    zero_gap_share: float | None = None
    bottleneck: bool
    reasons: list[str] = []
    host: HostLoad | None = None
    host_busy: bool = False
    host_reasons: list[str] = []
    stalls: list[tuple[int, float]] = []  # (start ns, ms) the client's event loop was held up


class CacheUse(Record):
    """Prompt tokens the server took from its prefix cache: their share, and where latlab
    learned it (each request's own count, or the server's counters over the run)."""

    share: float
    source: str
    requests: int | None = None  # requests that reported their cached tokens
    cached_tokens: float
    prompt_tokens: float


class WindowSpan(Record):
    start_ns: int
    end_ns: int
    seconds: float


class TurnStats(Record):
    """A session's turn (or an agent's step) across the sessions: its successful requests'
    TTFT, mean prompt tokens and the share of them the server took from its prefix cache
    (None when it reports no cached tokens)."""

    turn: int
    n: int
    ttft: Distribution
    prompt_tokens: float | None = None
    cached_share: float | None = None


class SessionSummary(Record):
    """Sessions (`--turns`, `--agent-steps`): how many had a request in the window, how many
    ran every turn successfully, their duration (first request scheduled → last one done,
    think times and tool steps included, ms) and, for agent tasks, the mean task's split
    into model calls (E2E from schedule), tool steps and the orchestration between them."""

    kind: str
    sessions: int
    complete: int
    turns_mean: float
    duration: Distribution
    think: Distribution | None = None
    model_ms: float | None = None
    tool_ms: float | None = None
    orchestration_ms: float | None = None
    per_turn: list[TurnStats] = []


class ReasoningSummary(Record):
    """Streams that marked reasoning tokens: time to the first reasoning token and to the
    first answer token (from send), the thinking time (first reasoning → first answer, or
    the end without one) and its mean share of E2E."""

    n: int
    ttfr: Distribution
    ttfa: Distribution
    thinking: Distribution
    thinking_share: float


class Prediction(Record):
    """How far to trust a predicted run's percentiles: the simulation ran again in `draws`
    worlds drawn from the calibration's spread (its step costs' level and drift, each
    request's costs outside the engine), `runs` runs in each (their own workload seeds: a
    short run's percentile varies from run to run), `requests` each; every percentile's
    `lo`–`hi` is the central `level` of what they gave: where one run of `run_requests`
    requests (in its window) will measure it. `fell_behind` draws (and the point estimate,
    when `point_fell_behind`) had a queue that grew: where those reach the interval's upper
    end, `hi` is infinite. `floor`: the widest (hi/lo) a TTFT, TPOT or E2E p50/p90/p99 moves
    between runs of one world (the run's own luck, which no calibration narrows), at the
    percentile `floor_at` ("TPOT p99"); `requests_for_width`: from how many requests a
    run's every such interval would be 1.5× wide at most (None: not known, or no length
    gives it)."""

    level: float
    draws: int
    requests: int
    runs: int = 1  # in each world
    fell_behind: int = 0
    point_fell_behind: bool = False
    spread: str = ""  # the calibration's spread, in words
    wall_s: float | None = None
    notes: list[str] = []
    run_requests: int | None = None
    floor: float | None = None
    floor_at: str | None = None
    requests_for_width: int | None = None


class RunSummary(Record):
    """Everything `summary.json` holds."""

    schema_version: int = SCHEMA_VERSION
    requests: int
    in_window: int
    ok: int
    cancelled: int = 0  # by the user (Ctrl-C): neither ok nor failed
    failures: dict[str, int] = {}
    latency: dict[str, Distribution] = {}
    failure_adjusted: dict[str, Distribution] = {}
    throughput: Throughput | None = None
    goodput: Goodput | None = None
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None
    tokens_from_usage: float = 0.0
    cached_share: float | None = None  # the per-request share (`cache` says it with its source)
    cache: CacheUse | None = None
    events_disagree: int = 0  # requests whose token events do not add up to the usage count
    stopped_short: int = 0  # successful requests that ended before their max_tokens
    retries: int = 0  # requests sent again on a fresh connection
    warnings: list[str] = []
    formulas: dict[str, str] = {}
    client: ClientCheck | None = None
    window: WindowSpan | None = None
    stop_reason: str | None = None
    spans: SpanJoin | None = None
    sessions: SessionSummary | None = None
    reasoning: ReasoningSummary | None = None
    prediction: Prediction | None = None  # a predicted run's intervals

    def percentile(self, metric: str, name: str) -> float | None:
        """`summary.percentile("ttft", "p99")` (or `"mean"`): the value, None when not
        measured."""
        d = self.latency.get(metric)
        return d[name] if d is not None else None

    def to_json(self) -> dict:
        return self.model_dump(mode="json")
