"""Run-to-run noise: how much a compared statistic moves when nothing but time changes. A
change smaller than the noise is no change, however significant its bootstrap interval
(which knows only the sampling error of one run, not a host that drifts between runs).

From the best evidence at hand, in this order:

* `rounds`: several runs of each setting (an A/B's rounds): the half-width of a two-sample t
  interval on the rounds' values of each statistic (their pooled variance within the sides),
  at 99% for the dozens of statistics compared at once;
* `repeat`: a repeat of the baseline (an A/A pair, `compare --noise RUN`): each statistic's
  difference between the two;
* `blocks`: within each run, its measured requests cut by time into `BLOCKS` blocks of equal
  count: half the spread of each statistic over the blocks (a run that drifts inside itself
  drifts between runs too; the lower bound of the noise, said to be so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from latlab.analysis.run_analysis import RunAnalysis
from latlab.analysis.significance import statistics
from latlab.records.catalog import CATALOG, metrics
from latlab.records.timeline import NS_PER_MS

STATS = ("mean", "p50", "p90", "p99")
ROUNDS_CONFIDENCE = 0.99
BLOCKS = 4
MAX_SAMPLE = 500_000  # pooled per-token samples beyond this are thinned evenly (big runs)
LATENCY = metrics(compared=True, unit="ms")


@dataclass(frozen=True)
class Noise:
    """Each statistic's noise band (`key` as compare names it → a half-width in its unit),
    and how it was estimated."""

    band: dict[str, float]
    source: str

    def of(self, key: str) -> float | None:
        return self.band.get(key)


def values(a: RunAnalysis, rows: np.ndarray | None = None) -> dict[str, float]:
    """Every compared statistic of `a` over the requests `rows` (a mask; default: its
    measured ones), keyed as compare keys them; rates over the rows' own time span."""
    rows = a.inside if rows is None else rows
    ok = rows & a.requests.parts.decomposed
    m, t = a.requests.metrics, a.table
    out: dict[str, float] = {}
    for metric in LATENCY:
        sample = (m.itl.select(ok) if not CATALOG[metric].per_request
                  else getattr(m, metric)[ok])
        sample = sample[~np.isnan(sample)][::len(sample) // MAX_SAMPLE + 1]
        if len(sample):
            out |= {f"{s}_{metric}": float(v) for s, v in statistics(sample, STATS).items()}
    origins = t.origin_ns[rows]
    span_s = float(origins.max() - origins.min()) / (1000 * NS_PER_MS) if len(origins) > 1 else 0
    if span_s > 0:
        out["achieved_rate"] = float(ok.sum()) / span_s
        out["output_tokens_per_s"] = float(np.nansum(m.output_tokens[ok])) / span_s
    judged = int(rows.sum())
    if judged:
        out["error_rate"] = 100.0 * (judged - int((rows & t.ok).sum())) / judged
    return out


def _spread(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = set.intersection(*(set(r) for r in runs)) if runs else set()
    return {k: max(r[k] for r in runs) - min(r[k] for r in runs) for k in keys}


def from_rounds(sides: Sequence[Sequence[RunAnalysis]]) -> Noise | None:
    """The t interval of the difference of the sides' round means, per statistic (the
    within-side variance pooled); None without two rounds of a side."""
    from scipy.stats import t as student

    per_side = [[values(a) for a in rounds] for rounds in sides]
    counted = [runs for runs in per_side if len(runs) >= 2]
    if not counted:
        return None
    band = {}
    for key in set.intersection(*(set(r) for runs in per_side for r in runs)):
        squares = sum(float(np.sum((v - np.mean(v)) ** 2))
                      for v in ([r[key] for r in runs] for runs in counted))
        df = sum(len(runs) - 1 for runs in counted)
        scale = np.sqrt(sum(1 / len(runs) for runs in per_side))
        band[key] = float(student.ppf((1 + ROUNDS_CONFIDENCE) / 2, df)
                          * np.sqrt(squares / df) * scale)
    n = ", ".join(str(len(runs)) for runs in per_side)
    return Noise(band, f"the sides' rounds ({n}): a {100 * ROUNDS_CONFIDENCE:g}% t interval "
                       "on their values")


def from_repeat(baseline: RunAnalysis, repeat: RunAnalysis) -> Noise:
    """The difference between the baseline and a repeat of it (an A/A pair)."""
    return Noise(_spread([values(baseline), values(repeat)]),
                 f"the baseline against its repeat {repeat.run.path.name}")


def from_blocks(runs: Sequence[RunAnalysis]) -> Noise:
    """Half the spread over each run's time blocks, the larger run's."""
    band: dict[str, float] = {}
    for a in runs:
        measured = np.flatnonzero(a.inside)
        if len(measured) < 2 * BLOCKS:
            continue
        order = measured[np.argsort(a.table.origin_ns[measured], kind="stable")]
        blocks = []
        for part in np.array_split(order, BLOCKS):
            rows = np.zeros(len(a.table), bool)
            rows[part] = True
            blocks.append(values(a, rows))
        for k, v in _spread(blocks).items():
            band[k] = max(band.get(k, 0.0), v / 2)
    return Noise(band, f"within each run ({BLOCKS} time blocks; a lower bound: give a repeat "
                       "of the baseline with --noise for run-to-run noise)")
