"""Rules about the server as a whole: the KV cache filling up while requests wait or get
preempted (from its /metrics, `--scrape`), and pauses every stream shares at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from latlab.analysis.findings import Finding, Severity, Unevaluated
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.analyze import RunAnalysis

KV_FULL = 0.95
KV_FULL_SHARE = 0.1  # of the scrapes


def kv_cache_full(a: RunAnalysis) -> Finding | Unevaluated | None:
    scrapes = [s for s in a.scrapes if "kv_usage" in s.values]
    if not scrapes:
        return Unevaluated("kv_cache_full", "needs the server's KV-cache usage over the run "
                                            "(--scrape, from a server that exports it)")
    full = [s for s in scrapes if s.values["kv_usage"] >= KV_FULL]
    preempted = [s.values["preemptions"] for s in a.scrapes if "preemptions" in s.values]
    new_preemptions = preempted[-1] - preempted[0] if len(preempted) >= 2 else 0.0
    if len(full) < KV_FULL_SHARE * len(scrapes) and new_preemptions <= 0:
        return None
    waiting = [s.values.get("waiting", 0.0) for s in full]
    evidence = [f"KV cache ≥ {pct(KV_FULL)} full in {len(full)} of {len(scrapes)} scrapes "
                f"(peak {pct(max(s.values['kv_usage'] for s in scrapes))})"]
    if waiting:
        evidence.append(f"while it was full, {max(waiting):.0f} requests waited at most "
                        f"({sum(waiting) / len(waiting):.1f} on average)")
    if new_preemptions > 0:
        evidence.append(f"{new_preemptions:.0f} preemptions during the run: running requests "
                        "lost their KV blocks and were recomputed")
    return Finding("kv_cache_full", Severity.WARNING,
                   "the KV cache filled up: requests waited for memory"
                   + (" and were preempted" if new_preemptions > 0 else ""), evidence,
                   where="queue (waiting for KV-cache blocks) and recomputation after preemption",
                   fix="more KV-cache memory, fewer running sequences or shorter contexts; "
                       "prefix caching for shared prompts",
                   impact=len(full) / len(scrapes))


PAUSE_MIN_MS = 50.0
PAUSE_SHARE = 0.8  # of the streams in flight
INTAKE_MIN_MS = 50.0
PREFILL_COVER = 0.5  # of a pause, for another request's prefill to explain it
FIRST_TOKEN_SLACK_NS = 2_000_000
MAX_CANDIDATES = 200


def server_pause(a: RunAnalysis) -> Finding | Unevaluated | None:
    """A pause every stream in flight shares at once (a frozen server, a GC or swap stall,
    a blocked event loop), and requests the server read late (their intake wait)."""
    rows = [r for r in a.decomposed if len(r.record.token_ns) >= 2]
    if len(rows) < 2 and not any(r.parts.ms("intake") for r in a.decomposed):
        return Unevaluated("server_pause", "needs ≥ 2 streamed responses or server totals")
    pauses = [p for p in shared_pauses(rows) if not _a_prefill(p, a)]
    late = [r for r in a.decomposed if r.parts.ms("intake") >= INTAKE_MIN_MS]
    if not pauses and not late:
        return None
    evidence = [f"{ms(length)} when every one of {n} streams in flight stopped at once, "
                f"{(start - origin(a)) / 1e9:.1f} s into the run" for start, length, n in pauses[:3]]
    if late:
        worst = max(r.parts.ms("intake") for r in late)
        evidence.append(f"{len(late)} requests waited up to {ms(worst)} before the server read "
                        "them (server intake: between their arrival and the server's receipt)")
    longest = max([length for _, length, _ in pauses] + [r.parts.ms("intake") for r in late])
    return Finding("server_pause", Severity.WARNING,
                   f"the server paused: {ms(longest)} with every stream stopped", evidence,
                   where="the server as a whole (not one request's prefill): frozen, a GC or "
                         "swap stall, a blocked event loop",
                   fix="look at the server's host: CPU steal, memory pressure, long GC pauses, "
                       "synchronous work on its event loop",
                   impact=longest / a.mean.total if a.mean and a.mean.total else 0.0)


def shared_pauses(rows: list) -> list[tuple[int, float, int]]:
    """`(start_ns, length_ms, streams)` of the intervals in which every stream in flight had
    a token gap (≥ PAUSE_SHARE of them, at least 2), longest first."""
    gaps = sorted(((t[i], t[i + 1]) for r in rows for t in [r.record.token_ns]
                   for i in range(len(t) - 1) if t[i + 1] - t[i] >= PAUSE_MIN_MS * 1e6),
                  key=lambda g: g[0] - g[1])[:MAX_CANDIDATES]
    found: list[tuple[int, float, int]] = []
    for b, e in gaps:
        mid = (b + e) // 2
        if any(s <= mid < s + length * 1e6 for s, length, _ in found):
            continue
        flying = [r.record.token_ns for r in rows
                  if r.record.token_ns[0] < mid < r.record.token_ns[-1]]
        holding = [g for t in flying for g in zip(t, t[1:]) if g[0] <= mid < g[1]]
        if len(flying) >= 2 and len(holding) >= PAUSE_SHARE * len(flying):
            start, end = max(g[0] for g in holding), min(g[1] for g in holding)
            if end - start >= PAUSE_MIN_MS * 1e6:
                found.append((start, (end - start) / 1e6, len(flying)))
    return sorted(found, key=lambda p: -p[1])


def _a_prefill(pause: tuple[int, float, int], a: RunAnalysis) -> bool:
    """Whether another request's prefill explains the pause: its server-timed prefill covers
    most of it, or (without server timings) its first token ended it."""
    start, length_ms, _ = pause
    end = start + int(length_ms * 1e6)
    for row in a.decomposed:
        first = row.record.first_token_ns
        if first is None:
            continue
        prefill = row.parts.ms("prefill") * 1e6
        if prefill and min(end, first) - max(start, first - prefill) >= PREFILL_COVER * (end - start):
            return True
        if not prefill and 0 <= first - end <= FIRST_TOKEN_SLACK_NS:
            return True
    return False


def origin(a: RunAnalysis) -> int:
    return min((r.record.origin_ns for r in a.rows if r.record.origin_ns is not None), default=0)
