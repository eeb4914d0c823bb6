"""Metric definitions (the contract of DESIGN.md) and the run summary.

Every latency is in milliseconds. `FORMULAS` states each definition; outputs quote it.
Percentiles use linear interpolation and carry their sample count and a distribution-free
confidence interval from order statistics (binomial); one with fewer than 10 samples beyond
it is flagged unreliable.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from latlab.records.timeline import RequestTimeline

NS_PER_MS = 1e6
PERCENTILES: dict[str, float] = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p99.9": 99.9}
CONFIDENCE = 0.95
MIN_TAIL_SAMPLES = 10
SHORTFALL = 0.95
BURST_SHARE = 0.1
BACKLOG_NOISE_MIN = 3
BACKLOG_NOISE_SIGMAS = 3.0

FORMULAS: dict[str, str] = {
    "ttft": "first_token − sent: first SSE event carrying ≥1 generated token",
    "ttft_sched": "first_token − scheduled: TTFT including client-side waiting",
    "e2e": "done − sent: stream closed after [DONE]",
    "e2e_sched": "done − scheduled: E2E including client-side waiting",
    "tpot": "(last_token − first_token) / (output_tokens − 1), output_tokens ≥ 2 (usage count)",
    "itl": "per token: the gap before an event carrying k tokens gives k samples of gap/k; pooled",
    "itl_request_mean": "mean of one request's ITL samples, one value per request",
    "chunk_gap": "raw gap between consecutive token-carrying SSE events (inter-chunk latency)",
    "lateness": "sent − scheduled: how late the client sent against the schedule",
    "output_tokens_per_s": "output tokens of token events inside the window / window length",
    "goodput": "requests that succeeded and met every SLO, completed in the window / window length",
    "failure_adjusted": "percentile with every failed request counted as infinitely slow",
}


@dataclass(slots=True)
class RequestMetrics:
    """The per-request metrics of one timeline; `None` where a metric is undefined."""

    ttft: float | None
    ttft_sched: float | None
    e2e: float | None
    e2e_sched: float | None
    tpot: float | None
    lateness: float | None
    itl: list[float]
    chunk_gaps: list[float]
    output_tokens: int | None

    @property
    def itl_mean(self) -> float | None:
        return sum(self.itl) / len(self.itl) if self.itl else None


def _ms(later: int | None, earlier: int | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier) / NS_PER_MS


def request_metrics(r: RequestTimeline) -> RequestMetrics:
    """TTFT, E2E (from send and from schedule), TPOT, ITL and gaps, exactly as FORMULAS says."""
    ok = r.ok
    output_tokens = r.output_tokens
    tpot = None
    if ok and output_tokens is not None and output_tokens >= 2:
        span = _ms(r.last_token_ns, r.first_token_ns)
        tpot = span / (output_tokens - 1) if span is not None else None
    itl: list[float] = []
    gaps: list[float] = []
    times, counts = r.token_ns, r.token_counts
    for i in range(1, len(times)):
        gap = (times[i] - times[i - 1]) / NS_PER_MS
        gaps.append(gap)
        k = max(counts[i], 1)
        itl.extend([gap / k] * k)
    return RequestMetrics(
        ttft=_ms(r.first_token_ns, r.sent_ns),
        ttft_sched=_ms(r.first_token_ns, r.scheduled_ns),
        e2e=_ms(r.done_ns, r.sent_ns) if ok else None,
        e2e_sched=_ms(r.done_ns, r.scheduled_ns) if ok else None,
        tpot=tpot,
        lateness=_ms(r.sent_ns, r.scheduled_ns),
        itl=itl,
        chunk_gaps=gaps,
        output_tokens=output_tokens,
    )


# --- percentiles ---------------------------------------------------------------------------


@dataclass(slots=True)
class Percentile:
    value: float | None
    ci_low: float | None
    ci_high: float | None
    reliable: bool


@dataclass(slots=True)
class Distribution:
    n: int
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    percentiles: dict[str, Percentile] = field(default_factory=dict)

    def __getitem__(self, name: str) -> float | None:
        return self.percentiles[name].value if name in self.percentiles else None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `inf` entries stay `inf`."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of no samples")
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    a, b = sorted_values[lo], sorted_values[hi]
    if frac == 0 or a == b:
        return float(a)
    if math.isinf(b):
        return math.inf
    return float(a + (b - a) * frac)


def percentile_ci(
    sorted_values: Sequence[float], q: float, confidence: float = CONFIDENCE
) -> tuple[float | None, float | None]:
    """Distribution-free CI of the q-th percentile from order statistics (binomial ranks).

    A side the sample is too small to bound is `None` (e.g. the upper bound of p99 from 50
    samples): the honest answer is "unknown", not the maximum.
    """
    from scipy.stats import binom

    n = len(sorted_values)
    if n == 0:
        return None, None
    alpha = 1 - confidence
    p = q / 100.0
    lo_rank = int(binom.ppf(alpha / 2, n, p))  # 1-based rank of the lower bound
    hi_rank = int(binom.ppf(1 - alpha / 2, n, p)) + 1
    low = float(sorted_values[lo_rank - 1]) if lo_rank >= 1 else None
    high = float(sorted_values[hi_rank - 1]) if hi_rank <= n else None
    return low, high


def distribution(values: Iterable[float]) -> Distribution:
    """Mean, min, max and every percentile of `PERCENTILES` with its CI and reliability."""
    data = np.sort(np.asarray([v for v in values if v is not None], dtype=float))
    n = len(data)
    if n == 0:
        return Distribution(n=0)
    finite = data[np.isfinite(data)]
    result = Distribution(
        n=n,
        mean=float(finite.mean()) if len(finite) == n else math.inf,
        min=float(data[0]),
        max=float(data[-1]),
    )
    for name, q in PERCENTILES.items():
        low, high = percentile_ci(data, q)
        result.percentiles[name] = Percentile(
            value=percentile(data, q),
            ci_low=low,
            ci_high=high,
            reliable=n * (1 - q / 100.0) >= MIN_TAIL_SAMPLES,
        )
    return result


# --- windows and SLOs ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """The measurement window on the client's monotonic clock (after warmup, before cooldown)."""

    start_ns: int
    end_ns: int

    @property
    def duration_s(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e9

    def __contains__(self, t_ns: int | None) -> bool:
        return t_ns is not None and self.start_ns <= t_ns < self.end_ns

    @classmethod
    def of_run(
        cls,
        records: Sequence[RequestTimeline],
        start_ns: int | None = None,
        end_ns: int | None = None,
        warmup_s: float = 0.0,
        cooldown_s: float = 0.0,
    ) -> Window | None:
        """The window of a run that started at `start_ns` (default: first scheduled request)
        and ended at `end_ns` (default: last request done), less warmup and cooldown."""
        starts = [r.origin_ns for r in records if r.origin_ns is not None]
        ends = [t for r in records for t in (r.done_ns, r.last_token_ns, r.sent_ns) if t is not None]
        if start_ns is None:
            if not starts:
                return None
            start_ns = min(starts)
        if end_ns is None:
            if not ends:
                return None
            end_ns = max(ends) + 1
        window = cls(start_ns + int(warmup_s * 1e9), end_ns - int(cooldown_s * 1e9))
        return window if window.end_ns > window.start_ns else None


SLO_METRICS = ("ttft", "ttft_sched", "tpot", "itl", "e2e", "e2e_sched")
_SLO = re.compile(r"^\s*(?P<name>[a-z_]+)\s*(?:=|<=?)\s*(?P<value>[0-9.]+)\s*(?P<unit>ms|s|us)?\s*$")
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "us": 0.001, None: 1.0}


