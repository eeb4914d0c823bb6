"""Compare runs: every summary metric's change, whether it is real, and where it came from.

A latency change carries the bootstrap CI of `b − a` (`significance.py`) and is attributed
to components: the mean component budgets of the requests *at* that statistic in each run
(all requests for the mean, those at or above the percentile for p90/p99, the p40–p60 band
for the median), so "p99 TTFT −38%" reads "queue −41 ms, prefill unchanged".

A change is better or worse only when it is significant (its interval excludes zero), larger
than the run-to-run noise (`noise.py`) and at least the minimum practical effect (2% unless
set per metric); otherwise it is the same, and `why_same` says which test it failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latlab.analysis.run_analysis import RunAnalysis
from latlab.analysis.budget import Budget, budget
from latlab.analysis.noise import Noise, from_blocks
from latlab.analysis.significance import (bootstrap_difference, cluster_bootstrap_difference,
                                          fisher_test, statistic)
from latlab.metrics.stats import reliable
from latlab.records.catalog import CATALOG, metrics
from latlab.records.config import RunConfig
from latlab.records.summary import RunSummary
from latlab.records.verdict import DEFAULT_MIN_EFFECT, VerdictConfig

LATENCY_METRICS = {name: CATALOG[name].label for name in metrics(compared=True, unit="ms")}
STATS = ("mean", "p50", "p90", "p99")
PER_TOKEN = metrics(compared=True, unit="ms", per_request=False)
UNTESTED_NOISE = 0.05  # a change without a CI must exceed this share to be called a change
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
# Workload settings that may differ between comparable runs: where the load goes, not what.
NOT_WORKLOAD = {"url", "model", "api_key", "serve_args", "out", "name", "tags", "workers",
                "timeout_s", "drain_s", "slos", "seed", "tokenizer", "keepalive", "server_kind",
                "otlp_port", "span_wait_s", "scrape_interval_s", "prompt_salt",
                "context_tokens", "server_url", "ca_cert", "insecure"}


@dataclass
class Change:
    key: str
    label: str
    unit: str
    a: float | None
    b: float | None
    lower_is_better: bool = True
    ci: tuple[float, float] | None = None
    significant: bool | None = None
    attribution: dict[str, float] = field(default_factory=dict)
    noise: float | None = None  # the run-to-run noise band (a half-width, in `unit`)
    min_effect: float = DEFAULT_MIN_EFFECT  # the smallest relative change worth a verdict
    withheld: str | None = None  # why no verdict can be given (too few samples, a busy host)

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def relative(self) -> float | None:
        return self.delta / self.a if self.delta is not None and self.a else None

    @property
    def why_same(self) -> str | None:
        """Why the change is no change (None when it is one)."""
        if self.delta is None or self.delta == 0:
            return "no difference"
        if self.withheld is not None:
            return self.withheld
        if self.significant is False:
            return "not significant"
        relative = abs(self.relative) if self.relative is not None else None
        if relative is not None and relative < self.min_effect:
            return f"below the {100 * self.min_effect:g}% minimum effect"
        if self.noise is not None and abs(self.delta) <= self.noise:
            return f"within the run-to-run noise (±{self.noise:.3g} {self.unit})"
        if self.significant is None and self.noise is None and (relative or 0) < UNTESTED_NOISE:
            return f"untested and below {100 * UNTESTED_NOISE:g}%"
        return None

    @property
    def verdict(self) -> str:
        """better or worse when significant, beyond the noise and the minimum effect; else
        same."""
        if self.why_same is not None:
            return "same"
        better = (self.delta < 0) == self.lower_is_better
        return "better" if better else "worse"


@dataclass
class Comparison:
    a: RunAnalysis
    b: RunAnalysis
    changes: list[Change]
    budgets: dict[str, tuple[Budget | None, Budget | None]]
    workload_differences: list[str]
    noise_source: str = ""
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
    """Per component, the change (ms) of its mean over the requests at the statistic."""
    ba = budget(a.requests.parts, rows_at(a, metric, stat))
    bb = budget(b.requests.parts, rows_at(b, metric, stat))
    if ba is None or bb is None:
        return {}
    return {c: bb.components[c] - ba.components[c] for c in ATTRIBUTED[metric]
            if ba.components[c] or bb.components[c]}


class CompareError(ValueError):
    """Runs that cannot be compared."""


def compare(a: RunAnalysis, b: RunAnalysis, seed: int = 0, noise: Noise | None = None,
            verdicts: VerdictConfig | None = None) -> Comparison:
    """B against A; `noise` (default: each run's own drift, `noise.from_blocks`) and
    `verdicts` (the minimum effects) decide what is a change."""
    for analysis in (a, b):
        if not analysis.ok.any():
            raise CompareError(f"{analysis.run.path}: no successful request in its window "
                               "to compare")
    changes: list[Change] = []
    for metric, label in LATENCY_METRICS.items():
        if metric in PER_TOKEN and _has_samples(a, metric) and _has_samples(b, metric):
            # a request's gaps are resampled together, in place (a big run has 10⁸)
            diffs = cluster_bootstrap_difference(
                getattr(a.requests.metrics, metric), getattr(b.requests.metrics, metric),
                STATS, seed=seed, rows=(a.ok, b.ok))
        else:
            va, vb = _samples(a, metric), _samples(b, metric)
            if len(va) == 0 or len(vb) == 0:
                changes += [Change(f"{s}_{metric}", f"{label} {s}", "ms",
                                   float(statistic(va, s)) if len(va) else None,
                                   float(statistic(vb, s)) if len(vb) else None)
                            for s in STATS]
                continue
            diffs = bootstrap_difference(va, vb, STATS, seed=seed)
        for stat, diff in diffs.items():
            change = Change(f"{stat}_{metric}", f"{label} {stat}", "ms", diff.a, diff.b,
                            ci=(diff.ci_low, diff.ci_high), significant=diff.significant)
            if stat != "mean" and not all(reliable(len(v), float(stat[1:])) for v in (va, vb)):
                change.withheld = f"too few samples beyond {stat} to tell"
            if metric in ATTRIBUTED:
                change.attribution = attribute(a, b, metric, stat)
            changes.append(change)
    changes += _rate_changes(a.summary, b.summary)
    changes.append(_error_rate(a.summary, b.summary))
    noise = noise if noise is not None else from_blocks([a, b])
    verdicts = verdicts or VerdictConfig()
    unlike_hosts = host_differs(a, b)
    for change in changes:
        change.noise, change.min_effect = noise.of(change.key), verdicts.effect(change.key)
        if unlike_hosts and change.key != "error_rate":
            change.withheld = change.withheld or "the host's other work differed between the sides"
    budgets = {"mean": (a.mean, b.mean),
               "p99 tail": (_tail(a), _tail(b))}
    return Comparison(a, b, changes, budgets, workload_differences(a.config, b.config),
                      noise.source, conditions(a, b) + unlike_hosts)


def _has_samples(a: RunAnalysis, metric: str) -> bool:
    """Whether a per-token `metric` has samples among the measured successful requests."""
    return bool(getattr(a.requests.metrics, metric).lengths[a.ok].any())


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


def _error_rate(a: RunSummary, b: RunSummary) -> Change:
    """Failed share of the window's requests (%), with Fisher's exact test for significance."""
    counts = [(s.in_window, s.ok) for s in (a, b)]
    rates = [100 * (n - ok) / n if n else None for n, ok in counts]
    change = Change("error_rate", "error rate", "%", rates[0], rates[1])
    if all(n for n, _ in counts):
        table = [[n - ok, ok] for n, ok in counts]
        change.significant = fisher_test(table) < 0.05
    return change


def workload_differences(a: RunConfig, b: RunConfig) -> list[str]:
    """The workload settings (what was sent, how, for how long) that differ between runs."""
    flat_a, flat_b = (_flatten(c.bench.model_dump(mode="json") if c.bench else {})
                      for c in (a, b))
    differences = []
    for key in sorted(flat_a.keys() | flat_b.keys()):
        if NOT_WORKLOAD.intersection(key.split(".")):
            continue
        if flat_a.get(key) != flat_b.get(key):
            differences.append(f"{key}: {flat_a.get(key)!r} vs {flat_b.get(key)!r}")
    return differences


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


CACHE_DIFFERENCE = 0.05  # of prompt tokens: sides whose caches served more differently
HOST_DIFFERENCE = 0.5  # cores of other work


def conditions(a: RunAnalysis, b: RunAnalysis) -> list[str]:
    """How the two sides ran unlike each other beyond their settings: the server's prefix
    cache serving different shares of their prompts; one side through a gateway the other
    went without (or through another)."""
    out = []
    ca, cb = a.summary.cache, b.summary.cache
    if ca is not None and cb is not None and abs(ca.share - cb.share) >= CACHE_DIFFERENCE:
        out.append(f"the prefix cache served {100 * ca.share:.0f}% of A's prompt tokens and "
                   f"{100 * cb.share:.0f}% of B's: a TTFT change may be the cache's")
    through = [g.name if g is not None else "no gateway"
               for g in (a.config.target.gateway, b.config.target.gateway)]
    if through[0] != through[1]:
        out.append(f"A went through {through[0]}, B through {through[1]}: the gateway's hop "
                   "is part of the change")
    return out


def host_differs(a: RunAnalysis, b: RunAnalysis) -> list[str]:
    """The sides ran with different amounts of other work on the load generator's host: no
    timing of theirs can be compared (verdicts are withheld; error rates still count)."""
    ha = a.summary.client.host if a.summary.client else None
    hb = b.summary.client.host if b.summary.client else None
    if ha is None or hb is None or abs(ha.other.mean - hb.other.mean) < HOST_DIFFERENCE:
        return []
    return [f"other work used {ha.other.mean:.1f} cores of the host during A and "
            f"{hb.other.mean:.1f} during B: timing verdicts withheld (rerun on a quiet host)"]
