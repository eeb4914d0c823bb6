"""A trace's traffic characterised, one request at a time (`TrafficProfile.add`): rate over
time and burstiness, prompt and output lengths, prefix sharing and reuse, sessions; and the
synthetic workload flags that come closest to it.

It keeps a few numbers per request (its time and lengths), the last request that used each
block, and each session's last time: a million requests take tens of megabytes.

Prefix sharing is what an unbounded prefix cache would see: a request's cached prefix is its
leading blocks seen in earlier requests (a block's id names its whole prefix, as Mooncake's
chained hashes do), up to its prompt's length.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter

import numpy as np

from latlab.records.trace import Lengths, SessionStats, Sharing, TraceProfile

MAX_POINTS = 300  # the rate series' bins at most
HIST_BINS = 24
COMMON_PREFIX = 0.05  # a first block shared by this share of requests is a shared prefix


class TrafficProfile:
    """Requests added in time order (`add`); `profile()` what they make."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.times = array("d")
        self.prompt = array("q")  # -1: the trace does not say
        self.output = array("q")
        self.per_second = array("q")
        self._seen: dict[int, int] = {}  # block id -> the last request that used it
        self._reused: set[int] = set()  # block ids used by more than one request
        self._first = Counter()
        self._with_blocks = self._hit = 0
        self._cached_tokens = self._block_tokens_total = 0
        self._reuse = array("q")  # per request with a cached prefix: requests since ...
        self._reuse_s = array("d")  # ... and seconds since its deepest cached block's last use
        self._sessions: dict[str, tuple[int, float]] = {}  # turns, last time
        self._gaps = array("d")
        self._turns_max = 0

    def add(self, offset_s: float, prompt: int | None, output: int | None,
            hash_ids: list[int] | None, session: str | None) -> None:
        i = len(self.times)
        self.times.append(offset_s)
        self.prompt.append(-1 if prompt is None else prompt)
        self.output.append(-1 if output is None else output)
        second = int(offset_s)
        if second >= len(self.per_second):
            self.per_second.extend([0] * (second + 1 - len(self.per_second)))
        self.per_second[second] += 1
        if hash_ids:
            self._blocks(i, offset_s, prompt, hash_ids)
        if session is not None:
            turns, last = self._sessions.get(session, (0, offset_s))
            if turns:
                self._gaps.append(offset_s - last)
            self._sessions[session] = (turns + 1, offset_s)
            self._turns_max = max(self._turns_max, turns + 1)

    def _blocks(self, i: int, offset_s: float, prompt: int | None, ids: list[int]) -> None:
        self._with_blocks += 1
        self._first[ids[0]] += 1
        tokens = prompt if prompt is not None else len(ids) * self.block_tokens
        self._block_tokens_total += tokens
        depth = 0
        while depth < len(ids) and ids[depth] in self._seen:
            depth += 1
        if depth:
            self._hit += 1
            self._cached_tokens += min(depth * self.block_tokens, tokens)
            last = self._seen[ids[depth - 1]]
            self._reuse.append(i - last)
            self._reuse_s.append(offset_s - self.times[last])
        for h in ids:
            if h in self._seen and self._seen[h] != i:
                self._reused.add(h)
            self._seen[h] = i

    def profile(self, source: str, format: str, skipped: str | None) -> TraceProfile:
        n = len(self.times)
        times = np.frombuffer(self.times, dtype=float) if n else np.zeros(0)
        span = float(times[-1]) if n else 0.0
        bin_s = max(1.0, math.ceil(span / MAX_POINTS)) if n else 1.0
        counts = np.frombuffer(self.per_second, dtype=np.int64) if n else np.zeros(0, np.int64)
        binned = np.add.reduceat(counts, np.arange(0, len(counts), int(bin_s))) if n else counts
        gaps = np.diff(times)
        cv = float(np.std(gaps) / np.mean(gaps)) if len(gaps) > 1 and np.mean(gaps) > 0 else None
        p = TraceProfile(
            source=source, format=format, requests=n, skipped=skipped, span_s=span,
            rate=n / span if span > 0 else float(n), bin_s=bin_s,
            peak_rate=float(binned.max() / bin_s) if n else 0.0,
            rate_series=[round(float(c) / bin_s, 4) for c in binned],
            interarrival_cv=cv, gamma_shape=1 / cv ** 2 if cv else None,
            dispersion=(float(np.var(counts) / np.mean(counts))
                        if len(counts) > 1 and np.mean(counts) > 0 else None),
            prompt=_lengths(self.prompt), output=_lengths(self.output),
            sharing=self._sharing(n), sessions=self._session_stats(n))
        p.flags = flags(p)
        return p

    def _sharing(self, n: int) -> Sharing | None:
        if not self._with_blocks:
            return None
        reuse, reuse_s = np.frombuffer(self._reuse, np.int64), np.frombuffer(self._reuse_s)

        def q(v: np.ndarray, at: float) -> float | None:
            return float(np.percentile(v, at)) if len(v) else None

        common = self._first.most_common(1)[0][1] if self._first else 0
        return Sharing(
            block_tokens=self.block_tokens, with_blocks=self._with_blocks / n,
            blocks=len(self._seen), reused_blocks=len(self._reused),
            cacheable_share=self._cached_tokens / max(self._block_tokens_total, 1),
            hit_requests=self._hit / self._with_blocks,
            reuse_requests_p50=q(reuse, 50), reuse_requests_p90=q(reuse, 90),
            reuse_s_p50=q(reuse_s, 50), reuse_s_p90=q(reuse_s, 90),
            common_first_share=common / self._with_blocks)

    def _session_stats(self, n: int) -> SessionStats | None:
        if not self._sessions:
            return None
        turns = [t for t, _ in self._sessions.values()]
        gaps = np.frombuffer(self._gaps)
        return SessionStats(
            sessions=len(turns), requests=sum(turns) / n, turns_mean=float(np.mean(turns)),
            turns_max=self._turns_max,
            gap_s_p50=float(np.percentile(gaps, 50)) if len(gaps) else None,
            gap_s_p90=float(np.percentile(gaps, 90)) if len(gaps) else None)


