"""A/B: the rounds of each side pooled into one analysis, compared with `compare` at each look
(`Sequential`), and the server counters that explain the change (prefix-cache hits, accepted
drafts, preemptions).

Each round is a bench run; a side's pooled analysis holds the measured requests of all its
rounds (each decomposed against its own run's network), its rates are the rounds' rates
weighted by their windows, and its goodput is judged over the pooled requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from latlab.analysis.analyze import assemble, judge_requests
from latlab.analysis.compare import NOT_MEASURED, Change, Comparison, compare
from latlab.analysis.replicates import from_rounds
from latlab.analysis.requests import Requests
from latlab.analysis.run_analysis import RunAnalysis
from latlab.analysis.verdicts import PAIRED_FROM, look_share
from latlab.metrics.summary import summarize
from latlab.records.columns import concat, take
from latlab.records.scrape import Scrape
from latlab.records.summary import ClientCheck, HostLoad, Throughput, Usage
from latlab.records.verdict import HEADLINE, VerdictConfig

# Ratios of counter deltas: name → (numerator series, denominator series or None).
EXPLAINERS = {
    "prefix-cache hit rate": ("prefix_cache_hits", "prefix_cache_queries"),
    "draft acceptance rate": ("spec_accepted_tokens", "spec_draft_tokens"),
    "preemptions": ("preemptions", None),
}


def pool(rounds: Sequence[RunAnalysis]) -> RunAnalysis:
    """One side's rounds as one analysis (window: none; rates from the rounds')."""
    first = rounds[0]
    measured = [_measured(a) for a in rounds]
    lengths = [len(m) for m in measured]
    requests = Requests(*(concat([getattr(m, name) for m in measured], lengths)
                          for name in ("table", "metrics", "parts", "in_flight")))
    everything = np.ones(len(requests), bool)
    slos = first.config.slos or None
    summary = summarize(requests.table, None, slos, metrics=requests.metrics)
    summary.throughput = pooled_throughput([a.summary.throughput for a in rounds])
    host = pooled_host([a.summary.client.host if a.summary.client else None for a in rounds])
    if host is not None:
        summary.client = ClientCheck(workers=first.summary.client.workers, bottleneck=False,
                                     host=host)
    if slos:
        summary.goodput = judge_requests(requests, everything, None, slos)
        rates = [(a.summary.goodput.requests_per_s, a.summary.throughput.window_s)
                 for a in rounds if a.summary.goodput and a.summary.throughput]
        if rates and all(r is not None for r, _ in rates):
            summary.goodput.requests_per_s = (sum(r * w for r, w in rates)
                                              / sum(w for _, w in rates))
    scrapes = [s for a in rounds for s in a.scrapes]
    return assemble(first.run, first.config, summary, requests, None, everything, scrapes,
                    diagnosis=False)


def _measured(a: RunAnalysis) -> Requests:
    """The round's requests inside its window, every column of them (`Requests.table_of`
    gives the table alone; a pooled side has no spill of its own)."""
    rows, r = np.flatnonzero(a.inside), a.requests
    return Requests(r.table.take(rows), take(r.metrics, rows), take(r.parts, rows),
                    r.in_flight[rows])


def pooled_throughput(rates: Sequence[Throughput | None]) -> Throughput | None:
    """Rounds' rates as one: each weighted by its window (totals over total time)."""
    if not rates or any(t is None for t in rates):
        return None
    total = sum(t.window_s for t in rates)

    def weighted(name: str) -> float | None:
        values = [getattr(t, name) for t in rates]
        if any(v is None for v in values):
            return None
        return sum(v * t.window_s for v, t in zip(values, rates)) / total

    return Throughput(window_s=total, offered_rate=weighted("offered_rate"),
                      sent_rate=weighted("sent_rate"), achieved_rate=weighted("achieved_rate"),
                      output_tokens_per_s=weighted("output_tokens_per_s"),
                      total_tokens_per_s=weighted("total_tokens_per_s"),
                      mean_concurrency=weighted("mean_concurrency"),
                      backlog_growth=max(t.backlog_growth for t in rates),
                      fell_behind=any(t.fell_behind for t in rates), users=rates[0].users)


