"""Rules about the compute itself: prefill-bound requests, and decode stalls (with whether
they coincide with other requests' prefills)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from latlab.analysis.budget import Row, prompt_bucket, prompt_tokens
from latlab.analysis.findings import Finding, Severity, Unevaluated, mean
from latlab.analysis.rules.common import NEEDS_SERVER, before_first_token, server_rows
from latlab.metrics.stats import percentile
from latlab.records.timeline import NS_PER_MS
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.analyze import RunAnalysis

LONG_MIN_REQUESTS, PREFILL_TTFT_SHARE, PREFILL_E2E_SHARE, PREFILL_CORRELATION = 3, 0.5, 0.25, 0.5
STUTTER_MIN_SAMPLES, STUTTER_RATIO, STALL_FACTOR = 50, 3.0, 3.0
STALL_COINCIDE, STALL_LIFT = 0.5, 0.25


def prefill_bound(a: RunAnalysis) -> Finding | Unevaluated | None:
    rows = [r for r in server_rows(a) if prompt_tokens(r) is not None]
    if len(rows) < 5:
        return Unevaluated("prefill_bound", NEEDS_SERVER + " and prompt token counts "
                                                               "of ≥ 5 successful requests")
    tokens = np.array([prompt_tokens(r) for r in rows], dtype=float)
    prefill = np.array([r.parts.ms("prefill") for r in rows])
    buckets = [prompt_bucket(prompt_tokens(r)) for r in rows]
    longest = max((b for b in set(buckets) if buckets.count(b) >= LONG_MIN_REQUESTS),
                  key=lambda b: max(prompt_tokens(r) for r, rb in zip(rows, buckets) if rb == b),
                  default=None)
    long = [r for r, b in zip(rows, buckets) if longest is None or b == longest]
    long_prefill = mean([r.parts.ms("prefill") for r in long])
    share = long_prefill / max(mean([before_first_token(r) for r in long]), 1e-9)
    e2e_share = long_prefill / mean([r.parts.total for r in long])
    if share < PREFILL_TTFT_SHARE or e2e_share < PREFILL_E2E_SHARE:
        return None
    evidence = [f"{f'prompts of {longest} tokens' if longest else 'all prompts'}: prefill {ms(long_prefill)} is {pct(share)} of "
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
    cached = sum(r.record.cached_tokens or 0 for r in rows) / max(tokens.sum(), 1)
    evidence.append(f"{pct(cached)} of prompt tokens came from the prefix cache")
    return Finding("prefill_bound", Severity.WARNING if e2e_share >= 0.3 else Severity.INFO,
                   f"nothing, then fast: prefill is {pct(share)} of the time to first token",
                   evidence, where="prefill",
                   fix="shorter prompts, prefix caching for shared prefixes, chunked prefill",
                   impact=e2e_share)


def decode_stalls(a: RunAnalysis) -> Finding | Unevaluated | None:
    rows = [r for r in a.decomposed if len(r.record.token_ns) >= 2]
    itl = np.sort(np.fromiter((v for r in rows for v in r.metrics.itl), dtype=float))
    if len(itl) < STUTTER_MIN_SAMPLES:
        return Unevaluated("decode_stalls", f"needs ≥ {STUTTER_MIN_SAMPLES} inter-token samples "
                                      f"(streamed responses of ≥ 2 tokens; has {len(itl)})")
    p50, p99 = percentile(itl, 50), percentile(itl, 99)
    if p50 <= 0 or p99 < STUTTER_RATIO * p50:
        return None
    begin = np.concatenate([np.asarray(r.record.token_ns[:-1], dtype=np.int64) for r in rows])
    end = np.concatenate([np.asarray(r.record.token_ns[1:], dtype=np.int64) for r in rows])
    owner = np.concatenate([np.full(len(r.record.token_ns) - 1, r.record.index) for r in rows])
    tokens = np.concatenate([np.maximum(r.record.token_counts[1:], 1) for r in rows])
    gap_ms = (end - begin) / NS_PER_MS
    stalled = gap_ms / tokens >= STALL_FACTOR * p50
    prefills = _Prefills(a.decomposed)
    evidence = [f"ITL p99 {ms(p99)} is {p99 / p50:.1f}× its p50 {ms(p50)}",
                f"{int(stalled.sum())} stalls (gaps ≥ {STALL_FACTOR:.0f}× the p50) in {len(rows)} "
                f"streams"]
    impact = float(gap_ms[stalled].sum()) / sum(r.parts.total for r in rows)
    if not prefills:
        evidence.append("server prefill timings are needed to test whether stalls coincide "
                        "with other requests' prefills")
        coincide = False
    else:
        during = prefills.overlap_share(begin[stalled], end[stalled], owner[stalled])
        baseline = prefills.overlap_share(begin[~stalled], end[~stalled], owner[~stalled])
        evidence.append(f"{pct(during)} of stalls overlap another request's prefill, "
                        f"against {pct(baseline)} of normal gaps")
        coincide = during >= STALL_COINCIDE and during - baseline >= STALL_LIFT
    if coincide:
        return Finding("decode_stalls", Severity.WARNING,
                       "starts, then stutters: decode stalls while other requests prefill",
                       evidence, where="decode, interrupted by other requests' prefills",
                       fix="chunked prefill (a token budget per step), smaller decode batches",
                       impact=impact)
    return Finding("decode_stalls", Severity.INFO,
                   "decode stalls not clearly tied to other requests' prefills", evidence,
                   where="decode, interrupted by something else",
                   fix="look for CPU contention, GC pauses or buffering proxies on the stream",
                   impact=impact)


class _Prefills:
    """Each request's prefill interval on the client clock: it ends at its first token."""

    def __init__(self, rows: list[Row]) -> None:
        spans = sorted((r.record.first_token_ns - int(r.record.server.prefill * NS_PER_MS),
                        r.record.first_token_ns, r.record.index) for r in rows
                       if r.record.server and r.record.server.prefill is not None
                       and r.record.first_token_ns is not None)
        self.starts = np.array([s[0] for s in spans], dtype=np.int64)
        self.ends = np.array([s[1] for s in spans], dtype=np.int64)
        self.owners = np.array([s[2] for s in spans], dtype=np.int64)
        self.longest = int((self.ends - self.starts).max()) if spans else 0

    def __bool__(self) -> bool:
        return len(self.starts) > 0

    def overlap_share(self, begin: np.ndarray, end: np.ndarray, owner: np.ndarray,
                      sample: int = 2000) -> float:
        """The share of (an even sample of) the gaps `[begin, end]` of request `owner` that
        overlap another request's prefill."""
        if not len(begin):
            return 0.0
        step = max(1, len(begin) // sample)
        begin, end, owner = begin[::step], end[::step], owner[::step]
        hits = 0
        for b, e, o in zip(begin, end, owner):
            near = slice(np.searchsorted(self.starts, b - self.longest, side="left"),
                         np.searchsorted(self.starts, e, side="left"))
            hits += bool(np.any((self.ends[near] > b) & (self.owners[near] != o)))
        return hits / len(begin)
