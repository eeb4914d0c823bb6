"""Diagnosis rules about where the time goes as prompts, load and tenants vary, and about
decode stalls. Same contract as `rules_run`: `Finding`, `Unevaluated` or None."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from latlab.analysis.budget import Row, in_flight_at, prompt_bucket, prompt_tokens, request_end
from latlab.analysis.findings import Finding, Severity, Unevaluated, mean, ms, pct
from latlab.metrics import NS_PER_MS, percentile

if TYPE_CHECKING:
    from latlab.analysis.run import RunAnalysis

TINY_TOKENS, TINY_MIN_REQUESTS, TINY_WAIT_MS, TINY_WAIT_SHARE = 128, 3, 20.0, 0.5
LOAD_GROWTH, LOAD_WAIT_MS, LOAD_SHARE, LOAD_SHARE_RISE = 2.0, 10.0, 0.2, 0.2
LONG_MIN_REQUESTS, PREFILL_TTFT_SHARE, PREFILL_E2E_SHARE, PREFILL_CORRELATION = 3, 0.5, 0.25, 0.5
STUTTER_MIN_SAMPLES, STUTTER_RATIO, STALL_FACTOR = 50, 3.0, 3.0
STALL_COINCIDE, STALL_LIFT = 0.5, 0.25
TENANT_SIZE_RATIO, TENANT_SLOWDOWN, TENANT_MIN_MS, TENANT_MIN_REQUESTS = 2.0, 1.5, 10.0, 5

NEEDS_SERVER = "needs server timings (the server-timing protocol) to split the time"


def _server_rows(a: RunAnalysis) -> list[Row]:
    return [r for r in a.decomposed if r.parts.has_server]


def _before_first_token(row: Row) -> float:
    p = row.parts
    return sum(p.ms(c) for c in ("client_wait", "connect", "network", "preprocess", "queue",
                                 "prefill"))


def tiny_prompts_slow(a: RunAnalysis) -> Finding | Unevaluated | None:
    if not _server_rows(a):
        return Unevaluated("tiny_prompts_slow", NEEDS_SERVER)
    tiny = [r for r in _server_rows(a) if (prompt_tokens(r) or TINY_TOKENS + 1) <= TINY_TOKENS]
    if len(tiny) < TINY_MIN_REQUESTS:
        return Unevaluated("tiny_prompts_slow", f"needs ≥ {TINY_MIN_REQUESTS} successful "
                                                f"requests of ≤ {TINY_TOKENS} prompt tokens")
    waits = {
        "network": mean([r.parts.ms("connect") + r.parts.ms("network") for r in tiny]),
        "queue": mean([r.parts.ms("client_wait") + r.parts.ms("queue") for r in tiny]),
        "preprocess": mean([r.parts.ms("preprocess") for r in tiny]),
    }
    wait, prefill = sum(waits.values()), mean([r.parts.ms("prefill") for r in tiny])
    if wait < TINY_WAIT_MS or wait < TINY_WAIT_SHARE * (wait + prefill):
        return None
    worst = max(waits, key=waits.get)
    fixes = {"network": "move the client closer to the server, reuse connections (keep-alive)",
             "queue": "cap the queue depth and add capacity: short requests wait behind others",
             "preprocess": "speed up request handling (tokenizer, chat template, validation)"}
    evidence = [f"{len(tiny)} requests with ≤ {TINY_TOKENS} prompt tokens: {ms(wait)} before any "
                f"compute against {ms(prefill)} of prefill ({pct(wait / (wait + prefill))} waiting)"]
    evidence += [f"{name}: {ms(v)}" for name, v in waits.items()]
    return Finding("tiny_prompts_slow", Severity.WARNING,
                   f"slow even for tiny prompts: {ms(wait)} before the first token is computed",
                   evidence, where=worst, fix=fixes[worst],
                   impact=wait / mean([r.parts.total for r in tiny]))


def load_growth(a: RunAnalysis) -> Finding | Unevaluated | None:
    rows = _server_rows(a)
    if not rows:
        return Unevaluated("load_growth", NEEDS_SERVER + " (queue)")

    def waiting(group: list[Row]) -> tuple[float, float]:
        w = mean([r.parts.ms("queue") + r.parts.ms("client_wait") for r in group])
        return w, w / mean([r.parts.total for r in group])

    evidence, fired, impact, evaluated = [], False, 0.0, False
    by_load = sorted(rows, key=lambda r: r.in_flight)
    k = len(by_load) // 3
    if k >= 3:
        low, high = by_load[:k], by_load[-k:]
        lo_n, hi_n = mean([r.in_flight for r in low]), mean([r.in_flight for r in high])
        if hi_n - lo_n >= 1:
            evaluated = True
            (lw, ls), (hw, hs) = waiting(low), waiting(high)
            evidence.append(f"queue + client wait at ≈{lo_n:.0f} in flight: {ms(lw)} ({pct(ls)} of "
                            f"E2E); at ≈{hi_n:.0f} in flight: {ms(hw)} ({pct(hs)})")
            if hw >= LOAD_GROWTH * lw and hw - lw >= LOAD_WAIT_MS and hs >= LOAD_SHARE:
                fired, impact = True, hs
    windows = [g for g in a.over_time if g.budget is not None]
    if len(windows) >= 2:
        evaluated = True
        first, last = windows[0].budget, windows[-1].budget
        fw, lw = (b.components["queue"] + b.components["client_wait"] for b in (first, last))
        fs, ls = fw / first.total, lw / last.total
        evidence.append(f"queue + client wait over time: {ms(fw)} ({pct(fs)}) in "
                        f"{windows[0].label} → {ms(lw)} ({pct(ls)}) in {windows[-1].label}")
        if ls >= fs + LOAD_SHARE_RISE and lw >= LOAD_GROWTH * fw and lw - fw >= LOAD_WAIT_MS:
            fired, impact = True, max(impact, ls)
    if not evaluated:
        return Unevaluated("load_growth", "needs requests at different load levels (in-flight "
                                          "counts) or a run long enough for ≥ 2 time windows")
    if not fired:
        return None
    return Finding("load_growth", Severity.WARNING,
                   "fine alone, bad under load: queueing grows with load", evidence,
                   where="queue (and autoscaling lag, if any)",
                   fix="scale out earlier, cap concurrency per instance", impact=impact)


def prefill_dominates(a: RunAnalysis) -> Finding | Unevaluated | None:
    rows = [r for r in _server_rows(a) if prompt_tokens(r) is not None]
    if len(rows) < 5:
        return Unevaluated("prefill_dominates", NEEDS_SERVER + " and prompt token counts "
                                                               "of ≥ 5 successful requests")
    tokens = np.array([prompt_tokens(r) for r in rows], dtype=float)
    prefill = np.array([r.parts.ms("prefill") for r in rows])
    buckets = [prompt_bucket(prompt_tokens(r)) for r in rows]
    longest = max((b for b in set(buckets) if buckets.count(b) >= LONG_MIN_REQUESTS),
                  key=lambda b: max(prompt_tokens(r) for r, rb in zip(rows, buckets) if rb == b),
                  default=None)
    long = [r for r, b in zip(rows, buckets) if longest is None or b == longest]
    long_prefill = mean([r.parts.ms("prefill") for r in long])
    share = long_prefill / max(mean([_before_first_token(r) for r in long]), 1e-9)
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
    return Finding("prefill_dominates", Severity.WARNING if e2e_share >= 0.3 else Severity.INFO,
                   f"nothing, then fast: prefill is {pct(share)} of the time to first token",
                   evidence, where="prefill",
                   fix="shorter prompts, prefix caching for shared prefixes, chunked prefill",
                   impact=e2e_share)


def stutter(a: RunAnalysis) -> Finding | Unevaluated | None:
    rows = [r for r in a.decomposed if len(r.record.token_ns) >= 2]
    itl = np.sort(np.fromiter((v for r in rows for v in r.metrics.itl), dtype=float))
    if len(itl) < STUTTER_MIN_SAMPLES:
        return Unevaluated("stutter", f"needs ≥ {STUTTER_MIN_SAMPLES} inter-token samples "
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
        return Finding("stutter", Severity.WARNING,
                       "starts, then stutters: decode stalls while other requests prefill",
                       evidence, where="decode, interrupted by other requests' prefills",
                       fix="chunked prefill (a token budget per step), smaller decode batches",
                       impact=impact)
    return Finding("stutter", Severity.INFO,
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


def tenant_interference(a: RunAnalysis) -> Finding | Unevaluated | None:
    tenants: dict[str, list[Row]] = {}
    for r in a.rows:
        if r.record.tenant is not None:
            tenants.setdefault(r.record.tenant, []).append(r)
    if len(tenants) < 2:
        return Unevaluated("tenant_interference", "needs requests from ≥ 2 tenants "
                                                  "(tenant labels in the workload)")
    size = {t: mean([(prompt_tokens(r) or 0) + (r.record.output_tokens or 0) for r in rs])
            for t, rs in tenants.items()}
    heavy, light = max(size, key=size.get), min(size, key=size.get)
    if size[heavy] < TENANT_SIZE_RATIO * max(size[light], 1):
        return None
    sent = [r.record for r in tenants[heavy] if r.record.sent_ns is not None]
    timed = [r for r in tenants[light] if r.metrics.ttft is not None]
    busy = in_flight_at([r.sent_ns for r in sent], [request_end(r) for r in sent],
                        [r.record.sent_ns for r in timed]) > 0
    alone = [r.metrics.ttft for r, b in zip(timed, busy) if not b]
    crowded = [r.metrics.ttft for r, b in zip(timed, busy) if b]
    if min(len(alone), len(crowded)) < TENANT_MIN_REQUESTS:
        return Unevaluated("tenant_interference", f"needs ≥ {TENANT_MIN_REQUESTS} requests of "
                           f"tenant {light!r} both with and without {heavy!r}'s requests in flight")
    quiet, busy = percentile(sorted(alone), 50), percentile(sorted(crowded), 50)
    if busy < TENANT_SLOWDOWN * quiet or busy - quiet < TENANT_MIN_MS:
        return None
    evidence = [f"{light!r} TTFT p50: {ms(quiet)} alone, {ms(busy)} while {heavy!r} has requests "
                f"in flight ({busy / quiet:.1f}×)",
                f"mean tokens per request: {heavy!r} {size[heavy]:.0f}, {light!r} {size[light]:.0f}"]
    evidence += [f"tenant {g.label!r}: TTFT p50 {ms(g.ttft['p50'])}, p99 {ms(g.ttft['p99'])}"
                 for g in a.by_tenant if g.ttft.n]
    return Finding("tenant_interference", Severity.WARNING,
                   f"heavy tenant {heavy!r} slows light tenant {light!r}", evidence,
                   where="queue and batching: head-of-line blocking behind big requests",
                   fix="per-tenant isolation: fair queueing, per-tenant concurrency limits",
                   impact=len(crowded) / len(a.rows))
