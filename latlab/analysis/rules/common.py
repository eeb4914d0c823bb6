"""What several rules share."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

NEEDS_SERVER = "needs server timings (the server-timing protocol) to split the time"


def server_rows(a: RunAnalysis) -> np.ndarray:
    """The measured, successful requests that carry server timings (a mask)."""
    return a.ok & a.requests.parts.has_server


def before_first_token(a: RunAnalysis, rows: np.ndarray | None = None) -> np.ndarray:
    """The time each request (of `rows` only, when given) spent before its first token was
    computed (ms)."""
    p = a.requests.parts
    return sum(p.value(c, rows) for c in ("client_wait", "connect", "network",
                                          "gateway_intake", "preprocess", "queue", "prefill"))



UNCOUNTED_CHUNKS = 0.2  # of the streams


def uncounted_chunks(a: RunAnalysis) -> str | None:
    """Why the gaps between token events are not per-token gaps, when they are not: enough
    streams carried more tokens (the server's usage) than events and the server counts no
    tokens per chunk (`transformers serve` sends a chunk per whole word), so a long gap may
    be one chunk of several tokens; None when the gaps can be read per token."""
    t = a.table
    rows = a.ok & (t.events >= 2)
    uncounted = rows & t.tokens_from_usage & (t.event_tokens < t.completion_tokens)
    if (t.token_counts <= 1).all() and uncounted.sum() >= UNCOUNTED_CHUNKS * max(rows.sum(), 1) \
            and uncounted.any():
        return (f"{int(uncounted.sum())} of {int(rows.sum())} streams carried more tokens than "
                "events and the server does not count tokens per chunk: a long gap may be a "
                "chunk of several tokens")
    return None
