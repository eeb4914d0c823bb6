"""Sessions and reasoning streams over a run's records: TTFT turn by turn, how long sessions
took, an agent task's split into model, tool and orchestration time, and the reasoning phase
of streams that mark it."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

from latlab.metrics.stats import distribution
from latlab.records.summary import ReasoningSummary, SessionSummary, TurnStats
from latlab.records.timeline import RequestTimeline, ms_between


def by_session(records: Sequence[RequestTimeline]) -> dict[str, list[RequestTimeline]]:
    """Each session's records in turn order (requests outside sessions left out)."""
    sessions: dict[str, list[RequestTimeline]] = defaultdict(list)
    for r in records:
        if r.session is not None:
            sessions[r.session.id].append(r)
    return {k: sorted(v, key=lambda r: r.session.turn) for k, v in sessions.items()}


def complete(session: Sequence[RequestTimeline]) -> bool:
    """Whether every planned turn of the session ran and succeeded."""
    turns = session[0].session.turns
    return ([r.session.turn for r in session] == list(range(1, turns + 1))
            and all(r.ok for r in session))


def duration_ms(session: Sequence[RequestTimeline]) -> float | None:
    """First request scheduled → last request done."""
    return ms_between(session[-1].done_ns, session[0].origin_ns)


def tool_ms(r: RequestTimeline) -> float:
    """The tool step before `r` (0 without one)."""
    s = r.session
    return (ms_between(s.tool_end_ns, s.tool_start_ns) or 0.0) if s is not None else 0.0


def gap_ms(r: RequestTimeline) -> float:
    """From the session's previous request's end to `r`'s schedule (0 for a first turn)."""
    s = r.session
    return (ms_between(r.scheduled_ns, s.after_ns) or 0.0) if s is not None else 0.0


def session_summary(records: Sequence[RequestTimeline]) -> SessionSummary | None:
    """The sessions of `records` (a run's window): None when there are none."""
    sessions = by_session(records)
    if not sessions:
        return None
    kind = next(iter(sessions.values()))[0].session.kind
    done = [s for s in sessions.values() if complete(s)]
    summary = SessionSummary(
        kind=kind, sessions=len(sessions), complete=len(done),
        turns_mean=float(np.mean([s[0].session.turns for s in sessions.values()])),
        duration=distribution(duration_ms(s) for s in done),
        per_turn=per_turn(records))
    if kind == "chat":
        summary.think = distribution(gap_ms(r) for s in sessions.values() for r in s[1:])
    elif done:
        model = [sum(ms_between(r.done_ns, r.origin_ns) for r in s) for s in done]
        tools = [sum(tool_ms(r) for r in s) for s in done]
        summary.model_ms, summary.tool_ms = float(np.mean(model)), float(np.mean(tools))
        summary.orchestration_ms = float(np.mean([duration_ms(s) - m - t for s, m, t
                                                  in zip(done, model, tools)]))
    return summary


def per_turn(records: Sequence[RequestTimeline]) -> list[TurnStats]:
    """TTFT, prompt tokens and cached share of each turn's successful requests."""
    turns: dict[int, list[RequestTimeline]] = defaultdict(list)
    for r in records:
        if r.session is not None and r.ok:
            turns[r.session.turn].append(r)
    out = []
    for turn in sorted(turns):
        rs = turns[turn]
        prompts = [r.prompt_tokens if r.prompt_tokens is not None else r.prompt_tokens_planned
                   for r in rs]
        prompts = [p for p in prompts if p is not None]
        cached = [(r.cached_tokens, r.prompt_tokens) for r in rs
                  if r.cached_tokens is not None and r.prompt_tokens]
        out.append(TurnStats(
            turn=turn, n=len(rs), ttft=distribution(ms_between(r.first_token_ns, r.sent_ns)
                                                    for r in rs),
            prompt_tokens=float(np.mean(prompts)) if prompts else None,
            cached_share=(sum(c for c, _ in cached) / sum(p for _, p in cached)
                          if cached else None)))
    return out


def reasoning_summary(records: Sequence[RequestTimeline]) -> ReasoningSummary | None:
    """The successful streams that marked reasoning tokens; None when none did."""
    rs = [r for r in records if r.ok and r.first_reasoning_ns is not None
          and r.sent_ns is not None and r.done_ns is not None]
    if not rs:
        return None
    thinking = [ms_between(r.first_answer_ns or r.done_ns, r.first_reasoning_ns) for r in rs]
    shares = [t / max(ms_between(r.done_ns, r.sent_ns), 1e-9) for t, r in zip(thinking, rs)]
    return ReasoningSummary(
        n=len(rs), ttfr=distribution(ms_between(r.first_reasoning_ns, r.sent_ns) for r in rs),
        ttfa=distribution(ms_between(r.first_answer_ns, r.sent_ns) for r in rs),
        thinking=distribution(thinking), thinking_share=float(np.mean(shares)))
