"""Terminal output of `latlab sweep`: the points, their cost, and the answers (knee, SLO-max,
cost at the SLO-max, why it stopped)."""

from __future__ import annotations

import math
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from latlab.records.sweep import Point, SweepRecord
from latlab.units import interval, money, number

CACHE_SPREAD = 0.10  # of prompt tokens served from the cache, between points


def ordered(points: list[Point]) -> list[Point]:
    """The points in order of load, the saturation probe last."""
    return sorted(points, key=lambda p: (p.mode == "throughput", p.load))


def print_sweep(console: Console, sweep: SweepRecord, folder: Path) -> None:
    """The table of points (in order of load; the points beside the curve dimmed), their
    cost, and the answers."""
    q = f"p{sweep.percentile:g}"
    slos = sweep.slos
    knee = sweep.knee.label if sweep.knee else None
    table = _table(f"sweep {folder.name} (latencies in ms; ◆ the knee)",
                   ["point", "offered\nreq/s", "achieved\nreq/s", "errors", "TTFT\np50 / p99",
                    "TPOT\np50",
                    "E2E\np50 / p99", "output\ntok/s", "prompt\ncache",
                    *(f"{q} {m}\n≤ {limit:g}" for m, limit in slos.items()),
                    *(["goodput\nreq/s"] if slos else [])])
    for p in ordered(sweep.points):
        row = [p.label + (" ◆" if p.label == knee else "")
               + (" (interrupted)" if p.interrupted else ""),
               number(p.offered, "{:.3g}"),
               Text(f"{p.achieved:.3g}" + (" behind" if p.fell_behind else ""),
                    style="red" if p.fell_behind else ""),
               f"{100 * p.error_rate:.1f}%",
               _cell(p, "ttft", "p50", "p99"), _cell(p, "tpot", "p50"),
               _cell(p, "e2e", "p50", "p99"), f"{p.output_tokens_per_s:.0f}", _cache(p)]
        for m, limit in slos.items():
            v = p.slo_values[m]
            ok = v <= limit
            cell = Text(f"{number(v)} {'✓' if ok else '✗'}", style="green" if ok else "red")
            if m in p.slo_intervals:
                cell.append(f"\n{interval(*p.slo_intervals[m])}", style="dim")
            row.append(cell)
        if slos:
            row.append(number(p.goodput, "{:.3g}"))
        table.add_row(*row, style=None if p.label in sweep.curve else "dim")
    console.print(table)
    if sweep.price_per_hour:
        cost = _table(f"cost at ${sweep.price_per_hour:g}/hour",
                      ["point", "$ per million\noutput tokens", "$ per thousand\nrequests"])
        for p in ordered(sweep.points):
            if p.cost is not None:
                cost.add_row(p.label, money(p.cost.per_million_output_tokens),
                             money(p.cost.per_thousand_requests))
        console.print(cost)
    for line in sweep_answers(sweep):
        console.print(line)
    if warning := cache_warning(sweep):
        console.print(Text(f"! {warning}", style="yellow"))


def _cache(p: Point) -> str:
    return f"{100 * p.cached_share:.0f}%" if p.cached_share is not None else "–"


def cache_warning(sweep: SweepRecord) -> str | None:
    """When the server's prefix cache served its points unlike each other: their latencies
    are not on one curve."""
    shares = [p.cached_share for p in sweep.points if p.cached_share is not None]
    if len(shares) < 2 or max(shares) - min(shares) < CACHE_SPREAD:
        return None
    return (f"the prefix cache served {100 * min(shares):.0f}–{100 * max(shares):.0f}% of the "
            "points' prompt tokens: their latencies are flattered unequally (the curve and the "
            "SLO-max with them)")


def _cell(p: Point, metric: str, *quantiles: str) -> Text:
    """`p50 / p99` of a metric, a predicted point's intervals below."""
    values = p.latencies.get(metric, {})
    text = Text(" / ".join(number(values.get(q)) for q in quantiles))
    spans = p.latency_intervals.get(metric, {})
    if all(q in spans for q in quantiles):
        text.append("\n" + " / ".join(interval(*spans[q]) for q in quantiles), style="dim")
    return text


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
                  pad_edge=False)
    for i, column in enumerate(columns):
        table.add_column(column, justify="right" if i else "left", no_wrap=bool(i),
                         min_width=None if i else 10)
    return table


def slo_max_interval(sweep: SweepRecord) -> str | None:
    """The SLO-max's interval in words (None: none was made)."""
    best = sweep.slo_max
    if best is None or best.level is None:
        return None
    unit = sweep.points[0].unit if sweep.points else ""
    drawn = sweep.target.simulated
    span = (f"{_bound(best.lo, unit)} – {_bound(best.hi, unit)}" if best.lo != best.hi
            else f"{_bound(best.lo, unit)} in every {'draw' if drawn else 'case'}")
    how = ("the SLO-max of each draw of the points" if drawn else
           "the SLO-max with every point's SLO values at the ends of their CIs")
    return f"{100 * best.level:g}% interval: {span} ({how})"


def _bound(value: float | None, unit: str) -> str:
    """An end of the SLO-max's interval: a load, or where the sweep cannot say."""
    if not value:
        return "not met at the lowest load"
    return "met past the highest load" if math.isinf(value) else f"{value:.3g} {unit}"


def sweep_answers(sweep: SweepRecord) -> list[Text]:
    out = []
    knee = sweep.knee
    if knee:
        out.append(Text.assemble(("knee      ", "bold"), f"{knee.label} ({knee.achieved:.3g}"
                                 f" req/s achieved): from there to {knee.next} the "
                                 f"p{sweep.percentile:g} E2E from schedule grows "
                                 f"{number(knee.elasticity, '{:.1f}')}× as fast as throughput"))
    else:
        out.append(Text.assemble(("knee      ", "bold"), "not reached within the points measured"))
    best = sweep.slo_max
    if best:
        out.append(Text.assemble(("SLO-max   ", "bold"), best.statement))
        if (span := slo_max_interval(sweep)) is not None:
            out.append(Text(f"          {span}"))
        for side in ("passing", "failing"):
            ref = getattr(best, side)
            if ref is not None:
                out.append(Text(f"          {side}: {ref.run}", style="dim"))
        out += [Text(f"          note: {n}", style="yellow") for n in best.notes]
    else:
        out.append(Text.assemble(("SLO-max   ", "bold"), "no SLO given (--slo ttft=500ms ...)"))
    if sweep.slo_max_cost:
        c = sweep.slo_max_cost
        out.append(Text.assemble(("cost      ", "bold"),
                                 f"at the SLO-max, ${sweep.price_per_hour:g}/hour: "
                                 f"{money(c.per_million_output_tokens)} per million output "
                                 f"tokens, {money(c.per_thousand_requests)} per thousand "
                                 "requests"))
    stop = sweep.stop  # a message that opens with its reason says it once
    said = stop.message if stop.message.startswith(stop.reason) else \
        f"{stop.reason}: {stop.message}"
    out.append(Text.assemble(("stopped   ", "bold"), said))
    out.append(Text(f"          rule: {sweep.definitions.get('stop_rule', '')}", style="dim"))
    return out
