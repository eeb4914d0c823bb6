"""`latlab observe` on the terminal: the live view while it runs (on a terminal redrawn in
place, piped one line per closed window) and what it ends with."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group
from rich.live import Live as RichLive
from rich.text import Text

from latlab.analysis.findings import Finding
from latlab.records.observe import TRACE_JSONL, ObservedWindow
from latlab.report.budget_bars import print_budget
from latlab.report.console import print_findings, print_summary
from latlab.report.palette import SEVERITY_COLORS
from latlab.units import ms, pct


class LiveView:
    """Draws each live state (`services.observe.Live`): in place on a terminal, else the
    windows as they close."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._live = RichLive(console=console, auto_refresh=False, transient=False) \
            if console.is_terminal else None
        self._windows = 0

    def __enter__(self) -> LiveView:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    def __call__(self, state: Any) -> None:
        if self._live is not None:
            self._live.update(render(state), refresh=True)
        elif state.record.windows > self._windows and state.last is not None:
            self.console.print(window_line(state.last), highlight=False)
        self._windows = state.record.windows


def render(state: Any) -> Group:
    r, roll = state.record, state.rolling
    head = (f"observing {state.endpoint} · {state.elapsed_s:,.0f} s · {r.spans:,} spans · "
            f"{r.calls:,} calls · {state.pending_spans:,} spans waiting"
            + (f" · {r.rejected:,} rejected" if r.rejected else ""))
    lines = [Text(head, style="bold"),
             Text(f"last {roll.seconds:g} s: {roll.rate:.3g} calls/s · TTFT p50 "
                  f"{ms(roll.ttft.p50)} p99 {ms(roll.ttft.p99)} · E2E p50 {ms(roll.e2e.p50)} "
                  f"p99 {ms(roll.e2e.p99)}" + (f" · {roll.failed} failed" if roll.failed else ""))]
    if state.provisional is not None:
        p = state.provisional
        lines.append(Text(f"window {_time(p.start_ns)}: {p.calls:,} calls so far (provisional: "
                          f"waiting up to {r.lag_s:.0f} s for late spans)", style="dim"))
    if state.last is not None:
        lines.append(Text(f"window {_clock(state.last)} (final): " + budget_text(state.last)))
        lines += [_finding(f.severity, f.title) for f in state.last.findings]
    if isinstance(state.peak, Finding):
        lines.append(_finding(str(state.peak.severity), state.peak.title))
    return Group(*lines)


def window_line(w: ObservedWindow) -> str:
    """One window in a line: its calls, rate, TTFT and E2E, budget and findings."""
    marks = (", partial" if w.partial else "") + (f", {w.late:,} late" if w.late else "")
    line = (f"{_clock(w)} {w.calls:,} calls ({w.rate:.3g}/s{marks}) "
            f"· TTFT p50 {ms(w.ttft.p50)} p99 {ms(w.ttft.p99)} · E2E p50 {ms(w.e2e.p50)} "
            f"p99 {ms(w.e2e.p99)}")
    if w.shares:
        line += " · " + budget_text(w)
    if w.findings:
        line += " · " + "; ".join(f.title for f in w.findings)
    return line


def budget_text(w: ObservedWindow) -> str:
    shares = sorted(w.shares.items(), key=lambda kv: -kv[1])
    return " · ".join(f"{name} {pct(share)}" for name, share in shares if share > 0) or "–"


def print_observed(console: Console, result: Any) -> None:
    """The observed run (`services.observe.ObserveResult`) as any run ends (summary, budget,
    findings), then its windows, the trace and the fitted workload, and what was left out."""
    r = result.record
    console.print(Text(f"{r.spans:,} spans in {r.traces:,} traces from {r.source}: "
                       f"{r.calls:,} LLM calls", style="bold"))
    if r.calls:
        console.print(f"streamed: {r.streamed:,} · not streamed: {r.not_streamed:,} · unknown "
                      f"(their spans do not say): {r.stream_unknown:,}", highlight=False)
    for note in r.notes:
        console.print(f"note: {note}", style="yellow", highlight=False)
    for folder in result.cleared:
        console.print(f"note: removed the scratch files (open windows, the end's columns) an "
                      f"observe killed before it finished left in {folder} (its calls are all "
                      "in its requests.jsonl)",
                      style="yellow", highlight=False)
    if result.analysis is None:
        return
    print_summary(console, result.summary, result.run.path)
    console.print()
    print_budget(console, result.analysis)
    console.print()
    print_findings(console, result.analysis, unevaluated=False)
    if result.peak is not None and all(f.rule != "peak_hours" for f in result.analysis.findings):
        console.print(_finding(str(result.peak.severity), result.peak.title + " (by window)"))
    if result.unsupported_peak is not None:
        console.print(f"  (the windows as written read \"{result.unsupported_peak.title}\", but "
                      "not over all their calls, the late ones included: left out)",
                      style="dim", highlight=False)
    if result.windows:
        console.print()
        console.print(Text(f"Windows ({len(result.windows)}, windows.jsonl)", style="bold"))
        for w in result.windows[-10:]:
            console.print(f"  {window_line(w)}", highlight=False)
    console.print()
    console.print(f"trace: {result.run.path / TRACE_JSONL} (replay it: latlab bench --trace)",
                  highlight=False)
    if r.workload_flags:
        console.print("fitted workload: latlab bench " + " ".join(r.workload_flags),
                      highlight=False)
        console.print(f"  (or latlab bench --config {result.run.path}; latlab predict "
                      f"--replay {result.run.path})", highlight=False, style="dim")
    console.print(f"report: {result.run.report_path}", highlight=False)


def _finding(severity: str, title: str) -> Text:
    return Text.assemble("  ", (f" {severity} ", f"bold white on {SEVERITY_COLORS[severity]}"),
                         " ", title)


def _clock(w: ObservedWindow) -> str:
    return _time(w.start_ns)


def _time(unix_ns: int) -> str:
    return datetime.fromtimestamp(unix_ns / 1e9, UTC).strftime("%H:%M:%S")