def pooled_host(hosts: Sequence[HostLoad | None]) -> HostLoad | None:
    """Rounds' host loads as one: each usage weighted by the seconds it was sampled over."""
    if not hosts or any(h is None for h in hosts):
        return None
    total = sum(h.seconds for h in hosts)

    def usage(name: str) -> Usage | None:
        values = [getattr(h, name) for h in hosts]
        if any(v is None for v in values):
            return None
        return Usage(mean=sum(v.mean * h.seconds for v, h in zip(values, hosts)) / total,
                     max=max(v.max for v in values))

    return HostLoad(cpus=hosts[0].cpus, seconds=total, busy=usage("busy"),
                    client=usage("client"), server=usage("server"), other=usage("other"),
                    steal=usage("steal"),
                    load_average_max=max(h.load_average_max for h in hosts))


def counter_deltas(rounds: Sequence[tuple[Scrape, Scrape]]) -> dict[str, float]:
    """How much each known series grew over each round (its scrapes before and after),
    added up over the rounds."""
    deltas: dict[str, float] = {}
    for before, after in rounds:
        first, last = before.values, after.values
        for name in last.keys() & first.keys():
            deltas[name] = deltas.get(name, 0.0) + last[name] - first[name]
    return deltas


def explain(deltas: dict[str, float]) -> dict[str, float]:
    """The counters that explain a change, where the server reports them: ratios of counter
    deltas (a hit rate, an acceptance rate) or plain counts."""
    out = {}
    for label, (numerator, denominator) in EXPLAINERS.items():
        if numerator not in deltas:
            continue
        if denominator is None:
            out[label] = deltas[numerator]
        elif deltas.get(denominator):
            out[label] = deltas[numerator] / deltas[denominator]
    return out


class Sequential:
    """An A/B's looks at its rounds as they come: each look compares the rounds so far at
    its share of every metric's α (`verdicts.look_share`; `decide_on`: the keys that share
    one α), from PAIRED_FROM pairs on pair by pair, and a metric keeps the verdict of the
    first look that decided it, so the error rates hold over all the looks (a union bound
    over the shares spent)."""

    def __init__(self, verdicts: VerdictConfig, most: int,
                 decide_on: Sequence[str] = HEADLINE) -> None:
        self.verdicts = verdicts
        self.most = most
        self.decide_on = tuple(decide_on)
        self.previous = 0
        self.decided: dict[str, tuple[int, Change]] = {}

    def look(self, a: Sequence[RunAnalysis], b: Sequence[RunAnalysis],
             final: bool = False) -> Comparison:
        """B against A over the rounds both sides have finished; a `final` look (no more
        rounds will run, known before looking) spends the α left."""
        rounds = min(len(a), len(b))
        share = look_share(rounds, self.previous, self.most, final)
        comparison = compare(pool(a[:rounds]), pool(b[:rounds]), from_rounds(a, b, rounds),
                             self.verdicts, share, self.decide_on,
                             paired=rounds >= PAIRED_FROM)
        self.previous = rounds
        for i, change in enumerate(comparison.changes):
            if change.key in self.decided:
                comparison.changes[i] = replace(self.decided[change.key][1], a=change.a,
                                                b=change.b, attribution=change.attribution)
            elif change.decided:
                self.decided[change.key] = (rounds, change)
        return comparison

    def decided_at(self, key: str) -> int | None:
        """The rounds a side when `key` was decided."""
        found = self.decided.get(key)
        return found[0] if found else None

    @staticmethod
    def undecided(comparison: Comparison, keys: Sequence[str] = HEADLINE) -> list[Change]:
        """The metrics of `keys` (the headline ones) still "can't tell" that more rounds could
        decide (measured on both sides, and judged)."""
        return [c for c in comparison.changes
                if c.key in keys and not c.decided and c.delta is not None and c.judged]

    @staticmethod
    def look_line(comparison: Comparison, keys: Sequence[str] = HEADLINE) -> str:
        """What a look says of `keys`: those still "can't tell", those not measured on both
        sides or not judged (more rounds do not change that), else that they are decided."""
        open_ = [f"{c.label} can't tell" for c in Sequential.undecided(comparison, keys)]
        labels = {c.key: c.label for c in comparison.changes}
        whys = {c.key: c.why or NOT_MEASURED for c in comparison.changes
                if c.delta is None or not c.judged}
        unmeasured: dict[str, list[str]] = {}  # why → the metrics it holds for
        for key in keys:
            if key in labels and key not in whys:
                continue
            why = whys.get(key, NOT_MEASURED)
            unmeasured.setdefault(why if why == NOT_MEASURED else f"not judged: {why}",
                                  []).append(labels.get(key, key))
        decided = ("every headline metric decided" if tuple(keys) == HEADLINE
                   else f"{', '.join(keys)} decided")
        return ", ".join(open_ + [f"{' and '.join(names)} {why}"
                                  for why, names in unmeasured.items()]) or decided
