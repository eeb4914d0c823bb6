"""Rules about how the server took the run's requests: one at a time (no batching), or none
inside the measurement window (a cold load longer than the warm-up)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from latlab.analysis.findings import Finding, Severity, Unevaluated
from latlab.records.columns import MISSING, present
from latlab.records.target import ServerKind
from latlab.records.timeline import NS_PER_MS
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

SERIAL_MIN_OVERLAPPED, SERIAL_SHARE, SERIAL_SLOPE, SERIAL_WAIT_MS = 5, 0.95, 0.7, 10.0
# What a server that takes one request at a time can change, by whose server it is.
SERIAL_FIXES = {
    ServerKind.LLAMACPP: "give llama-server more slots: -np N (--parallel), with -c large "
                         "enough for N contexts",
    ServerKind.LATLAB: "raise latlab serve's --max-num-seqs",
    ServerKind.VLLM: "raise vLLM's --max-num-seqs",
    ServerKind.SGLANG: "raise SGLang's --max-running-requests",
    ServerKind.TGI: "raise TGI's --max-concurrent-requests and --max-batch-total-tokens",
    ServerKind.OLLAMA: "set OLLAMA_NUM_PARALLEL on the Ollama server",
}
SERIAL_FIX = ("serve with batching: continuous batching (`transformers serve "
              "--continuous-batching`), parallel slots (llama-server -np N), or more replicas")


def one_at_a_time(a: RunAnalysis) -> Finding | Unevaluated | None:
    """Requests sent while another was generating got their first token only after it (and
    every one before it) had finished, and the longer they had to wait for that, the later
    their first token came, one for one: the server serves one request at a time. A batching
    server can also finish one request before the next one's first token (long prefills,
    short answers), but there a request's first token does not wait on how long the one
    before it had left. Every successful request of the run counts, warm-up included: how
    the server serves does not change at the window's edge."""
    t = a.table
    rows = np.flatnonzero(t.ok & a.requests.parts.decomposed & (t.events >= 2))
    if len(rows) < SERIAL_MIN_OVERLAPPED:
        return Unevaluated("one_at_a_time", f"needs ≥ {SERIAL_MIN_OVERLAPPED} streamed "
                                            f"successful requests (has {len(rows)})")
    rows = rows[np.argsort(t.first_token_ns[rows], kind="stable")]
    sent, first, end = t.sent_ns[rows], t.first_token_ns[rows], t.done_ns[rows]
    busy = np.maximum.accumulate(end)[:-1]  # until when the earlier ones were generating
    overlapped = sent[1:] < busy
    if overlapped.sum() < SERIAL_MIN_OVERLAPPED:
        return None  # the load never overlapped requests: nothing to tell
    waited = overlapped & (first[1:] >= busy)
    wait_ms = (busy - sent[1:])[waited] / NS_PER_MS
    ttft_ms = (first[1:] - sent[1:])[waited] / NS_PER_MS
    share = float(waited.sum() / overlapped.sum())
    if (share < SERIAL_SHARE or np.median(wait_ms) < SERIAL_WAIT_MS
            or np.ptp(wait_ms) < np.median(ttft_ms - wait_ms)):
        return None  # most overlapped, waits too short to matter, or too alike to tell
    slope = float(np.polyfit(wait_ms, ttft_ms, 1)[0])
    if slope < SERIAL_SLOPE:
        return None
    e2e = (end - sent)[1:][waited] / NS_PER_MS
    kind = a.config.target.server_kind
    return Finding(
        "one_at_a_time", Severity.WARNING, "the server serves one request at a time",
        [f"{int(waited.sum())} of {int(overlapped.sum())} requests sent while another was "
         "generating got their first token only after it finished",
         f"they waited {ms(float(np.median(wait_ms)))} (median) for the requests before them, "
         f"then took {ms(float(np.median(ttft_ms - wait_ms)))} to their first token; each ms "
         f"more of waiting put their first token {slope:.2f} ms later",
         f"{int(a.requests.in_flight.max()) + 1} requests in flight at once at the client, one at "
         "the server"],
        where="queue: each request waits for the one before it to finish",
        fix=SERIAL_FIXES.get(kind, SERIAL_FIX),  # type: ignore[call-overload]
        impact=float(wait_ms.sum() / max(e2e.sum(), 1e-9)) * share)


def nothing_in_window(a: RunAnalysis) -> Finding | None:
    """Requests ran but none was scheduled inside the measurement window: everything
    measured lies in the warm-up or after the window (a cold load longer than the warm-up,
    a server slower than the run is long), so there is nothing to report on."""
    t = a.table
    if a.window is None or a.inside.any() or not len(t):
        return None
    sent = np.flatnonzero(present(t.sent_ns))
    evidence = [f"{len(t)} requests ran, none was scheduled in the {a.window.duration_s:.1f} s "
                f"window (after {a.config.warmup_s:g} s of warm-up)"]
    if len(sent):
        i = sent[np.argmin(t.sent_ns[sent])]
        answered = t.first_token_ns[i] if t.first_token_ns[i] != MISSING else t.end_ns[i]
        took = (answered - t.sent_ns[i]) / NS_PER_MS
        evidence.append(f"the first request took {ms(float(took))} to its first token"
                        f"{' (a cold load?)' if took > a.window.duration_s * 1000 / 2 else ''}")
    ok = int(t.ok.sum())
    evidence.append(f"{ok} of them succeeded ({pct(ok / len(t))}), outside the window")
    return Finding("nothing_in_window", Severity.CRITICAL,
                   "no request landed in the measurement window: nothing was measured",
                   evidence, where="outside the window: warm-up, cold load, drain",
                   fix="warm the server up before measuring (send it a request first), or run "
                       "longer (--duration) with a warm-up (--warmup) past the cold load",
                   impact=1.0)
