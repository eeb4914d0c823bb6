"""Terminal output of `latlab coldstart`: one row per start, the spread, the idle gaps."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from latlab.records.coldstart import ColdstartRecord, Spread
from latlab.units import number


def print_coldstart(console: Console, result: ColdstartRecord, folder: Path) -> None:
    """One row per start, the cold excess with its spread, and the idle-gap probe."""
    table = Table(title=f"cold start {folder.name} (ms; warm = median of the requests after "
                        "the first)", title_justify="left")
    for column in ("run", "ready (s)", "first TTFT", "warm TTFT", "TTFT excess", "first E2E",
                   "warm E2E", "E2E excess"):
        table.add_column(column, justify="right")
    for r in result.runs:
        if r.error:
            table.add_row(str(r.run), number(r.ready_s, "{:.2f}"), Text(r.error, style="red"),
                          *[""] * 5)
            continue
        first, warm, excess = r.first, r.warm, r.excess
        table.add_row(str(r.run), number(r.ready_s, "{:.2f}"), number(first.ttft),
                      number(warm.ttft), number(excess.ttft, "{:+.0f}"), number(first.e2e),
                      number(warm.e2e), number(excess.e2e, "{:+.0f}"))
    s = result.summary
    table.add_section()
    columns = (("ready_s", "{:.2f}"), ("first_ttft", "{:.0f}"), ("warm_ttft", "{:.0f}"),
               ("excess_ttft", "{:+.0f}"), ("first_e2e", "{:.0f}"), ("warm_e2e", "{:.0f}"),
               ("excess_e2e", "{:+.0f}"))
    for stat in ("median", "min", "max"):
        table.add_row(stat, *(number(getattr(s[key], stat), fmt) for key, fmt in columns),
                      style="bold" if stat == "median" else "dim")
    console.print(table)
    if result.idle:
        idle = Table(title="idle-gap probe: the next request after the server sat idle "
                           "(excess over the same run's warm median, ms)", title_justify="left")
        for column in ("idle gap", "TTFT", "TTFT excess", "E2E", "E2E excess"):
            idle.add_column(column, justify="right")
        for g in result.idle:
            idle.add_row(f"{g.gap_s:g} s", _spread(g.ttft), _spread(g.excess_ttft, "{:+.0f}"),
                         _spread(g.e2e), _spread(g.excess_e2e, "{:+.0f}"))
        console.print(idle)


def _spread(s: Spread, fmt: str = "{:.0f}") -> str:
    if s.median is None:
        return "–"
    if s.n == 1:
        return fmt.format(s.median)
    return f"{fmt.format(s.median)} [{fmt.format(s.min)}, {fmt.format(s.max)}]"