def parse_slo(text: str) -> tuple[str, float]:
    """`"ttft=200ms"` → `("ttft", 200.0)`. `itl` bounds every token gap of a request."""
    match = _SLO.match(text)
    if not match:
        raise ValueError(f"bad SLO {text!r}: expected NAME=VALUE[ms|s|us], e.g. ttft=200ms")
    name = match["name"]
    if name not in SLO_METRICS:
        raise ValueError(f"bad SLO {text!r}: unknown metric {name!r} (one of {', '.join(SLO_METRICS)})")
    value = float(match["value"]) * _UNIT_MS[match["unit"]]
    if value <= 0:
        raise ValueError(f"bad SLO {text!r}: the limit must be positive")
    return name, value


def meets_slos(m: RequestMetrics, slos: dict[str, float]) -> bool:
    """True when every SLO holds; a metric undefined for the request (TPOT of 1 token) holds."""
    for name, limit in slos.items():
        value = max(m.itl, default=None) if name == "itl" else getattr(m, name)
        if value is not None and value > limit:
            return False
    return True


def zero_gap_share(records: Sequence[RequestTimeline],
                   window: Window | None = None) -> float | None:
    """Share of gaps between a request's token events that are exactly zero (same read),
    over the requests scheduled in `window` (all without one)."""
    gaps = zeros = 0
    for r in records:
        if window is not None and r.origin_ns not in window:
            continue
        t = r.token_ns
        if len(t) > 1:
            gaps += len(t) - 1
            zeros += int(np.count_nonzero(np.diff(t) == 0))
    return zeros / gaps if gaps else None


