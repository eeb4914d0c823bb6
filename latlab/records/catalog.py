"""The metric catalog: every metric latlab reports, declared once with its label, unit,
formula and what it takes part in. Every table, chart, export, SLO parser and document reads
its metrics from here (`metrics(...)` selects them).

A latency is a distribution over requests (ms, lower is better); a rate is one number over
the measurement window (per second, higher is better). A variant (`parent`) is shown under
the metric it varies, its label continuing the parent's ("TTFT" → "TTFT from schedule").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    formula: str
    unit: Literal["ms", "req/s", "tok/s"] = "ms"
    parent: str | None = None
    per_request: bool = False  # one value per request (`metrics.request`), else per token
    summary: bool = False  # a row of the latency summary (summary.json → latency)
    slo: bool = False  # may be an SLO (`--slo NAME=LIMIT`)
    failure_adjusted: bool = False  # also as a percentile counting failures as infinite
    compared: bool = False  # compared run against run (`latlab compare`, `ab`)
    sizing: bool = False  # a goal `--replicas-for` sizes a fleet for
    curve: bool = False  # drawn against the load (sweeps, predictions checked)
    chart: str | None = None  # the distribution chart that shows it (its SLO line too)
    # timed by the gaps between token events: a proxy that buffers the stream times them
    # instead of the server (`analysis.delivery`)
    gaps: bool = False
    # the smallest relative change a comparison calls better or worse, where it is not the
    # default (`records.verdict`); kept under a --min-effect PCT%, changed by naming it
    min_effect: float | None = None

    @property
    def latency(self) -> bool:
        return self.unit == "ms"

    @property
    def row(self) -> str:
        """The summary table's label: a variant indented under its parent."""
        if self.parent is None:
            return self.label
        return "  " + self.label.removeprefix(CATALOG[self.parent].label).strip()


CATALOG: dict[str, Metric] = {m.name: m for m in (
    Metric("ttft", "TTFT", "first_token − sent: first SSE event carrying ≥1 generated token",
           per_request=True, summary=True, slo=True, failure_adjusted=True, compared=True,
           sizing=True, curve=True, chart="ttft"),
    Metric("ttft_sched", "TTFT from schedule",
           "first_token − scheduled: TTFT including client-side waiting", parent="ttft",
           per_request=True, summary=True, slo=True, failure_adjusted=True, compared=True,
           sizing=True, chart="ttft"),
    Metric("tpot", "TPOT", "(last_token − first_token) / (output_tokens − 1), output_tokens "
           "≥ 2 (usage count), not when one event carried them all (a non-streamed answer)",
           per_request=True, summary=True, slo=True, compared=True, sizing=True, curve=True,
           chart="tpot", gaps=True),
    Metric("itl", "ITL", "per token: the gap before an event carrying k tokens gives k samples "
           "of gap/k; pooled", summary=True, slo=True, compared=True, chart="itl", gaps=True),
    Metric("itl_request_mean", "ITL per-request mean", "mean of one request's ITL samples, one "
           "value per request", parent="itl", summary=True, gaps=True),
    # one request's longest pause is the longest prefill that overlapped it: rounds of one
    # unchanged server differ by 10–30%, so a smaller change is not worth a verdict
    Metric("itl_max", "ITL per-request max", "largest of one request's ITL samples: the "
           "longest pause its reader saw between tokens, one value per request",
           parent="itl", per_request=True, summary=True, compared=True, min_effect=0.2,
           gaps=True),
    Metric("chunk_gap", "inter-chunk gap", "raw gap between consecutive token-carrying SSE "
           "events (inter-chunk latency)", summary=True, gaps=True),
    Metric("e2e", "E2E", "done − sent: stream closed after [DONE]", per_request=True,
           summary=True, slo=True, failure_adjusted=True, compared=True, sizing=True,
           curve=True, chart="e2e"),
    Metric("e2e_sched", "E2E from schedule", "done − scheduled: E2E including client-side "
           "waiting", parent="e2e", per_request=True, summary=True, slo=True,
           failure_adjusted=True, compared=True, sizing=True, chart="e2e"),
    Metric("lateness", "lateness", "sent − scheduled: how late the client sent against the "
           "schedule", per_request=True, summary=True),
    Metric("output_tokens_per_s", "output tokens/s", "output tokens of token events inside the "
           "window / window length", unit="tok/s", compared=True),
    Metric("achieved_rate", "achieved rate", "requests that ended inside the window / window "
           "length", unit="req/s", compared=True),
    Metric("goodput", "goodput", "requests that succeeded and met every SLO, completed in the "
           "window / window length", unit="req/s", compared=True),
)}

# Terms the metrics' definitions use.
DEFINITIONS = {
    "failure_adjusted": "percentile with every failed request counted as infinitely slow",
}


def metrics(**flags: bool) -> tuple[str, ...]:
    """The names of the metrics with every flag given (`metrics(slo=True)`), in catalog
    order."""
    return tuple(m.name for m in CATALOG.values()
                 if all(getattr(m, flag) == wanted for flag, wanted in flags.items()))


def statistic_label(metric: str, stat: str) -> str:
    """A statistic of a metric as prose says it: "TTFT p50", "mean ITL per-request max"."""
    label = CATALOG[metric].label if metric in CATALOG else metric
    return f"mean {label}" if stat == "mean" else f"{label} {stat}"


def charts() -> tuple[str, ...]:
    """The distribution charts, in catalog order (each named after the metric it shows)."""
    return tuple(dict.fromkeys(m.chart for m in CATALOG.values() if m.chart))


def formulas() -> dict[str, str]:
    """Every metric's formula and the terms they use: what `--explain`, summary.json and
    the reference page quote."""
    return {m.name: m.formula for m in CATALOG.values()} | DEFINITIONS
