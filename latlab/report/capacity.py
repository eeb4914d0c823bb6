"""Terminal output of the capacity commands: the sweep's points and answers, the cold-start
runs and idle gaps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text


def print_sweep(console: Console, sweep: dict[str, Any], folder: Path) -> None:
    """The table of points (in order of load; the points beside the curve dimmed), their
    cost, and the answers."""
    q = f"p{sweep['percentile']:g}"
    slos = sweep.get("slos") or {}
    points = sorted(sweep["points"], key=lambda p: (p["mode"] == "throughput", p["load"]))
    knee = (sweep.get("knee") or {}).get("label")
    table = _table(f"sweep {folder.name} (latencies in ms; ◆ the knee)",
                   ["point", "achieved\nreq/s", "errors", "TTFT\np50 / p99", "TPOT\np50",
                    "E2E\np50 / p99", "output\ntok/s",
                    *(f"{q} {m}\n≤ {limit:g}" for m, limit in slos.items()),
                    *(["goodput\nreq/s"] if slos else [])])
    for p in points:
        lat = p["latencies"]
        row = [p["label"] + (" ◆" if p["label"] == knee else "")
               + (" (interrupted)" if p["interrupted"] else ""),
               f"{p['achieved']:.3g}", f"{100 * p['error_rate']:.1f}%",
               f"{number(lat['ttft']['p50'])} / {number(lat['ttft']['p99'])}",
               number(lat["tpot"]["p50"]),
               f"{number(lat['e2e']['p50'])} / {number(lat['e2e']['p99'])}",
               f"{p['output_tokens_per_s']:.0f}"]
        for m, limit in slos.items():
            v = p["slo_values"][m]
            ok = v != "inf" and v <= limit
            row.append(Text(f"{number(v)} {'✓' if ok else '✗'}", style="green" if ok else "red"))
        if slos:
            row.append(number(p["goodput"], "{:.3g}"))
        table.add_row(*row, style=None if p["label"] in sweep["curve"] else "dim")
    console.print(table)
    if sweep.get("price_per_hour"):
        cost = _table(f"cost at ${sweep['price_per_hour']:g}/hour",
                      ["point", "$ per million\noutput tokens", "$ per thousand\nrequests"])
        for p in points:
            cost.add_row(p["label"], money(p["cost"]["per_million_output_tokens"]),
                         money(p["cost"]["per_thousand_requests"]))
        console.print(cost)
    for line in sweep_answers(sweep):
        console.print(line)


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
                  pad_edge=False)
    for i, column in enumerate(columns):
        table.add_column(column, justify="right" if i else "left", no_wrap=bool(i),
                         min_width=None if i else 10)
    return table


def sweep_answers(sweep: dict[str, Any]) -> list[Text]:
    out = []
    knee = sweep.get("knee")
    if knee:
        e = "∞" if knee["elasticity"] == "inf" else f"{knee['elasticity']:.1f}"
        out.append(Text.assemble(("knee      ", "bold"), f"{knee['label']} ({knee['achieved']:.3g}"
                                 f" req/s achieved): from there to {knee['next']} the "
                                 f"p{sweep['percentile']:g} E2E from schedule grows {e}× as fast "
                                 "as throughput"))
    else:
        out.append(Text.assemble(("knee      ", "bold"), "not reached within the points measured"))
    best = sweep.get("slo_max")
    if best:
        out.append(Text.assemble(("SLO-max   ", "bold"), best["statement"]))
        for side in ("passing", "failing"):
            if best.get(side):
                out.append(Text(f"          {side}: {best[side]['run']}", style="dim"))
        out += [Text(f"          note: {n}", style="yellow") for n in best.get("notes") or []]
    else:
        out.append(Text.assemble(("SLO-max   ", "bold"), "no SLO given (--slo ttft=500ms ...)"))
    if sweep.get("slo_max_cost"):
        c = sweep["slo_max_cost"]
        out.append(Text.assemble(("cost      ", "bold"),
                                 f"at the SLO-max, ${sweep['price_per_hour']:g}/hour: "
                                 f"{money(c['per_million_output_tokens'])} per million output "
                                 f"tokens, {money(c['per_thousand_requests'])} per thousand "
                                 "requests"))
    stop = sweep["stop"]
    out.append(Text.assemble(("stopped   ", "bold"), f"{stop['reason']}: {stop['message']}"))
    out.append(Text(f"          rule: {sweep['definitions']['stop_rule']}", style="dim"))
    return out


def print_coldstart(console: Console, result: dict[str, Any], folder: Path) -> None:
    """One row per start, the cold excess with its spread, and the idle-gap probe."""
    table = Table(title=f"cold start {folder.name} (ms; warm = median of the requests after "
                        "the first)", title_justify="left")
    for column in ("run", "ready (s)", "first TTFT", "warm TTFT", "TTFT excess", "first E2E",
                   "warm E2E", "E2E excess"):
        table.add_column(column, justify="right")
    for r in result["runs"]:
        if r.get("error"):
            table.add_row(str(r["run"]), number(r.get("ready_s"), "{:.2f}"),
                          Text(r["error"], style="red"), *[""] * 5)
            continue
        first, warm, excess = r["first"], r["warm"], r["excess"]
        table.add_row(str(r["run"]), f"{r['ready_s']:.2f}", number(first["ttft"]),
                      number(warm["ttft"]), number(excess["ttft"], "{:+.0f}"), number(first["e2e"]),
                      number(warm["e2e"]), number(excess["e2e"], "{:+.0f}"))
    s = result["summary"]
    table.add_section()
    columns = (("ready_s", "{:.2f}"), ("first_ttft", "{:.0f}"), ("warm_ttft", "{:.0f}"),
               ("excess_ttft", "{:+.0f}"), ("first_e2e", "{:.0f}"), ("warm_e2e", "{:.0f}"),
               ("excess_e2e", "{:+.0f}"))
    for stat in ("median", "min", "max"):
        table.add_row(stat, *(number(s[key][stat], fmt) for key, fmt in columns),
                      style="bold" if stat == "median" else "dim")
    console.print(table)
    if result["idle"]:
        idle = Table(title="idle-gap probe: the next request after the server sat idle "
                           "(excess over the same run's warm median, ms)", title_justify="left")
        for column in ("idle gap", "TTFT", "TTFT excess", "E2E", "E2E excess"):
            idle.add_column(column, justify="right")
        for g in result["idle"]:
            idle.add_row(f"{g['gap_s']:g} s", _spread(g["ttft"]),
                         _spread(g["excess_ttft"], "{:+.0f}"), _spread(g["e2e"]),
                         _spread(g["excess_e2e"], "{:+.0f}"))
        console.print(idle)


def _spread(s: dict[str, float | None] | None, fmt: str = "{:.0f}") -> str:
    if not s or s.get("median") is None:
        return "–"
    if s["n"] == 1:
        return fmt.format(s["median"])
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}, {fmt.format(s['max'])}]"


def number(value: Any, fmt: str = "{:.0f}") -> str:
    if value is None:
        return "–"
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "∞"
    return fmt.format(value)


def money(value: float | None) -> str:
    return "–" if value is None else f"${value:.3g}"
