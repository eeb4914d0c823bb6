"""The run's connections: how many requests opened one and how many reused one, and what
opening took (the median DNS lookup, TCP connect and TLS handshake of the new ones)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latlab.records.table import RequestTable
from latlab.records.timeline import NS_PER_MS


@dataclass(frozen=True, slots=True)
class Connections:
    new: int
    reused: int
    dns_ms: float | None  # medians over the new connections that had the phase
    connect_ms: float | None
    tls_ms: float | None

    def line(self) -> str:
        phases = ", ".join(f"{name} {value:.2f} ms" for name, value in (
            ("DNS", self.dns_ms), ("TCP connect", self.connect_ms),
            ("TLS handshake", self.tls_ms)) if value is not None)
        return (f"{self.new} new" + (f" (median {phases})" if phases else "")
                + f", {self.reused} reused")


def connections(t: RequestTable, rows: np.ndarray) -> Connections | None:
    """The connections of the requests `rows` (a mask); None when none recorded one."""
    had = rows & t.has_connection
    if not had.any():
        return None
    new = had & t.new_connection

    def median(phase: str) -> float | None:
        values = t.phases[phase][new]
        values = values[~np.isnan(values)]
        return float(np.median(values)) / NS_PER_MS if len(values) else None

    return Connections(new=int(new.sum()), reused=int((had & ~new).sum()),
                       dns_ms=median("dns_ns"), connect_ms=median("connect_ns"),
                       tls_ms=median("tls_ns"))
