"""Terminal output of `latlab compare`: the changes, where they came from, the budgets."""

from __future__ import annotations

import time

from rich import box
from rich.console import Console
from rich.table import Table

from latlab.analysis.budget import Budget
from latlab.analysis.compare import Change, Comparison
from latlab.analysis.decompose import BUCKETS, LABELS
from latlab.store import StoredRun
from latlab.units import cell, number

VERDICT_STYLE = {"better": "green", "worse": "red", "same": "dim", "can't tell": "yellow"}
UNCHANGED_MS = 1.0
UNCHANGED_SHARE = 0.05


SHOWN_STATS = ("p50", "p99")


def print_comparison(console: Console, comparison: Comparison, a_name: str, b_name: str,
                     full: bool = False) -> None:
    """B against A; `full` shows every statistic (mean, p50, p90, p99), else p50 and p99."""
    console.print(f"[bold]A[/] = {a_name}\n[bold]B[/] = {b_name}")
    for difference in comparison.workload_differences:
        console.print(f"[yellow]workloads differ:[/] {difference}")
    for condition in comparison.conditions:
        console.print(f"[yellow]the sides ran unlike:[/] {condition}", highlight=False)
    shown = [c for c in comparison.changes
             if full or c.unit != "ms" or c.key.split("_")[0] in SHOWN_STATS]
    table = Table(title="B against A", title_justify="left")
    for column in ("metric", "A", "B", "change", "interval of change", "verdict"):
        table.add_column(column, justify="left" if column in ("metric", "verdict") else "right")
    for change in shown:
        style = VERDICT_STYLE[change.verdict]
        why = f" [dim]({change.why})[/]" if change.why and change.verdict != "same" else ""
        table.add_row(change.label, _value(change.a, change.unit), _value(change.b, change.unit),
                      _delta(change), _interval(change), f"[{style}]{change.verdict}[/]{why}")
    console.print(table)
    if comparison.evidence:
        console.print(f"[dim]verdicts rest on {comparison.evidence}; same means inside the "
                      "minimum effect (--min-effect) with confidence[/]", highlight=False)
    lines = [attribution_line(c) for c in shown
             if c.verdict in ("better", "worse") and c.attribution]
    if lines:
        console.print("\n[bold]Where the changes come from[/] (components of the requests at "
                      "each statistic)")
        for line in lines:
            console.print(f"  {line}")
    for name, (a, b) in comparison.budgets.items():
        if a is not None and b is not None:
            console.print()
            console.print(_budget_table(f"{name} budget (ms)", a, b))


def attribution_line(change: Change) -> str:
    """`p99 TTFT -38% (-52.1 ms): queue -41.0 ms, network +2.0 ms; prefill unchanged`."""
    delta = change.delta or 0.0
    floor = max(UNCHANGED_MS, UNCHANGED_SHARE * abs(delta))
    moved = sorted(((c, d) for c, d in change.attribution.items() if abs(d) >= floor),
                   key=lambda item: -abs(item[1]))
    same = [LABELS[c] for c, d in change.attribution.items() if abs(d) < floor]
    parts = ", ".join(f"{LABELS[c]} {d:+.1f} ms" for c, d in moved) or "no single component"
    rel = f"{100 * change.relative:+.0f}% " if change.relative is not None else ""
    tail = f"; {', '.join(same)} unchanged" if same else ""
    return f"{change.label} {rel}({delta:+.1f} ms): {parts}{tail}"


def _budget_table(title: str, a: Budget, b: Budget) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("bucket", "A", "B", "change"):
        table.add_column(column, justify="left" if column == "bucket" else "right")
    for bucket in BUCKETS:
        va, vb = _measured(a, bucket), _measured(b, bucket)
        if va or vb:
            change = f"{vb - va:+.1f}" if va is not None and vb is not None else "–"
            table.add_row(bucket, number(va, "{:.1f}"), number(vb, "{:.1f}"), change)
    table.add_row("total", f"{a.total:.1f}", f"{b.total:.1f}", f"{b.total - a.total:+.1f}",
                  style="bold")
    return table


def _measured(b: Budget, bucket: str) -> float | None:
    """A bucket's mean, None when none of its components was measured."""
    return b.bucket(bucket) if b.measured(bucket) else None


def _value(value: float | None, unit: str) -> str:
    return number(value, "{:.2f}" if unit in ("req/s", "%") else "{:.1f}")


def _delta(change: Change) -> str:
    if change.delta is None:
        return "–"
    rel = f" ({100 * change.relative:+.0f}%)" if change.relative is not None else ""
    return f"{change.delta:+.2f}{rel}" if change.unit in ("req/s", "%") else f"{change.delta:+.1f}{rel}"


def _interval(change: Change) -> str:
    """The interval of B / A − 1 and its confidence."""
    iv = change.interval
    if iv is None:
        return "–"
    return f"[{100 * iv.low:+.0f}%, {100 * iv.high:+.0f}%] {100 * iv.confidence:.3g}%"


def print_runs(console: Console, runs: list[StoredRun], filtered: bool = False) -> None:
    """`latlab runs`: one row per stored run, newest first; long names and targets fold
    onto a second line rather than being cut."""
    if not runs:
        console.print("no stored run matches" if filtered else
                      "no runs stored yet (run `latlab bench`, or `latlab runs --rescan`)")
        return
    table = Table(title="runs", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("id", "when", "name", "target", "model", "ok", "TTFT p50", "TTFT p99",
                   "E2E p99", "tok/s"):
        table.add_column(column, justify="right" if column in _NUMERIC else "left",
                         no_wrap=column in ("id", "when"), overflow="fold")
    for run in runs:
        n = run.numbers
        when = time.strftime("%m-%d %H:%M", time.localtime(run.created)) if run.created else ""
        kind = "" if run.kind == "bench" else f"{run.kind}: "
        name = kind + (run.name or "") + "".join(f" #{t}" for t in run.tags)
        ok = ("did not start" if run.status == "did not start" else
              f"{n['ok'] or 0}/{n['requests'] or 0}" + ("" if run.status == "ok"
                                                       else f" {run.status}"))
        table.add_row(str(run.id), when, name, run.target or "", run.model or "", ok,
                      cell(n["ttft_p50"]), cell(n["ttft_p99"]), cell(n["e2e_p99"]),
                      cell(n["output_tokens_per_s"]))
    console.print(table)


_NUMERIC = {"id", "ok", "TTFT p50", "TTFT p99", "E2E p99", "tok/s"}
