"""What `latlab predict` prints for the replicas a goal needs and for `--check`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from latlab.services.predict_check import Checked, coverage
from latlab.services.predict_intervals import Intervals, quantile
from latlab.services.predict_plans import Sizing
from latlab.services.replica_search import Count
from latlab.units import interval, number


def print_sizing(out: Console, s: Sizing) -> None:
    """The range, the count to provision and why, and every count tried."""
    g, level = s.goal, 100 * s.level
    tail = (1 - s.level) / 2
    goal = f"p{g.percentile:g} {g.metric} < {g.limit_ms:g} ms at {g.rate:g} req/s"
    span = f"{s.low}–{s.high}" if s.low != s.high else f"{s.high}"
    out.print(Text.assemble((f"{span} replicas", "bold"), f" ({s.fleet.router}) for {goal}: "
                            f"provision {s.high}"), highlight=False)
    why = [f"{s.point} meet it at the point estimate ({s.counts[s.point].value:.0f} ms)"]
    if s.counts[s.high].draws:
        why.append(f"{s.high} meet it in {_met(s.counts[s.high], g.limit_ms, s.worlds)} "
                   f"worlds drawn from the calibration's spread (at least "
                   f"{100 * (1 - tail):g}%: the {level:g}% interval's upper end is within the "
                   "goal)")
        if s.point < s.high:
            c = s.counts[s.point]
            missed = sum(v > g.limit_ms for v in c.draws)
            why.append(f"with {s.point} the goal is missed in {missed} of "
                       f"{len(c.draws)} worlds tried")
        if s.low < s.point:
            why.append(f"{s.low} would do in the most favourable {100 * tail:g}%")
    out.print("  " + "; ".join(why), highlight=False)
    if s.plateau is not None:
        p = s.plateau
        out.print(Text.assemble(
            ("  a plateau: ", "bold yellow"),
            f"from {p.replicas} replicas on, more leave p{g.percentile:g} {g.metric} at about "
            f"{number(p.floor)} ms, and only {100 * p.met:.0f}% of the drawn worlds meet the "
            f"goal: a latency floor (each request's own time), not capacity, decides. More "
            f"replicas will not make it; a limit of {number(p.limit_needed)} ms would hold in "
            f"all but {100 * tail:g}% of them, or the requests themselves must get faster "
            "(shorter prompts or outputs, a faster engine)."), highlight=False)
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for column in ("replicas", f"p{g.percentile:g} {g.metric} ms", f"{level:g}% interval",
                   "goal met in"):
        table.add_column(column, justify="right")
    for n in sorted(s.counts):
        c = s.counts[n]
        ok = c.value <= g.limit_ms
        whole = len(c.draws) == s.worlds
        span = (interval(quantile(c.draws, tail), quantile(c.draws, 1 - tail)) if whole
                else "–")
        met = _met(c, g.limit_ms, s.worlds) if c.draws else "–"
        table.add_row(str(n), Text(f"{number(c.value)} {'✓' if ok else '✗'}",
                                   style="green" if ok else "red"), span, met)
    out.print(table)
    out.print(f"run folder: {s.run.run.path} ({s.high} replicas)", highlight=False)


def _met(c: Count, limit: float, worlds: int) -> str:
    """How many drawn worlds meet the goal: a share of all of them, or, where the search
    stopped early (the answer was decided), of those it tried."""
    if len(c.draws) == worlds:
        return f"{100 * c.met(limit):.0f}% of {worlds}"
    meets = sum(v <= limit for v in c.draws)
    return f"{meets} of {len(c.draws)} tried (of {worlds})"


def sizing_json(s: Sizing) -> dict:
    plateau = None if s.plateau is None else {
        "replicas": s.plateau.replicas, "met": s.plateau.met, "floor_ms": s.plateau.floor,
        "limit_needed_ms": s.plateau.limit_needed}
    return {"goal": str(s.goal), "low": s.low, "high": s.high, "recommended": s.high,
            "plateau": plateau,
            "point_estimate": s.point, "level": s.level, "router": s.fleet.router,
            "run": str(s.run.run.path),
            "worlds": s.worlds,
            "counts": {str(n): {"value": c.value, "draws": c.draws,
                                "worlds": sorted(c.by_world),
                                "met": None if not c.draws else c.met(s.goal.limit_ms)}
                       for n, c in sorted(s.counts.items())}}


def print_checks(out: Console, checks: Sequence[Checked], intervals: Intervals) -> None:
    """Measured against predicted, percentile by percentile, and the coverage."""
    level = f"{100 * intervals.level:g}%"
    table = Table(title=f"measured against predicted from each run's settings ({level} "
                  f"intervals of {intervals.draws} draws; ms)", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for i, column in enumerate(("run", "load", "metric", "measured", "predicted", "error",
                                f"{level} interval", "")):
        table.add_column(column, justify="left" if i < 3 else "right")
    for c in checks:
        table.add_row(c.run.rsplit("/", 1)[-1], c.load, f"{c.metric} {c.percentile}",
                      number(c.measured), number(c.predicted), f"{100 * c.error:+.0f}%",
                      interval(c.lo, c.hi),
                      Text("∞: decides nothing", style="dim") if not c.decides
                      else Text("✓", style="green") if c.inside else Text("✗", style="red"))
    out.print(table)
    deciding = [c for c in checks if c.decides]
    inside = sum(c.inside for c in deciding)
    undecided = len(checks) - len(deciding)
    widths = [max(c.hi / c.predicted - 1, 1 - c.lo / c.predicted) for c in checks
              if c.predicted and not math.isinf(c.hi)]
    width = f"; half-width median ±{100 * np.median(widths):.0f}%" if widths else ""
    share = f"{100 * coverage(checks):.0f}%" if deciding else "–"
    out.print(Text.assemble(("coverage  ", "bold"), f"{inside} of {len(deciding)} "
                            f"({share}) measured percentiles inside the finite {level} "
                            f"intervals{width}"
                            + (f"; {undecided} more reach ∞ (a queue that may grow) and decide "
                               "nothing" if undecided else "")), highlight=False)
