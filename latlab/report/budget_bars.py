"""The latency budget in the terminal: bars for the mean request and the p99 tail, a
legend, the notes, and with `full` every component."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from latlab.analysis.budget import Budget
from latlab.analysis.decompose import BUCKETS, label, members
from latlab.report.gateway import print_hop, print_target
from latlab.report.palette import BUCKET_COLORS
from latlab.report.sessions import print_tasks
from latlab.units import ms

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

BAR_WIDTH = 56
_BLOCKS = {"network": "░", "gateway": "▔", "queue & overhead": "▒", "application": "▞",
           "prefill": "▓", "decode": "█", "prefill + decode (unsplit)": "▚",
           "first token (unsplit)": "·", "model server (unsplit)": "▙"}  # apart without colour


def print_budget(console: Console, analysis: RunAnalysis, full: bool = False) -> None:
    """The four-bucket latency budget as bars (the mean request and the p99 tail), a legend,
    the notes (e.g. a large unattributed share), and with `full` every component."""
    mean, tail = analysis.mean, analysis.tail
    print_target(console, analysis)
    console.print(Text("Where the time goes", style="bold"),
                  Text("(E2E from schedule; the components add up to it)", style="dim"))
    if mean is None or tail is None:
        console.print(Text("no successful request: nothing to decompose", style="yellow"))
    else:
        _print_bars(console, mean, tail)
    for note in analysis.notes:
        console.print(Text(f"  note: {note}", style="yellow"))
    if full and mean is not None and tail is not None:
        console.print(_components_table(mean, tail))
    print_hop(console, analysis)
    if analysis.tasks is not None:
        console.print()
        print_tasks(console, analysis.tasks)


def _print_bars(console: Console, mean: Budget, tail: Budget) -> None:
    plain = console.color_system is None
    width = max(10, min(BAR_WIDTH, console.width - 32))
    for title, b in (("mean", mean), (f"p99 tail (n={tail.n})", tail)):
        console.print(Text.assemble(f"  {title:<16}", _bar(b, plain, width), f"  {ms(b.total)}"))
    legend = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False)
    legend.add_column()
    for _ in range(3):
        legend.add_column(justify="right")
    for name in mean.buckets():
        measured = mean.measured(name)  # else its 0 is unknown: "–"
        legend.add_row(Text.assemble("  ", (_BLOCKS[name] if plain else "█", BUCKET_COLORS[name]),
                                     f" {name}"),
                       ms(mean.bucket(name) if measured else None),
                       f"{100 * mean.share(name):.0f}% of the mean" if measured else "not measured",
                       f"{100 * tail.share(name):.0f}% of the tail" if measured else "")
        if name == "application":  # each of its spans' names, largest first
            for c in mean.application():
                legend.add_row(f"      {label(c)}", ms(mean.components[c]),
                               f"{100 * mean.share(c):.0f}% of the mean",
                               f"{100 * tail.share(c):.0f}% of the tail")
    console.print(legend)


def _bar(b: Budget, plain: bool, width: int) -> Text:
    values = {name: max(v, 0.0) for name, v in b.buckets().items()}
    whole = sum(values.values()) or 1.0
    bar = Text()
    for name, v in values.items():
        bar.append((_BLOCKS[name] if plain else "█") * round(width * v / whole),
                   style=BUCKET_COLORS[name])
    return bar


def _components_table(mean: Budget, tail: Budget) -> Table:
    table = Table(title="every component", title_justify="left", box=None, padding=(0, 1))
    for column in ("component", "bucket", "mean", "share", "p99 tail", "share", "quality"):
        table.add_column(column, justify="left" if column in ("component", "bucket", "quality")
                         else "right")
    bucket_of = {c: b for b in BUCKETS for c in members(b, mean.components)}
    for c in mean.components:
        if mean.quality[c] is None:
            continue
        coverage = "" if mean.coverage[c] in (0.0, 1.0) else f" ({100 * mean.coverage[c]:.0f}%)"
        table.add_row(label(c), bucket_of[c], ms(mean.components[c]),
                      f"{100 * mean.share(c):.1f}%", ms(tail.components.get(c, 0.0)),
                      f"{100 * tail.share(c):.1f}%", f"{mean.quality[c]}{coverage}")
    return table
