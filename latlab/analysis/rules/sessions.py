"""Rules about sessions and what sits around the model: TTFT that grows turn by turn (the
history re-prefilled), an agent's tool steps, an application's own spans."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from latlab.analysis.advice import Advice, joined, prefix_caching
from latlab.analysis.decompose import label
from latlab.analysis.findings import Finding, Severity, Unevaluated
from latlab.units import ms, pct

if TYPE_CHECKING:
    from latlab.analysis.run_analysis import RunAnalysis

MIN_TURN_REQUESTS = 3  # a turn's TTFT p50 counts with this many requests
TTFT_GROWTH, TTFT_GROWTH_MS = 2.0, 10.0
CACHED_ENOUGH = 0.5  # a later turn with this share of its prompt cached is not re-prefilled
TOOL_SHARE = 0.3
APPLICATION_SHARE = 0.25


def ttft_grows_with_turns(a: RunAnalysis) -> Finding | Unevaluated | None:
    s = a.summary.sessions
    if s is None:
        return None  # not a session run: nothing to say
    turns = [t for t in s.per_turn if t.n >= MIN_TURN_REQUESTS and t.ttft["p50"] is not None]
    if len(turns) < 2:
        return Unevaluated("ttft_grows_with_turns", f"needs ≥ {MIN_TURN_REQUESTS} successful "
                                                    "requests at two turns or more")
    first, last = turns[0], turns[-1]
    turn = "turn" if s.kind == "chat" else "step"
    growth = last.ttft["p50"] / max(first.ttft["p50"], 1e-9)
    if growth < TTFT_GROWTH or last.ttft["p50"] - first.ttft["p50"] < TTFT_GROWTH_MS:
        return None
    evidence = [f"TTFT p50 {ms(first.ttft['p50'])} at {turn} {first.turn} → "
                f"{ms(last.ttft['p50'])} at {turn} {last.turn} ({growth:.1f}×)"]
    if first.prompt_tokens and last.prompt_tokens:
        evidence.append(f"prompts grow from {first.prompt_tokens:.0f} to "
                        f"{last.prompt_tokens:.0f} tokens: every turn resends the history")
    prefill = _prefill_by_turn(a, first.turn, last.turn)
    if prefill is not None:
        evidence.append(f"server prefill {ms(prefill[0])} at {turn} {first.turn} → "
                        f"{ms(prefill[1])} at {turn} {last.turn}")
    cached = last.cached_share
    if cached is not None:
        evidence.append(f"{pct(cached)} of {turn} {last.turn}'s prompt tokens came from the "
                        "server's prefix cache")
    if cached is not None and cached >= CACHED_ENOUGH:
        return Finding("ttft_grows_with_turns", Severity.INFO,
                       f"TTFT grows {growth:.1f}× by {turn} {last.turn} though the history "
                       "is cached", evidence, where="the part of each prompt that is new, and "
                       "queueing behind longer contexts",
                       fix="shorter histories (summarise old turns), more KV-cache memory",
                       impact=1 - 1 / growth)
    return Finding("ttft_grows_with_turns", Severity.WARNING,
                   f"TTFT grows {growth:.1f}× by {turn} {last.turn}: the history is "
                   "re-prefilled",
                   evidence, where="prefill of the conversation's history, again every turn",
                   impact=1 - 1 / growth, metric=("ttft", "p50"),
                   **_fix(prefix_caching(a, "the history (its KV blocks kept between turns)"),
                          "shorter histories (or more KV-cache memory, so the cached history "
                          "stays)"))


def _fix(*parts: Advice | str | None) -> dict[str, object]:
    fix, tries = joined(*parts)
    return {"fix": fix, "tries": tries}


def _prefill_by_turn(a: RunAnalysis, first: int, last: int) -> tuple[float, float] | None:
    """The mean server prefill of the measured successful requests at turns `first` and
    `last`; None when either has none."""
    t = a.table
    prefill = t.server["prefill"]
    timed = a.ok & t.has_session & t.has_server & ~np.isnan(prefill)
    means = []
    for turn in (first, last):
        at = prefill[timed & (t.step["turn"] == turn)]
        if not len(at):
            return None
        means.append(float(at.mean()))
    return means[0], means[1]


def tool_time(a: RunAnalysis) -> Finding | None:
    s = a.summary.sessions
    if s is None or s.kind != "agent" or not s.complete or not s.duration.mean:
        return None
    share = (s.tool_ms or 0.0) / s.duration.mean
    if share < TOOL_SHARE:
        return None
    return Finding("tool_time", Severity.WARNING,
                   f"the tools, not the model: tool steps take {pct(share)} of a task",
                   [f"a task takes {ms(s.duration.mean)} on average ({s.complete} complete): "
                    f"model calls {ms(s.model_ms)}, tool steps {ms(s.tool_ms)}, orchestration "
                    f"{ms(s.orchestration_ms)}"],
                   where="the tool steps between model calls",
                   fix="faster or cached tools, tool calls in parallel, fewer steps per task",
                   impact=share)


def application_time(a: RunAnalysis) -> Finding | None:
    if a.mean is None or not a.mean.application():
        return None
    share = a.mean.share("application")
    if share < APPLICATION_SHARE:
        return None
    top = a.mean.application()[0]
    model = sum(a.mean.bucket(b) for b in ("prefill", "decode", "prefill + decode (unsplit)"))
    evidence = [f"{label(c)}: {ms(a.mean.components[c])} ({pct(a.mean.share(c))} of the mean, "
                f"{pct(a.tail.share(c))} of the p99 tail)" for c in a.mean.application()[:3]]
    evidence.append(f"the model's prefill + decode: {ms(model)} "
                    f"({pct(model / a.mean.total if a.mean.total else 0)})")
    return Finding("application_time", Severity.WARNING,
                   f"the application, not only the model: its {label(top)} takes "
                   f"{pct(a.mean.share(top))} of every request", evidence,
                   where=f"the application's {label(top)} (its own spans)",
                   fix="cache or precompute it, an approximate index or a closer store, run "
                       "it alongside the model call where it allows",
                   impact=share)
