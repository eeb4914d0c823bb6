"""Sessions and reasoning streams over a run's columns: TTFT turn by turn, how long sessions
took, an agent task's split into model, tool and orchestration time, and the reasoning phase
of streams that mark it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latlab.metrics.stats import distribution
from latlab.records.columns import ms_between, present
from latlab.records.summary import ReasoningSummary, SessionSummary, TurnStats
from latlab.records.table import RequestTable


def tool_ms(t: RequestTable) -> np.ndarray:
    """The tool step before each request (0 without one; NaN outside sessions)."""
    tool = np.nan_to_num(ms_between(t.step["tool_end_ns"], t.step["tool_start_ns"]))
    return np.where(t.has_session, tool, np.nan)


def gap_ms(t: RequestTable) -> np.ndarray:
    """From the session's previous request's end to each request's schedule (0 for a first
    turn; NaN outside sessions)."""
    gap = np.nan_to_num(ms_between(t.scheduled_ns, t.step["after_ns"]))
    return np.where(t.has_session, gap, np.nan)


@dataclass(eq=False)
class Sessions:
    """The sessions among some requests: `order` their indices by session, then turn;
    session k is `order[starts[k]:starts[k + 1]]`; `complete`: every planned turn ran and
    succeeded."""

    order: np.ndarray
    starts: np.ndarray
    complete: np.ndarray

    def __len__(self) -> int:
        return len(self.starts) - 1

    def first(self) -> np.ndarray:
        return self.order[self.starts[:-1]]

    def last(self) -> np.ndarray:
        return self.order[self.starts[1:] - 1]

    def sums(self, values: np.ndarray) -> np.ndarray:
        """`values` (per request) summed over each session."""
        return np.add.reduceat(values[self.order], self.starts[:-1]) if len(self) else values[:0]

    def members(self, which: np.ndarray) -> np.ndarray:
        """The requests of the sessions `which` (a mask over sessions), in session order."""
        return self.order[np.repeat(which, np.diff(self.starts))]


def sessions_of(t: RequestTable, chosen: np.ndarray) -> Sessions:
    """The sessions of the requests `chosen` (a mask), each in turn order, in the order they
    first appear."""
    idx = np.flatnonzero(chosen & t.has_session)
    if not len(idx):
        return Sessions(idx, np.zeros(1, np.int64), np.zeros(0, bool))
    codes = t.session.codes[idx]
    _, first = np.unique(codes, return_index=True)
    rank = np.empty(len(t.session.names) + 1, np.int64)
    rank[codes[np.sort(first)]] = np.arange(len(first))
    order = idx[np.lexsort((t.step["turn"][idx], rank[codes]))]
    sorted_codes = t.session.codes[order]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(sorted_codes)) + 1, [len(order)]])
    turn = t.step["turn"][order]
    position = np.arange(len(order)) - np.repeat(starts[:-1], np.diff(starts))
    in_place = (turn == position + 1) & t.ok[order]  # turn k at place k, and it succeeded
    whole = np.minimum.reduceat(in_place, starts[:-1])
    complete = whole.astype(bool) & (np.diff(starts) == t.step["turns"][order[starts[:-1]]])
    return Sessions(order, starts.astype(np.int64), complete)


def session_summary(t: RequestTable, chosen: np.ndarray, ttft: np.ndarray
                    ) -> SessionSummary | None:
    """The sessions of the requests `chosen` (a run's window): None when there are none;
    `ttft` is each request's."""
    s = sessions_of(t, chosen)
    if not len(s):
        return None
    kind = t.step_kind[int(s.order[0])]
    duration = ms_between(t.done_ns[s.last()], t.origin_ns[s.first()])
    summary = SessionSummary(
        kind=kind, sessions=len(s), complete=int(s.complete.sum()),
        turns_mean=float(np.mean(t.step["turns"][s.first()])),
        duration=distribution(duration[s.complete]),
        per_turn=per_turn(t, chosen, ttft))
    if kind == "chat":
        later = np.ones(len(s.order), bool)
        later[s.starts[:-1]] = False  # a session's first request has no think time before it
        summary.think = distribution(gap_ms(t)[s.order[later]])
    elif s.complete.any():
        model = s.sums(ms_between(t.done_ns, t.origin_ns))[s.complete]
        tools = s.sums(tool_ms(t))[s.complete]
        summary.model_ms, summary.tool_ms = float(np.mean(model)), float(np.mean(tools))
        summary.orchestration_ms = float(np.mean(duration[s.complete] - model - tools))
    return summary


def per_turn(t: RequestTable, chosen: np.ndarray, ttft: np.ndarray) -> list[TurnStats]:
    """TTFT, prompt tokens and cached share of each turn's successful requests."""
    rows = chosen & t.has_session & t.ok
    prompts = np.where(np.isnan(t.prompt_tokens), t.prompt_tokens_planned, t.prompt_tokens)
    cached = ~np.isnan(t.cached_tokens) & (np.nan_to_num(t.prompt_tokens) != 0)
    out = []
    for turn in np.unique(t.step["turn"][rows]):
        at = rows & (t.step["turn"] == turn)
        known = prompts[at & ~np.isnan(prompts)]
        shared = at & cached
        out.append(TurnStats(
            turn=int(turn), n=int(at.sum()), ttft=distribution(ttft[at]),
            prompt_tokens=float(np.mean(known)) if len(known) else None,
            cached_share=(float(t.cached_tokens[shared].sum() / t.prompt_tokens[shared].sum())
                          if shared.any() else None)))
    return out


def reasoning_summary(t: RequestTable, chosen: np.ndarray) -> ReasoningSummary | None:
    """The successful streams among `chosen` that marked reasoning tokens; None when none
    did."""
    rs = (chosen & t.ok & present(t.first_reasoning_ns) & present(t.sent_ns)
          & present(t.done_ns))
    if not rs.any():
        return None
    answer = np.where(present(t.first_answer_ns), t.first_answer_ns, t.done_ns)
    thinking = ms_between(answer, t.first_reasoning_ns)[rs]
    shares = thinking / np.maximum(ms_between(t.done_ns, t.sent_ns)[rs], 1e-9)
    return ReasoningSummary(
        n=int(rs.sum()), ttfr=distribution(ms_between(t.first_reasoning_ns, t.sent_ns)[rs]),
        ttfa=distribution(ms_between(t.first_answer_ns, t.sent_ns)[rs]),
        thinking=distribution(thinking), thinking_share=float(np.mean(shares)))
