"""What several rules share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from latlab.analysis.budget import Row

if TYPE_CHECKING:
    from latlab.analysis.analyze import RunAnalysis

NEEDS_SERVER = "needs server timings (the server-timing protocol) to split the time"


def server_rows(a: RunAnalysis) -> list[Row]:
    """The measured, successful requests that carry server timings."""
    return [r for r in a.decomposed if r.parts.has_server]


def before_first_token(row: Row) -> float:
    """The time a request spent before its first token was computed (ms)."""
    p = row.parts
    return sum(p.ms(c) for c in ("client_wait", "connect", "network", "preprocess", "queue",
                                 "prefill"))