# --- the run summary -----------------------------------------------------------------------

LATENCY_METRICS = ("ttft", "ttft_sched", "tpot", "itl", "itl_request_mean", "chunk_gap", "e2e",
                   "e2e_sched", "lateness")
FAILURE_ADJUSTED = ("ttft", "ttft_sched", "e2e", "e2e_sched")


@dataclass
class Throughput:
    """Rates over the measurement window.

    `offered_rate` and `sent_rate` are over the window's arrivals: the window, or up to its
    last arrival when the arrivals stopped inside it; both are None for a burst, whose
    arrivals span under 10% of the window.
    `backlog_growth` is how many more requests were in flight when the window's last request
    arrived than at the window's start: about zero (± a few) when the target keeps up, the
    growing queue when it does not.
    `fell_behind` needs both an achieved rate under 95% of the offered one and a backlog
    growth beyond the noise of a stable queue, so a short window's edge effects do not
    raise a false alarm.
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


@dataclass
class Goodput:
    slos: dict[str, float]
    good: int
    fraction: float
    requests_per_s: float | None


@dataclass
class Summary:
    """Everything `summary.json` holds; `to_json()` is its on-disk form."""

    requests: int
    in_window: int
    ok: int
    failures: dict[str, int]
    latency: dict[str, Distribution]
    failure_adjusted: dict[str, Distribution]
    throughput: Throughput | None
    goodput: Goodput | None
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    tokens_from_usage: float
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self)) | {"formulas": FORMULAS}


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def summarize(
    records: Sequence[RequestTimeline],
    window: Window | None = None,
    slos: dict[str, float] | None = None,
) -> Summary:
    """The run's summary over the requests scheduled inside `window` (all when None)."""
    chosen = [r for r in records if window is None or r.origin_ns in window]
    metrics = [request_metrics(r) for r in chosen]
    ok = [(r, m) for r, m in zip(chosen, metrics) if r.ok]
    failed = [r for r in chosen if not r.ok]

    failures: dict[str, int] = {}
    for r in failed:
        failures[str(r.outcome)] = failures.get(str(r.outcome), 0) + 1

    ok_metrics = [m for _, m in ok]
    latency = {
        "ttft": distribution(m.ttft for m in ok_metrics),
        "ttft_sched": distribution(m.ttft_sched for m in ok_metrics),
        "tpot": distribution(m.tpot for m in ok_metrics),
        "itl": distribution(v for m in ok_metrics for v in m.itl),
        "itl_request_mean": distribution(m.itl_mean for m in ok_metrics),
        "chunk_gap": distribution(v for m in ok_metrics for v in m.chunk_gaps),
        "e2e": distribution(m.e2e for m in ok_metrics),
        "e2e_sched": distribution(m.e2e_sched for m in ok_metrics),
        "lateness": distribution(m.lateness for m in metrics),
    }
    failure_adjusted = {
        name: distribution([getattr(m, name) for m in ok_metrics] + [math.inf] * len(failed))
        for name in FAILURE_ADJUSTED
    }

    good = [r for r, m in ok if meets_slos(m, slos or {})]
    throughput = _throughput(records, chosen, window) if window else None
    goodput = None
    if slos:
        good_done = sum(1 for r in good if window is None or r.done_ns in window)
        goodput = Goodput(
            slos=dict(slos),
            good=len(good),
            fraction=len(good) / len(chosen) if chosen else 0.0,
            requests_per_s=good_done / window.duration_s if window else None,
        )

    prompts = [r.prompt_tokens for r, _ in ok if r.prompt_tokens is not None]
    outputs = [m.output_tokens for _, m in ok if m.output_tokens is not None]
    from_usage = sum(1 for r, _ in ok if r.tokens_from_usage)
    summary = Summary(
        requests=len(records),
        in_window=len(chosen),
        ok=len(ok),
        failures=failures,
        latency=latency,
        failure_adjusted=failure_adjusted,
        throughput=throughput,
        goodput=goodput,
        mean_prompt_tokens=float(np.mean(prompts)) if prompts else None,
        mean_output_tokens=float(np.mean(outputs)) if outputs else None,
        tokens_from_usage=from_usage / len(ok) if ok else 0.0,
    )
    summary.warnings = _warnings(summary)
    return summary


