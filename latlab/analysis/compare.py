"""Compare runs: every summary metric's change, whether it is real, and where it came from.

Each statistic is judged on replicates (`replicates.py`: an A/B's rounds, or each run's time
blocks) by `verdicts.py`: better, worse, same (inside the minimum effect, with confidence) or
can't tell. A latency change is attributed to components: the mean component budgets of the
requests *at* that statistic in each run (all requests for the mean, those at or above the
percentile for p90/p99, the p40–p60 band for the median), so "p99 TTFT −38%" reads
"queue −41 ms, prefill unchanged". A component one side did not measure is not attributed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from latlab.analysis.budget import Budget, budget
from latlab.analysis.delivery import bursts
from latlab.analysis.replicates import Replicates, from_blocks
from latlab.analysis.run_analysis import RunAnalysis
from latlab.analysis.significance import fisher_test, statistics
from latlab.analysis.unlike import buffered, conditions, workload_differences
from latlab.analysis.verdicts import (
    FAMILY_ALPHA,
    LookShare,
    RatioInterval,
    alpha,
    judge_look,
)
from latlab.records.catalog import CATALOG, metrics
from latlab.records.summary import RunSummary
from latlab.records.verdict import (
    DEFAULT_MIN_EFFECT,
    HEADLINE,
    Verdict,
    VerdictConfig,
    key_of,
    metric_of,
)

LATENCY_METRICS = {name: CATALOG[name].label for name in metrics(compared=True, unit="ms")}
STATS = ("mean", "p50", "p90", "p99")
PER_TOKEN = metrics(compared=True, unit="ms", per_request=False)
NOT_MEASURED = "not measured on both sides"
WHOLE = LookShare()  # a comparison looked at once: its whole α
ERROR_RATE_SAME = 1.0  # percentage points: error rates this close, and not significant, match
RATES = {name: (CATALOG[name].label, CATALOG[name].unit)
         for name in metrics(compared=True) if not CATALOG[name].latency}
ATTRIBUTED = {
    "ttft": ("network", "gateway_intake", "preprocess", "queue", "prefill", "ttft_unsplit"),
    "ttft_sched": ("client_wait", "connect", "tls", "network", "gateway_intake", "preprocess",
                   "queue", "prefill", "ttft_unsplit"),
    "e2e": ("network", "gateway_intake", "preprocess", "queue", "prefill", "ttft_unsplit",
            "decode", "postprocess", "gateway_tail", "unattributed"),
    "e2e_sched": ("client_wait", "connect", "tls", "network", "gateway_intake", "preprocess",
                  "queue", "prefill", "ttft_unsplit", "decode", "postprocess", "gateway_tail",
                  "unattributed"),
}



@dataclass
class Change:
    key: str
    label: str
    unit: str
    a: float | None
    b: float | None
    lower_is_better: bool = True
    interval: RatioInterval | None = None  # of B / A − 1, the verdict's (from the replicates)
    verdict: Verdict = "can't tell"
    why: str | None = None  # for same and can't tell
    judged: bool = True  # False: not judged, whatever more rounds show (`Replicates.thin`)
    attribution: dict[str, float] = field(default_factory=dict)
    min_effect: float = DEFAULT_MIN_EFFECT  # the smallest relative change worth a verdict

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def relative(self) -> float | None:
        return self.delta / self.a if self.delta is not None and self.a else None

    @property
    def decided(self) -> bool:
        return self.verdict != "can't tell"


@dataclass
class Comparison:
    a: RunAnalysis
    b: RunAnalysis
    changes: list[Change]
    budgets: dict[str, tuple[Budget | None, Budget | None]]
    workload_differences: list[str]
    evidence: str = ""  # what the verdicts rest on
    conditions: list[str] = field(default_factory=list)  # the sides ran unlike: say so

    def change(self, key: str) -> Change | None:
        return next((c for c in self.changes if c.key == key), None)


def metric_values(a: RunAnalysis, metric: str) -> np.ndarray:
    """The samples of a per-request `metric` over the run's measured successful requests
    (ITL, per token, goes by request: `_groups`)."""
    values = getattr(a.requests.metrics, metric)[a.ok]
    return values[~np.isnan(values)]


def rows_at(a: RunAnalysis, metric: str, stat: str) -> np.ndarray:
    """The requests that make up a statistic (a mask): all (mean), the tail (p90, p99), the
    middle (p50)."""
    values = getattr(a.requests.metrics, metric)
    keyed = a.ok & ~np.isnan(values)
    if stat == "mean" or not keyed.any():
        return keyed
    q = float(stat[1:])
    low, high = (np.percentile(values[keyed], q), np.inf) if q >= 90 else np.percentile(
        values[keyed], [max(q - 10, 0), min(q + 10, 100)])
    return keyed & (values >= low) & (values <= high)


def attribute(a: RunAnalysis, b: RunAnalysis, metric: str, stat: str) -> dict[str, float]:
    """Per component measured on both sides, the change (ms) of its mean over the requests
    at the statistic."""
    ba = budget(a.requests.parts, rows_at(a, metric, stat))
    bb = budget(b.requests.parts, rows_at(b, metric, stat))
    if ba is None or bb is None:
        return {}
    return {c: bb.components[c] - ba.components[c] for c in ATTRIBUTED[metric]
            if (ba.components[c] or bb.components[c])
            and ba.coverage[c] > 0 and bb.coverage[c] > 0}


class CompareError(ValueError):
    """Runs that cannot be compared."""


def compare(a: RunAnalysis, b: RunAnalysis, replicates: Replicates | None = None,
            verdicts: VerdictConfig | None = None, share: LookShare = WHOLE,
            decide_on: Sequence[str] = HEADLINE, paired: bool = False) -> Comparison:
    """B against A: each statistic's values (A's and B's pooled requests), its interval and
    verdict from `replicates` (default: each run's time blocks; `paired`: an A/B's rounds,
    pair by pair), tested at `share` of its α (a sequential A/B's look spends part); the keys
    `decide_on` share one α (`alpha`)."""
    for analysis in (a, b):
        if not analysis.ok.any():
            raise CompareError(f"{analysis.run.path}: no successful request in its window "
                               "to compare")
    replicates = replicates if replicates is not None else from_blocks(a, b)
    verdicts = verdicts or VerdictConfig()
    changes: list[Change] = []
    for metric, label in LATENCY_METRICS.items():
        va, vb = _samples(a, metric), _samples(b, metric)
        # every statistic in one pass over each side (a big run's ITL has 10⁸ gaps)
        sa = statistics(va, STATS) if len(va) else {}
        sb = statistics(vb, STATS) if len(vb) else {}
        for stat in STATS:
            change = Change(key_of(metric, stat), f"{label} {stat}", "ms",
                            float(sa[stat]) if sa else None, float(sb[stat]) if sb else None)
            if metric in ATTRIBUTED and len(va) and len(vb):
                change.attribution = attribute(a, b, metric, stat)
            changes.append(change)
    changes += _rate_changes(a.summary, b.summary)
    keys = [c.key for c in changes]
    burst = (bursts(a), bursts(b))  # each side's streams, if they came in bursts
    in_bursts = buffered(burst)
    for change in changes:
        change.min_effect = verdicts.effect(change.key)
        if in_bursts and CATALOG[metric_of(change.key)].gaps:
            change.a = change.b = None
            change.why = f"{in_bursts}: the gaps between tokens are the buffer's"
        if change.delta is None:
            change.why = change.why or NOT_MEASURED
            continue
        change.why = replicates.thin(change.key)
        if change.why is not None:  # more replicates of the same size would not judge it
            change.judged = False
            continue
        judged = judge_look(partial(replicates.interval, change.key, paired=paired),
                            alpha(change.key, keys, decide_on), share, change.min_effect,
                            change.lower_is_better, replicates.strict, replicates.unit_name)
        change.interval, change.verdict, change.why = judged.interval, judged.verdict, judged.why
    changes.append(_error_rate(a.summary, b.summary, FAMILY_ALPHA * share.change))
    budgets = {"mean": (a.mean, b.mean),
               "p99 tail": (_tail(a), _tail(b))}
    return Comparison(a, b, changes, budgets, workload_differences(a.config, b.config),
                      replicates.source, conditions(a, b, burst))


def _samples(a: RunAnalysis, metric: str) -> np.ndarray:
    """The samples of `metric` over the measured successful requests (per token: pooled)."""
    if metric in PER_TOKEN:
        return getattr(a.requests.metrics, metric).select(a.ok)
    return metric_values(a, metric)


def _tail(a: RunAnalysis) -> Budget | None:
    return budget(a.requests.parts, rows_at(a, "e2e_sched", "p99"))


def _rate(s: RunSummary, key: str) -> float | None:
    if key == "goodput":
        return s.goodput.requests_per_s if s.goodput else None
    return getattr(s.throughput, key) if s.throughput else None


def _rate_changes(a: RunSummary, b: RunSummary) -> list[Change]:
    """Throughput changes; goodput only where both runs were judged by the same SLOs."""
    changes = []
    same_slos = a.goodput is not None and b.goodput is not None \
        and a.goodput.slos == b.goodput.slos
    for key, (label, unit) in RATES.items():
        if key == "goodput" and not same_slos:
            continue
        va, vb = _rate(a, key), _rate(b, key)
        if va is not None or vb is not None:
            changes.append(Change(key, label, unit, va, vb, lower_is_better=False))
    return changes


def _error_rate(a: RunSummary, b: RunSummary, level: float) -> Change:
    """Failed share of the window's requests (%), judged by Fisher's exact test at `level`
    (a sequential A/B's look spends its share of α, as the other keys' looks do): a
    significant difference is a change; rates within `ERROR_RATE_SAME` points and not
    significant are the same."""
    counts = [(s.in_window, s.ok) for s in (a, b)]
    rates = [100 * (n - ok) / n if n else None for n, ok in counts]
    change = Change("error_rate", "error rate", "%", rates[0], rates[1])
    if not all(n for n, _ in counts):
        change.why = NOT_MEASURED
        return change
    significant = fisher_test([[n - ok, ok] for n, ok in counts]) < level
    if significant:
        change.verdict = "worse" if rates[1] > rates[0] else "better"
    elif abs(rates[1] - rates[0]) <= ERROR_RATE_SAME:
        change.verdict, change.why = "same", f"within {ERROR_RATE_SAME:g} point, not significant"
    else:
        change.why = "not significant, but too few requests to call it the same"
    return change
