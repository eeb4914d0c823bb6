"""Terminal output for sessions: the turn-by-turn table, the reasoning phase, and an agent
task's budget (model calls by bucket, tool steps, orchestration; per step)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from latlab.analysis.tasks import TaskBudget
from latlab.records.summary import RunSummary
from latlab.units import cell, ms, pct

MAX_TURN_ROWS = 12  # a long conversation shows its first and last turns


def session_lines(s: RunSummary) -> list[Text | Table]:
    """The sessions line and turn table, and the reasoning line, of a summary."""
    out: list[Text | Table] = []
    ss = s.sessions
    if ss is not None:
        what = "chats" if ss.kind == "chat" else "agent tasks"
        line = (f"sessions    {ss.sessions} {what} · {ss.complete} complete · "
                f"{ss.turns_mean:.1f} {'turns' if ss.kind == 'chat' else 'steps'} each")
        if ss.duration.n:
            line += (f" · duration p50 {ms(ss.duration['p50'])} p99 "
                     f"{ms(ss.duration['p99'])}")
        if ss.think is not None and ss.think.n:
            line += f" · think mean {ms(ss.think.mean)}"
        out.append(Text(line))
        table = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold")
        for column in ("  turn" if ss.kind == "chat" else "  step", "n", "prompt tok",
                       "cached", "TTFT p50", "p90", "p99"):
            table.add_column(column, justify="right")
        rows = ss.per_turn
        if len(rows) > MAX_TURN_ROWS:
            rows = rows[: MAX_TURN_ROWS // 2] + rows[-MAX_TURN_ROWS // 2:]
        for t in rows:
            table.add_row(str(t.turn), str(t.n), cell(t.prompt_tokens),
                          pct(t.cached_share) if t.cached_share is not None else "–",
                          *(cell(t.ttft[p]) for p in ("p50", "p90", "p99")))
        out.append(table)
    r = s.reasoning
    if r is not None:
        out.append(Text(f"reasoning   {r.n} streams · first reasoning token p50 "
                        f"{ms(r.ttfr['p50'])} · first answer token p50 {ms(r.ttfa['p50'])} · "
                        f"thinking p50 {ms(r.thinking['p50'])}, {pct(r.thinking_share)} "
                        "of E2E"))
    return out


def print_tasks(console: Console, tasks: TaskBudget) -> None:
    """The mean agent task's budget, and per step."""
    console.print(Text("Where an agent task's time goes", style="bold"),
                  Text(f"(first call scheduled → last answer; {tasks.n} complete tasks)",
                       style="dim"))
    table = Table(box=None, padding=(0, 1), pad_edge=False, show_header=False)
    table.add_column()
    table.add_column(justify="right")
    table.add_column(justify="right")
    share = (lambda v: pct(v / tasks.total)) if tasks.total else (lambda v: "–")
    table.add_row("  task", ms(tasks.total), "")
    table.add_row("  model calls", ms(tasks.model_total), share(tasks.model_total))
    for name, value in tasks.model.items():
        table.add_row(f"    {name}", ms(value), share(value))
    table.add_row("  tool steps", ms(tasks.tool), share(tasks.tool))
    table.add_row("  orchestration", ms(tasks.orchestration), share(tasks.orchestration))
    console.print(table)
    steps = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    names = list(tasks.model)
    for column in ("  step", "n", "tool before", "orchestration", "model call", *names):
        steps.add_column(column, justify="right")
    for st in tasks.steps:
        steps.add_row(str(st.step), str(st.n), ms(st.tool) if st.step > 1 else "–",
                      ms(st.orchestration) if st.step > 1 else "–", ms(st.model.total),
                      *(ms(st.model.bucket(b)) for b in names))
    console.print(steps)