def _throughput(
    records: Sequence[RequestTimeline], chosen: Sequence[RequestTimeline], window: Window
) -> Throughput:
    seconds = window.duration_s or math.nan
    output_tokens = 0.0
    prompt_tokens = 0
    completed = 0
    for r in records:
        if r.ok and r.done_ns in window:
            completed += 1
        if r.sent_ns in window and r.prompt_tokens:
            prompt_tokens += r.prompt_tokens
        event_total = sum(r.token_counts)
        if not event_total:
            continue
        in_window = sum(c for t, c in zip(r.token_ns, r.token_counts) if t in window)
        # Scale per-event counts to the server's usage count when they disagree.
        scale = (r.completion_tokens / event_total) if r.completion_tokens else 1.0
        output_tokens += in_window * scale

    # The offered load spans the window unless the arrivals stopped inside it (a run stopped
    # by count drains its last requests inside the window): then it ends at the last arrival.
    continued = any(r.origin_ns is not None and r.origin_ns >= window.end_ns for r in records)
    last = max((r.origin_ns for r in chosen), default=window.start_ns) + 1
    arrivals = Window(window.start_ns, window.end_ns if continued else min(window.end_ns, last))
    burst = arrivals.duration_s < BURST_SHARE * window.duration_s
    offered = None if burst else len(chosen) / arrivals.duration_s
    sent = None if burst else sum(1 for r in chosen if r.sent_ns in arrivals) / arrivals.duration_s

    spans = [(r.sent_ns, _end_ns(r)) for r in records if r.sent_ns is not None]
    busy_ns = sum(max(0, min(end, window.end_ns) - max(start, window.start_ns))
                  for start, end in spans)
    backlog = (sum(1 for s, e in spans if s <= arrivals.end_ns < e)
               - sum(1 for s, e in spans if s <= window.start_ns < e))
    concurrency = busy_ns / 1e9 / seconds
    achieved = completed / seconds
    noise = max(BACKLOG_NOISE_MIN, BACKLOG_NOISE_SIGMAS * math.sqrt(2 * max(concurrency, 1.0)))
    return Throughput(
        window_s=window.duration_s,
        offered_rate=offered,
        sent_rate=sent,
        achieved_rate=achieved,
        output_tokens_per_s=output_tokens / seconds,
        total_tokens_per_s=(output_tokens + prompt_tokens) / seconds,
        mean_concurrency=concurrency,
        backlog_growth=backlog,
        fell_behind=offered is not None and achieved < SHORTFALL * offered and backlog > noise,
    )


def _end_ns(r: RequestTimeline) -> float:
    """When a request stopped occupying the target; a request never finished never stops."""
    for t in (r.done_ns, r.last_token_ns, r.headers_ns):
        if t is not None:
            return t
    return math.inf if r.ok else r.sent_ns


def _warnings(s: Summary) -> list[str]:
    warnings = []
    failed = s.in_window - s.ok
    if s.in_window and failed:
        warnings.append(f"{failed} of {s.in_window} requests failed ({100 * failed / s.in_window:.1f}%): "
                        "see failures and the failure-adjusted percentiles")
    t = s.throughput
    if t and t.offered_rate:
        if t.sent_rate < SHORTFALL * t.offered_rate:
            warnings.append(f"the client sent {t.sent_rate:.2f} req/s of {t.offered_rate:.2f} offered: "
                            "it could not keep the schedule")
        if t.fell_behind:
            warnings.append(f"achieved {t.achieved_rate:.2f} req/s of {t.offered_rate:.2f} offered "
                            f"({100 * t.achieved_rate / t.offered_rate:.0f}%), {t.backlog_growth} "
                            "more requests in flight at the last arrival than at the start: the target "
                            "fell behind")
    if s.ok and s.tokens_from_usage < 1.0:
        warnings.append(f"{100 * (1 - s.tokens_from_usage):.0f}% of requests had no server usage: "
                        "their token counts are the client's own count")
    return warnings
