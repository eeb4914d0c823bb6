"""Rules about the server as a whole: the KV cache filling up while requests wait or get
preempted (from its /metrics, `--scrape`), and pauses every stream shares at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from latlab.analysis.advice import joined, prefix_caching
from latlab.analysis.findings import Finding, Severity, Unevaluated
from latlab.analysis.rules.common import uncounted_chunks
from latlab.records.columns import MISSING, present
from latlab.records.table import RequestTable
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

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
    fix, tries = joined("more KV-cache memory, fewer running sequences or shorter contexts",
                          prefix_caching(a))
    return Finding("kv_cache_full", Severity.WARNING,
                   "the KV cache filled up: requests waited for memory"
                   + (" and were preempted" if new_preemptions > 0 else ""), evidence,
                   where="queue (waiting for KV-cache blocks) and recomputation after preemption",
                   fix=fix, tries=tries, impact=len(full) / len(scrapes),
                   metric=("ttft", "p99"))


PAUSE_MIN_MS = 50.0
PAUSE_SHARE = 0.8  # of the streams in flight
INTAKE_MIN_MS = 50.0
PREFILL_COVER = 0.5  # of a pause, for another request's prefill to explain it
FIRST_TOKEN_SLACK_NS = 2_000_000
MAX_CANDIDATES = 200
NEVER = np.iinfo(np.int64).max


def server_pause(a: RunAnalysis) -> Finding | Unevaluated | None:
    """A pause every stream in flight shares at once (a frozen server, a GC or swap stall,
    a blocked event loop), and requests the server read late (their intake wait). Not in a
    predicted run: the simulator models no pause, so a stop every simulated stream shares is
    a long step drawn from the calibration's spread, not something the server did."""
    if a.config.kind == "predict":
        return Unevaluated("server_pause", "a measured run: the simulator models no server "
                                           "pauses (a predicted one would be its spread's)")
    t = a.table
    rows = a.ok & (t.events >= 2)
    intake = a.requests.parts.value("intake")
    if rows.sum() < 2 and not intake[a.ok].any():
        return Unevaluated("server_pause", "needs ≥ 2 streamed responses or server totals")
    chunked = uncounted_chunks(a)
    pauses = [] if chunked else [p for p in shared_pauses(t, rows) if not _a_prefill(p, a)]
    stalls = a.client.stalls if a.client is not None else []
    clients = [p for p in pauses if _overlap(p, stalls) >= PREFILL_COVER]
    pauses = [p for p in pauses if p not in clients]
    late = intake[a.ok & (intake >= INTAKE_MIN_MS)]
    if not pauses and not len(late):
        return Unevaluated("server_pause", chunked) if chunked else None
    evidence = [f"{ms(length)} when every one of {n} streams in flight stopped at once, "
                f"{(start - origin(a)) / 1e9:.1f} s into the run"
                for start, length, n in pauses[:3]]
    if len(late):
        evidence.append(f"{len(late)} requests waited up to {ms(float(late.max()))} before the "
                        "server read them (server intake: between their arrival and the "
                        "server's receipt)")
    if clients:
        evidence.append(f"{len(clients)} more such stops were the client's own event loop "
                        "held up (its reads were late, not the server's tokens): left out")
    busy = a.client is not None and a.client.host_busy and a.client.host is not None \
        and a.client.host.server is not None
    if busy:
        evidence.append("the server shares the load generator's host, which was busy with "
                        "other work (see busy_host)")
    gateway = a.config.target.gateway
    if gateway is not None and pauses:
        evidence.append(f"every stream went through {gateway.name}: a stop they all share may "
                        "be the gateway's own (its event loop relays every stream), not the "
                        "server's")
    who = "the server" if gateway is None else f"the server or {gateway.name} in front of it"
    longest = max([length for _, length, _ in pauses] + late.tolist())
    return Finding("server_pause", Severity.INFO if busy else Severity.WARNING,
                   f"{who} paused: {ms(longest)} with every stream stopped", evidence,
                   where="the server as a whole (not one request's prefill): frozen, a GC or "
                         "swap stall, a blocked event loop",
                   fix="look at the server's host: CPU steal, memory pressure, long GC pauses, "
                       "synchronous work on its event loop",
                   impact=longest / a.mean.total if a.mean and a.mean.total else 0.0)


