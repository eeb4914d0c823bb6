"""The server's own account of a run, from its /metrics (`--scrape`), checked against the
client's records of the same span.

A server that sends no timings per request (vLLM) still counts every request in histograms:
between the first and the last scrape, each histogram's `_sum` and `_count` grew by the
requests the server finished, so their ratio is its mean per request (queue, prefill,
decode, inference, TTFT, E2E), with its prompt and generation token counters and the load it
reported (running, waiting, KV cache). The client saw the same span: the requests that ended
in it, their E2E and their tokens. Where the two agree the server's stages can be trusted as
the split of the client's time; where they do not, the view says how (other clients on the
server, requests it never finished, a restart).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from latlab.records.columns import present
from latlab.records.scrape import STAGES, Scrape
from latlab.records.table import RequestTable
from latlab.records.timeline import NS_PER_MS
from latlab.units import ms, pct

AGREE = 0.05  # relative
AGREE_REQUESTS = 2  # absolute: requests finishing as a scrape is taken
PEAKS = ("running", "waiting", "kv_usage")


@dataclass
class ServerView:
    """Between two scrapes `span_s` apart: the requests the server finished, its mean per
    request of each stage (ms), its token counters' growth, the peaks of its load, what the
    client saw end in the same span, and how the two compare (`checks`, `agrees`)."""

    span_s: float
    requests: int
    stages_ms: dict[str, float]
    tokens: dict[str, float]
    peaks: dict[str, float]
    client_requests: int
    client_e2e_ms: float | None
    checks: list[str] = field(default_factory=list)
    agrees: bool = True


def server_view(scrapes: Sequence[Scrape], t: RequestTable) -> ServerView | None:
    """The view between the first and the last scrape that carry the server's request
    histograms; None without two such scrapes or without a finished request between them."""
    timed = [s for s in scrapes if any(f"{stage}_count" in s.values for stage in STAGES)]
    if len(timed) < 2:
        return None
    first, last = timed[0], timed[-1]

    def grew(name: str) -> float | None:
        a, b = first.values.get(name), last.values.get(name)
        return b - a if a is not None and b is not None else None

    counts = {stage: grew(f"{stage}_count") for stage in STAGES}
    requests = next((int(c) for c in (counts["e2e"], *counts.values()) if c), 0)
    if requests <= 0:
        return None
    stages = {stage: grew(f"{stage}_sum") * 1000 / counts[stage] for stage in STAGES
              if counts[stage] and grew(f"{stage}_sum") is not None}
    tokens = {name: grew(name) for name in ("prompt_tokens", "generation_tokens")
              if grew(name) is not None}
    # gauges read only before and after the run (no --scrape) saw an idle server: no peak
    during = [s for s in scrapes if first.t_ns < s.t_ns < last.t_ns]
    peaks = {name: max(s.values[name] for s in during if name in s.values)
             for name in PEAKS if any(name in s.values for s in during)}
    ended = t.ok & present(t.done_ns) & (t.done_ns >= first.t_ns) & (t.done_ns < last.t_ns)
    e2e = (t.done_ns[ended] - t.sent_ns[ended]) / NS_PER_MS
    view = ServerView((last.t_ns - first.t_ns) / 1e9, requests, stages, tokens, peaks,
                      int(ended.sum()), float(e2e.mean()) if len(e2e) else None)
    _check(view, t, ended)
    return view


def _check(view: ServerView, t: RequestTable, ended: np.ndarray) -> None:
    """How the server's account squares with the client's: the requests, their E2E (the
    server's is inside the client's), their tokens."""
    n, m = view.requests, view.client_requests
    if abs(n - m) <= max(AGREE_REQUESTS, AGREE * m):
        view.checks.append(f"requests: the server finished {n}, the client saw {m} end")
    else:
        view.agrees = False
        view.checks.append(
            f"requests: the server finished {n}, the client saw {m} end: "
            + ("other clients share the server, or it finished requests the client gave up on"
               if n > m else "the server counted fewer (a restart, another replica)"))
    server, client = view.stages_ms.get("e2e"), view.client_e2e_ms
    if server is not None and client:
        if server <= client * (1 + AGREE):
            view.checks.append(f"E2E: the server's own {ms(server)} is {pct(server / client)} "
                               f"of the client's {ms(client)} (the rest: network and HTTP "
                               "before and after the engine)")
        else:
            view.agrees = False
            view.checks.append(f"E2E: the server's own {ms(server)} exceeds the client's "
                               f"{ms(client)}: they are not the same requests")
    sums = {"prompt_tokens": t.prompt_tokens[ended], "generation_tokens": t.output_tokens[ended]}
    for name, values in sums.items():  # per request: a request ending at a scrape moves both
        counted, seen = view.tokens.get(name), float(np.nansum(values))
        if counted is None or not seen or not m:
            continue
        if abs(counted / n - seen / m) > AGREE * seen / m + 1:
            view.agrees = False
            view.checks.append(f"{name.replace('_', ' ')}: the server counted {counted / n:,.1f} "
                               f"a request, the client's usage {seen / m:,.1f}")
