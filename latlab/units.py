"""Numbers as people read them, one helper each: every report and finding uses these.

Missing values print as "–" and infinite ones (a failed request counted as infinitely slow)
as "∞", never as 0 or "inf".
"""

from __future__ import annotations

import math

MISSING, INFINITE = "–", "∞"


def _special(value: float | str | None) -> str | None:
    if value is None:
        return MISSING
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return INFINITE if value == "inf" or value > 0 else f"-{INFINITE}"
    return None


def ms(value: float | None) -> str:
    """A duration given in ms: `12.3 ms`, or `1.23 s` from a second up."""
    if (text := _special(value)) is not None:
        return text
    return f"{value / 1000:.2f} s" if abs(value) >= 1000 else f"{value:.1f} ms"


def pct(share: float | None) -> str:
    """A share (0..1) as a percentage: whole percents, one decimal below 10%."""
    if (text := _special(share)) is not None:
        return text
    return f"{100 * share:.0f}%" if abs(share) >= 0.1 else f"{100 * share:.1f}%"


def number(value: float | str | None, fmt: str = "{:.0f}") -> str:
    """`value` in `fmt`, with "–" for missing and "∞" for infinite."""
    if (text := _special(value)) is not None:
        return text
    return fmt.format(value)


def cell(value: float | str | None) -> str:
    """A compact table cell: one decimal below 100, none from 100 up."""
    if (text := _special(value)) is not None:
        return text
    return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"


def interval(lo: float | None, hi: float | None) -> str:
    """A predicted interval as cells: `310–420`, `310–∞` (the queue may grow)."""
    return f"{cell(lo)}–{cell(hi)}"


def money(value: float | None) -> str:
    return MISSING if value is None else f"${value:.3g}"