def _overlap(pause: tuple[int, float, int], stalls: list[tuple[int, float]]) -> float:
    """The share of `pause` the client's event loop was held up for."""
    start, length_ms, _ = pause
    end = start + length_ms * 1e6
    covered = sum(max(0.0, min(end, s + lag * 1e6) - max(start, s)) for s, lag in stalls)
    return covered / (length_ms * 1e6) if length_ms > 0 else 0.0


def shared_pauses(t: RequestTable, rows: np.ndarray) -> list[tuple[int, float, int]]:
    """`(start_ns, length_ms, streams)` of the intervals in which every stream in flight
    (of the requests `rows`) had a token gap (≥ PAUSE_SHARE of them, at least 2), longest
    first; the MAX_CANDIDATES longest gaps are the candidates."""
    offsets, tokens = t.token_offsets, t.token_ns
    streams = np.flatnonzero(rows)
    begin = tokens[:-1]
    long = np.flatnonzero(np.diff(tokens) >= PAUSE_MIN_MS * 1e6)  # at a gap's first event
    owner = np.searchsorted(offsets, long, side="right") - 1
    long = long[rows[owner] & (long + 1 < offsets[owner + 1])]  # within one of the streams
    long = long[np.argsort(begin[long] - tokens[long + 1], kind="stable")][:MAX_CANDIDATES]
    firsts, lasts = tokens[offsets[streams]], tokens[offsets[streams + 1] - 1]
    found: list[tuple[int, float, int]] = []
    for b, e in zip(tokens[long].tolist(), tokens[long + 1].tolist()):
        mid = (b + e) // 2
        if any(s <= mid < s + length * 1e6 for s, length, _ in found):
            continue
        flying = streams[(firsts < mid) & (mid < lasts)]
        if len(flying) < 2:
            continue
        lengths = offsets[flying + 1] - offsets[flying]
        at = np.repeat(offsets[flying] - np.cumsum(lengths) + lengths, lengths) \
            + np.arange(lengths.sum())
        starts = np.cumsum(lengths) - lengths
        before = np.maximum.reduceat(np.where(tokens[at] <= mid, tokens[at], MISSING), starts)
        after = np.minimum.reduceat(np.where(tokens[at] > mid, tokens[at], NEVER), starts)
        holding = (before != MISSING) & (after != NEVER)
        if holding.sum() >= PAUSE_SHARE * len(flying):
            start, end = int(before[holding].max()), int(after[holding].min())
            if end - start >= PAUSE_MIN_MS * 1e6:
                found.append((start, (end - start) / 1e6, len(flying)))
    return sorted(found, key=lambda p: -p[1])


def _a_prefill(pause: tuple[int, float, int], a: RunAnalysis) -> bool:
    """Whether another request's prefill explains the pause: its server-timed prefill covers
    most of it, or (without server timings) its first token ended it. Any request's, in the
    window or not: one sent during the cooldown still stops the window's streams."""
    start, length_ms, _ = pause
    end = start + int(length_ms * 1e6)
    rows = a.table.ok & present(a.table.first_token_ns)
    first = a.table.first_token_ns[rows]
    prefill = a.requests.parts.value("prefill", rows) * 1e6
    covered = np.minimum(end, first) - np.maximum(start, first - prefill)
    return bool(((prefill != 0) & (covered >= PREFILL_COVER * (end - start))).any()
                or ((prefill == 0) & (first - end >= 0)
                    & (first - end <= FIRST_TOKEN_SLACK_NS)).any())


def origin(a: RunAnalysis) -> int:
    origins = a.table.origin_ns[present(a.table.origin_ns)]
    return int(origins.min()) if len(origins) else 0
