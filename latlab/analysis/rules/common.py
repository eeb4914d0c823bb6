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


def before_first_token(a: RunAnalysis) -> np.ndarray:
    """The time each request spent before its first token was computed (ms)."""
    p = a.requests.parts
    return sum(p.value(c) for c in ("client_wait", "connect", "network", "preprocess", "queue",
                                    "prefill"))

