"""Rules about the compute itself: prefill-bound requests, and decode stalls (with whether
they coincide with other requests' prefills)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from latlab.analysis.advice import chunked_prefill, joined, prefix_caching, smaller_batches
from latlab.analysis.budget import PROMPT_BUCKETS, prompt_buckets
from latlab.analysis.delivery import bursts
from latlab.analysis.findings import Finding, Severity, Unevaluated, mean
from latlab.analysis.host_bound import host_bound
from latlab.analysis.rules.common import (
    NEEDS_SERVER,
    before_first_token,
    server_rows,
    uncounted_chunks,
)
from latlab.metrics.stats import percentiles
from latlab.records.columns import Ragged, present
from latlab.records.table import RequestTable
from latlab.records.timeline import NS_PER_MS
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

LONG_MIN_REQUESTS, PREFILL_TTFT_SHARE, PREFILL_E2E_SHARE, PREFILL_CORRELATION = 3, 0.5, 0.25, 0.5
STUTTER_MIN_SAMPLES, STUTTER_RATIO, STALL_FACTOR = 50, 3.0, 3.0
STALL_COINCIDE, STALL_LIFT = 0.5, 0.25
# What stall advice is judged by: each stream's longest pause, averaged over the streams. A
# run's ITL p99 is its few longest gaps, the stalls themselves: a round of a dozen streams
# moves it several-fold, where the mean of their longest pauses moves a tenth or two.
STALL_METRIC = ("itl_max", "mean")
UNBUFFER = ("let the stream through unbuffered (nginx: proxy_buffering off on the streaming "
            "route, or pass on the server's X-Accel-Buffering: no; other proxies have their "
            "own switch), then measure stalls again; the server's settings cannot be judged "
            "through the buffer")


def prefill_bound(a: RunAnalysis) -> Finding | Unevaluated | None:
    requests, parts = a.requests, a.requests.parts
    prompt = requests.prompt_tokens
    rows = server_rows(a) & ~np.isnan(prompt)
    if rows.sum() < 5:
        return Unevaluated("prefill_bound", NEEDS_SERVER + " and prompt token counts "
                                                               "of ≥ 5 successful requests")
    tokens, prefill = prompt[rows], parts.value("prefill", rows)
    buckets = prompt_buckets(prompt)
    counts = np.bincount(buckets[rows], minlength=len(PROMPT_BUCKETS))
    filled = np.flatnonzero(counts >= LONG_MIN_REQUESTS)
    longest = int(filled.max()) if len(filled) else None  # the buckets do not overlap
    long = rows if longest is None else rows & (buckets == longest)
    long_prefill = mean(parts.value("prefill", long))
    share = long_prefill / max(mean(before_first_token(a, long)), 1e-9)
    e2e_share = long_prefill / mean(parts.total[long])
    if share < PREFILL_TTFT_SHARE or e2e_share < PREFILL_E2E_SHARE:
        return None
    label = None if longest is None else PROMPT_BUCKETS[longest]
    which = f"prompts of {label} tokens" if label else "all prompts"
    evidence = [f"{which}: prefill {ms(long_prefill)} is {pct(share)} of "
                f"their time to first token and {pct(e2e_share)} of their E2E"]
    if tokens.max() > 1.5 * max(tokens.min(), 1):
        correlation = float(np.corrcoef(tokens, prefill)[0, 1]) if prefill.std() > 0 else 0.0
        if correlation < PREFILL_CORRELATION:
            return None
        evidence.append(f"prefill grows with prompt length (correlation {correlation:.2f})")
        evidence += [f"prompts of {g.label} tokens: TTFT p50 {ms(g.ttft['p50'])}"
                     for g in a.by_prompt if g.ttft.n]
    else:
        evidence.append(f"every prompt has ≈{tokens.mean():.0f} tokens: growth not measurable")
    cached = np.nan_to_num(a.table.cached_tokens[rows]).sum() / max(tokens.sum(), 1)
    evidence.append(f"{pct(cached)} of prompt tokens came from the prefix cache")
    fix, tries = joined("shorter prompts", prefix_caching(a), chunked_prefill(a))
    return Finding("prefill_bound", Severity.WARNING if e2e_share >= 0.3 else Severity.INFO,
                   f"nothing, then fast: prefill is {pct(share)} of the time to first token",
                   evidence, where="prefill", fix=fix, impact=e2e_share, tries=tries,
                   metric=("ttft", "p50"))


def decode_stalls(a: RunAnalysis) -> Finding | Unevaluated | None:
    t, m = a.table, a.requests.metrics
    rows = a.ok & (t.events >= 2)
    chunked = uncounted_chunks(a)
    if chunked:
        return Unevaluated("decode_stalls", chunked)
    itl = m.itl.select(rows)
    if len(itl) < STUTTER_MIN_SAMPLES:
        return Unevaluated("decode_stalls", f"needs ≥ {STUTTER_MIN_SAMPLES} inter-token samples "
                                      f"(streamed responses of ≥ 2 tokens; has {len(itl)})")
    burst = bursts(a)
    if burst is not None:
        longest = float(np.nanmean(m.itl_max[rows]))
        return Finding("decode_stalls", Severity.WARNING,
                       "the stream arrives in bursts: a buffer on the way holds tokens back",
                       [burst.line(), f"each stream's longest pause (ITL per-request max) "
                        f"{ms(longest)} on average: the buffer's wait, whatever the server did"],
                       where="between the server and the client: a proxy's buffer",
                       fix=UNBUFFER, impact=burst.share)
    p50, p99 = percentiles(itl, (50, 99))
    del itl
    if p50 <= 0 or p99 < STUTTER_RATIO * p50:
        return None
    gaps = m.chunk_gaps
    chosen = np.repeat(rows, gaps.lengths)  # per gap: its request is one of `rows`
    stalled = np.flatnonzero(chosen & (gaps.values / _gap_tokens(t, gaps) >= STALL_FACTOR * p50))
    chosen[stalled] = False
    normal = np.flatnonzero(chosen)
    del chosen
    prefills = _Prefills(a)
    longest = m.itl_max[rows]
    evidence = [f"ITL p99 {ms(p99)} is {p99 / p50:.1f}× its p50 {ms(p50)}",
                f"{len(stalled)} stalls (gaps ≥ {STALL_FACTOR:.0f}× the p50) in {int(rows.sum())} "
                f"streams; each stream's longest pause (ITL per-request max) "
                f"{ms(float(np.nanmean(longest)))} on average"]
    impact = float(gaps.values[stalled].sum()) / float(a.requests.parts.total[rows].sum())
    if not prefills:
        evidence.append("server prefill timings are needed to test whether stalls coincide "
                        "with other requests' prefills")
        coincide = False
    else:
        during = prefills.overlap_share(*_gap_spans(t, gaps, stalled))
        baseline = prefills.overlap_share(*_gap_spans(t, gaps, normal))
        evidence.append(f"{pct(during)} of stalls overlap another request's prefill, "
                        f"against {pct(baseline)} of normal gaps")
        coincide = during >= STALL_COINCIDE and during - baseline >= STALL_LIFT
    if coincide:
        bound = host_bound(a)
        if bound is not None:
            evidence += bound.evidence
        fix, tries = joined(chunked_prefill(a), smaller_batches(a))
        return Finding("decode_stalls", Severity.WARNING,
                       "starts, then stutters: decode stalls while other requests prefill",
                       evidence, where="decode, interrupted by other requests' prefills",
                       fix=fix, impact=impact, tries=tries, metric=STALL_METRIC)
    return Finding("decode_stalls", Severity.INFO,
                   "decode stalls not clearly tied to other requests' prefills", evidence,
                   where="decode, interrupted by something else",
                   fix="look for CPU contention, GC pauses or buffering proxies on the stream",
                   impact=impact, metric=STALL_METRIC)


def _gap_tokens(t: RequestTable, gaps: Ragged) -> np.ndarray | int:
    """The tokens of the event that ends each gap (at least 1); 1 when every event has one."""
    if t.one_token_events:
        return 1
    return np.maximum(t.token_counts[_gap_positions(t, gaps, np.arange(len(gaps.values))) + 1], 1)


def _gap_positions(t: RequestTable, gaps: Ragged, which: np.ndarray) -> np.ndarray:
    """Where the gaps `which` (indices into `gaps`) start in the flat token columns."""
    request = np.searchsorted(gaps.offsets, which, side="right") - 1
    return t.token_offsets[request] + which - gaps.offsets[request]


def _gap_spans(t: RequestTable, gaps: Ragged, which: np.ndarray, sample: int = 2000
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(begin, end, owner)` of an even sample of the gaps `which`: owner is the request's index."""
    which = which[::max(1, len(which) // sample)]
    start = _gap_positions(t, gaps, which)
    request = np.searchsorted(gaps.offsets, which, side="right") - 1
    return t.token_ns[start], t.token_ns[start + 1], t.index[request]


class _Prefills:
    """Each request's prefill interval on the client clock: it ends at its first token."""

    def __init__(self, a: RunAnalysis) -> None:
        t = a.table
        prefill = t.server["prefill"]
        timed = a.ok & t.has_server & ~np.isnan(prefill) & present(t.first_token_ns)
        ends, owners = t.first_token_ns[timed], t.index[timed]
        starts = ends - (prefill[timed] * NS_PER_MS).astype(np.int64)
        order = np.lexsort((owners, ends, starts))
        self.starts, self.ends, self.owners = starts[order], ends[order], owners[order]
        self.longest = int((self.ends - self.starts).max()) if len(order) else 0

    def __bool__(self) -> bool:
        return len(self.starts) > 0

    def overlap_share(self, begin: np.ndarray, end: np.ndarray, owner: np.ndarray) -> float:
        """The share of the gaps `[begin, end]` of request `owner` that overlap another
        request's prefill."""
        if not len(begin):
            return 0.0
        hits = 0
        for b, e, o in zip(begin, end, owner):
            near = slice(np.searchsorted(self.starts, b - self.longest, side="left"),
                         np.searchsorted(self.starts, e, side="left"))
            hits += bool(np.any((self.ends[near] > b) & (self.owners[near] != o)))
        return hits / len(begin)