def _lengths(values: array) -> Lengths | None:
    v = np.frombuffer(values, np.int64) if len(values) else np.zeros(0, np.int64)
    v = v[v >= 0]
    if not len(v):
        return None
    edges = np.unique(np.geomspace(1, max(int(v.max()), 2) + 1, HIST_BINS + 1).astype(np.int64))
    counts, _ = np.histogram(v, bins=edges)
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return Lengths(n=len(v), mean=float(v.mean()), std=float(v.std()), p50=float(p50),
                   p90=float(p90), p99=float(p99), max=float(v.max()),
                   histogram=[(float(e), int(c)) for e, c in zip(edges[:-1], counts)])


def flags(p: TraceProfile) -> list[str]:
    """`latlab bench` flags for the synthetic workload closest to the profile: its mean rate
    (gamma with its burstiness when not Poisson-like), its lengths as lognormals, its most
    common first block as a shared prefix, its sessions' turns."""
    out = [f"--rate {p.rate:.3g}"]
    if p.gamma_shape is not None and abs(p.gamma_shape - 1) > 0.2:
        out.append(f"--burstiness {p.gamma_shape:.2g}")
    for name, lengths in (("--prompt-tokens", p.prompt), ("--output-tokens", p.output)):
        if lengths is not None:
            out.append(f"{name} lognormal:{lengths.mean:.0f},{max(lengths.std, 1):.0f}")
    s = p.sharing
    if s is not None and s.common_first_share >= COMMON_PREFIX:
        out.append(f"--prefix-tokens {s.block_tokens} --prefix-fraction "
                   f"{s.common_first_share:.2f}")
    if p.sessions is not None and p.sessions.turns_mean > 1:
        out.append(f"--turns {p.sessions.turns_mean:.0f}")
    return out
