"""Terminal output (rich): the run summary table, the latency budget and the findings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from latlab.analysis.budget import Budget
from latlab.analysis.decompose import BUCKETS, COMPONENTS, LABELS
from latlab.analysis.findings import ms
from latlab.report.palette import BUCKET_COLORS, SEVERITY_COLORS

if TYPE_CHECKING:
    from latlab.analysis.run import RunAnalysis

BAR_WIDTH = 56
_BLOCKS = {"network": "░", "queue & overhead": "▒", "prefill": "▓", "decode": "█",
           "first token (unsplit)": "·"}  # tell the buckets apart without colour


def print_budget(console: Console, analysis: RunAnalysis, full: bool = False) -> None:
    """The four-bucket latency budget as bars (the mean request and the p99 tail), a legend,
    the notes (e.g. a large unattributed share), and with `full` every component."""
    mean, tail = analysis.mean, analysis.tail
    console.print(Text("Where the time goes", style="bold"),
                  Text("(E2E from schedule; the components add up to it)", style="dim"))
    if mean is None or tail is None:
        console.print(Text("no successful request: nothing to decompose", style="yellow"))
        return
    plain = console.color_system is None
    for label, b in (("mean", mean), (f"p99 tail (n={tail.n})", tail)):
        console.print(Text.assemble(f"  {label:<16}", _bar(b, plain), f"  {ms(b.total)}"))
    legend = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False)
    legend.add_column()
    for _ in range(3):
        legend.add_column(justify="right")
    for name in mean.buckets():
        legend.add_row(Text.assemble("  ", (_BLOCKS[name] if plain else "█", BUCKET_COLORS[name]),
                                     f" {name}"),
                       ms(mean.bucket(name)), f"{100 * mean.share(name):.0f}% of the mean",
                       f"{100 * tail.share(name):.0f}% of the tail")
    console.print(legend)
    for note in analysis.notes:
        console.print(Text(f"  note: {note}", style="yellow"))
    if full:
        console.print(_components_table(mean, tail))


def _bar(b: Budget, plain: bool) -> Text:
    values = {name: max(v, 0.0) for name, v in b.buckets().items()}
    whole = sum(values.values()) or 1.0
    bar = Text()
    for name, v in values.items():
        bar.append((_BLOCKS[name] if plain else "█") * round(BAR_WIDTH * v / whole),
                   style=BUCKET_COLORS[name])
    return bar


def _components_table(mean: Budget, tail: Budget) -> Table:
    table = Table(title="every component", title_justify="left", box=None, padding=(0, 1))
    for column in ("component", "bucket", "mean", "share", "p99 tail", "share", "quality"):
        table.add_column(column, justify="left" if column in ("component", "bucket", "quality")
                         else "right")
    bucket_of = {c: b for b, members in BUCKETS.items() for c in members}
    for c in COMPONENTS:
        if mean.quality[c] is None:
            continue
        coverage = "" if mean.coverage[c] in (0.0, 1.0) else f" ({100 * mean.coverage[c]:.0f}%)"
        table.add_row(LABELS[c], bucket_of[c], ms(mean.components[c]),
                      f"{100 * mean.share(c):.1f}%", ms(tail.components[c]),
                      f"{100 * tail.share(c):.1f}%", f"{mean.quality[c]}{coverage}")
    return table


def print_findings(console: Console, analysis: RunAnalysis, unevaluated: bool = True) -> None:
    """The findings, most severe first, each with its evidence, where the time goes and the
    fix to try first; then (dim) the rules that could not run and what they need."""
    console.print(Text("Findings", style="bold"))
    if not analysis.findings:
        console.print("  none: every rule that could run found nothing wrong")
    for f in analysis.findings:
        color = SEVERITY_COLORS[str(f.severity)]
        console.print(Text.assemble("  ", (f" {f.severity} ", f"bold white on {color}"), " ",
                                    (f.title, "bold")))
        lines = [Text(f"· {line}") for line in f.evidence]
        lines.append(Text.assemble("where the time goes: ", (f.where, "italic")))
        lines.append(Text.assemble("try first: ", (f.fix, "italic")))
        for line in lines:
            console.print(Padding(line, (0, 0, 0, 6), expand=False))
    if unevaluated and analysis.unevaluated:
        console.print(Text("  not evaluated:", style="dim"))
        for u in analysis.unevaluated:
            console.print(Text(f"    {u.rule}: {u.needs}", style="dim"))
