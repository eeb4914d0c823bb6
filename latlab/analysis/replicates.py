"""Replicates: the same statistic measured again and again, so a comparison sees how much it
moves when nothing but time changes (`verdicts.py` turns them into intervals).

From the best evidence at hand:

* `rounds`: each side's rounds (an A/B's), one value of each statistic a round; the drift
  between rounds (a busy host, a cache warming) is in their spread;
* `blocks`: each run's measured requests cut by time into `BLOCKS` blocks of equal count,
  one value a block; with a repeat of the first run (`compare --noise RUN`) its blocks join
  the first run's, so the spread sees the drift between runs too. Without one, two single
  runs cannot see that drift: their verdicts are `strict`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from latlab.analysis.run_analysis import RunAnalysis
from latlab.analysis.significance import statistics
from latlab.analysis.verdicts import RatioInterval, paired_interval, ratio_interval
from latlab.metrics.slo import meets_slos
from latlab.records.catalog import CATALOG, metrics
from latlab.records.timeline import NS_PER_MS
from latlab.records.verdict import key_of, metric_of, stat_of

STATS = ("mean", "p50", "p90", "p99")
BLOCKS = 4
# A percentile is judged only where every replicate has this many samples above it. With
# fewer, a round's p99 is its largest sample or two: it jumps with whether the round caught
# one of the host's stalls, and three rounds that did against three that did not look like a
# change far beyond the t interval's α (a caching server's A/A, 12 requests a round: p99
# TPOT 17 against 8 ms, t = 14). Five: the rule of thumb for counts to be near normal.
MIN_TAIL = 5
MAX_SAMPLE = 500_000  # pooled per-token samples beyond this are thinned evenly (big runs)
LATENCY = metrics(compared=True, unit="ms")


@dataclass(frozen=True)
class Replicates:
    """Each side's replicates (a statistic's key as compare names it → its value in that
    replicate), what they are, and whether they can see the drift between runs."""

    a: list[dict[str, float]]
    b: list[dict[str, float]]
    source: str
    unit_name: str  # "rounds" or "blocks"
    strict: bool  # single runs: the drift between runs is unseen

    def of(self, key: str) -> tuple[list[float], list[float]]:
        """`key`'s values on each side, where a replicate has one."""
        return ([r[key] for r in self.a if key in r], [r[key] for r in self.b if key in r])

    def interval(self, key: str, confidence: float,
                 paired: bool = False) -> RatioInterval | None:
        """`key`'s interval of B / A − 1 at `confidence`: pair by pair (`paired`: an A/B's
        rounds) where every pair has a positive value, else side against side."""
        if paired:
            found = paired_interval(*self.pairs(key), confidence)
            if found is not None:
                return found
        return ratio_interval(*self.of(key), confidence)

    def thin(self, key: str) -> str | None:
        """Why `key`, a percentile, is not judged: a replicate has fewer than `MIN_TAIL`
        samples above it; None where every one has enough, or `key` is no percentile."""
        stat, metric = stat_of(key), metric_of(key)
        if stat is None or not stat.startswith("p"):
            return None
        share = (100 - int(stat[1:])) / 100  # of the samples above the percentile
        counts = [r[sample_count(metric)] for r in self.a + self.b if sample_count(metric) in r]
        if not counts or min(counts) * share >= MIN_TAIL:
            return None
        unit = self.unit_name.removesuffix("s")
        return (f"too few samples a {unit} for a {stat}: as few as {min(counts)}, and "
                f"{math.ceil(MIN_TAIL / share)} a {unit} would put {MIN_TAIL} above it")

    def pairs(self, key: str) -> tuple[list[float], list[float]]:
        """`key`'s values in the rounds both sides have it, A's i-th beside B's i-th (an
        A/B's pair ran back to back)."""
        both = [(a[key], b[key]) for a, b in zip(self.a, self.b) if key in a and key in b]
        return [a for a, _ in both], [b for _, b in both]


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
        sample = sample[~np.isnan(sample)]
        count, sample = len(sample), sample[::len(sample) // MAX_SAMPLE + 1]
        if count:
            out |= {key_of(metric, s): float(v) for s, v in statistics(sample, STATS).items()}
            out[sample_count(metric)] = count
    origins = t.origin_ns[rows]
    span_s = float(origins.max() - origins.min()) / (1000 * NS_PER_MS) if len(origins) > 1 else 0
    if span_s > 0:
        out["achieved_rate"] = float(ok.sum()) / span_s
        out["output_tokens_per_s"] = float(np.nansum(m.output_tokens[ok])) / span_s
        if a.summary.goodput is not None:
            met = ok & meets_slos(m, a.summary.goodput.slos)
            out["goodput"] = float(met.sum()) / span_s
    return out


def sample_count(metric: str) -> str:
    """The key under which a replicate keeps how many samples of `metric` it holds."""
    return f"samples_{metric}"


def from_rounds(a: Sequence[RunAnalysis], b: Sequence[RunAnalysis],
                rounds: int | None = None) -> Replicates:
    """Each side's first `rounds` rounds (default: all), one replicate a round; a round's
    rates are its run's, over its measurement window."""
    def side(runs: Sequence[RunAnalysis]) -> list[dict[str, float]]:
        return [values(r) | _rates(r) for r in runs[:rounds]]

    found_a, found_b = side(a), side(b)
    return Replicates(found_a, found_b, f"the sides' rounds ({len(found_a)} and "
                      f"{len(found_b)}), one value of each statistic a round", "rounds",
                      strict=False)


def from_blocks(a: RunAnalysis, b: RunAnalysis, repeat: RunAnalysis | None = None) -> Replicates:
    """Each run's time blocks; a repeat of A adds its blocks to A's."""
    a_blocks = _blocks(a) + (_blocks(repeat) if repeat is not None else [])
    if repeat is not None:
        source = (f"{BLOCKS} time blocks of each run, A's repeat {repeat.run.path.name} "
                  "among A's: the spread sees the drift between runs")
    else:
        source = (f"{BLOCKS} time blocks of each run: two single runs cannot see the drift "
                  "between runs, so only changes clearly past the minimum effect are called "
                  "(give a repeat with --noise, or use latlab ab)")
    return Replicates(a_blocks, _blocks(b), source, "blocks", strict=repeat is None)


def _blocks(a: RunAnalysis) -> list[dict[str, float]]:
    measured = np.flatnonzero(a.inside)
    if len(measured) < 2 * BLOCKS:
        return []
    order = measured[np.argsort(a.table.origin_ns[measured], kind="stable")]
    blocks = []
    for part in np.array_split(order, BLOCKS):
        rows = np.zeros(len(a.table), bool)
        rows[part] = True
        blocks.append(values(a, rows))
    return blocks


def _rates(a: RunAnalysis) -> dict[str, float]:
    """The run's own rates over its window (and goodput, where it was judged)."""
    out = {}
    if a.summary.throughput is not None:
        for key in ("achieved_rate", "output_tokens_per_s"):
            value = getattr(a.summary.throughput, key)
            if value is not None:
                out[key] = value
    if a.summary.goodput is not None and a.summary.goodput.requests_per_s is not None:
        out["goodput"] = a.summary.goodput.requests_per_s
    return out
