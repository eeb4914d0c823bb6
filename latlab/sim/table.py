"""A simulation's requests as the columns the analysis reads (`RequestTable`), built from
the simulator's columns at once — no record per request — so that a summary of every
simulated request (`metrics.summary.summarize`) costs what the measured run's does.

    table = request_table(result, workload.ensure(len(result)), api="completions")
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from latlab.records.table import RequestTable
from latlab.sim.results import BASE_NS, OK, SimResult
from latlab.sim.results import OUTCOMES as SIM_OUTCOMES
from latlab.sim.workload import Lengths


def _ns(seconds: np.ndarray) -> pa.Array:
    missing = np.isnan(seconds)
    values = BASE_NS + np.rint(np.nan_to_num(seconds) * 1e9).astype(np.int64)
    return pa.array(values, type=pa.int64(), mask=missing)


def _counts(values: np.ndarray, ok: np.ndarray) -> pa.Array:
    return pa.array(values, type=pa.int64(), mask=~ok | (values < 0))


def token_stamps(result: SimResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every token's arrival at the client (s) in request order, the tokens each event
    carried, and each request's offsets into them."""
    c = result.columns
    n = len(result)
    ok = c.outcome[:n] == OK
    # the preempted (several runs of steps) and the speculative (several tokens a step)
    special = {int(i): result.token_events(int(i)) for i in {*c.runs, *c.events}
               if i < n and ok[i]}
    events = np.where(ok, c.last_step - c.first_step + 1, 0)
    for i, (steps, _) in special.items():
        events[i] = len(steps)
    offsets = np.concatenate([[0], np.cumsum(events)]).astype(np.int64)
    stamps = np.empty(int(offsets[-1]))
    counts = np.ones(len(stamps), dtype=np.int32)
    plain = ok.copy()
    plain[list(special)] = False
    for r in range(len(result.replicas)):
        rows = np.flatnonzero(plain & (c.replica == r))
        if not len(rows):
            continue
        ends = result.step_ends(r) + result.net
        length = events[rows]
        total = int(length.sum())
        within = np.arange(total) - np.repeat(np.cumsum(length) - length, length)
        stamps[np.repeat(offsets[rows], length) + within] = ends[np.repeat(c.first_step[rows],
                                                                          length) + within]
    for i, (steps, tokens) in special.items():
        stamps[offsets[i]:offsets[i + 1]] = result.step_ends(int(c.replica[i]))[steps] + result.net
        counts[offsets[i]:offsets[i + 1]] = tokens
    return stamps, counts, offsets


def request_table(result: SimResult, lengths: Lengths, api: str, tokens: bool = True
                  ) -> RequestTable:
    """The simulated requests as columns; without `tokens`, no token events (the per-token
    metrics then have no samples)."""
    c = result.columns
    n = len(result)
    ok = c.outcome[:n] == OK
    first, last = result.first_last_token()
    names = [str(SIM_OUTCOMES[int(o)][0]) for o in range(len(SIM_OUTCOMES))]
    if tokens:
        stamps, counts, offsets = token_stamps(result)
    else:
        stamps, counts, offsets = np.empty(0), np.empty(0, np.int32), np.zeros(n + 1, np.int64)
    stamp_ns = BASE_NS + np.rint(stamps * 1e9).astype(np.int64)
    columns = {
        "index": pa.array(np.arange(n)), "api": pa.array([api] * n, pa.string()),
        "tenant": pa.array(lengths.tenant[:n], pa.string()),
        "priority": pa.array(lengths.priority[:n], pa.int64()),
        "prompt_tokens_planned": pa.array(c.prompt), "prompt_tokens": pa.array(c.prompt),
        "scheduled_ns": _ns(c.scheduled), "sent_ns": _ns(c.sent),
        "headers_ns": _ns(np.where(ok, c.engine_in + result.net, np.nan)),
        "first_token_ns": _ns(first), "last_token_ns": _ns(last),
        "usage_ns": _ns(np.where(ok, c.done, np.nan)), "done_ns": _ns(c.done),
        "outcome": pa.array([names[o] for o in c.outcome.tolist()], pa.string()),
        "status": pa.array([SIM_OUTCOMES[o][1] for o in c.outcome.tolist()], pa.int64()),
        "cached_tokens": _counts(c.cached, ok), "completion_tokens": _counts(c.output, ok),
        "tokens_from_usage": pa.array(ok),
        "token_ns": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                             pa.array(stamp_ns)),
        "token_counts": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                                 pa.array(counts, pa.int32())),
    }
    if c.session_kind is not None:
        columns["session"] = _sessions(result, n)
    return RequestTable.from_arrow(pa.table(columns))


def _sessions(result: SimResult, n: int) -> pa.StructArray:
    c = result.columns
    inside = c.session[:n] >= 0
    ns = {name: _ns(np.where(inside, getattr(c, name)[:n], np.nan))
          for name in ("after", "tool_start", "tool_end")}
    return pa.StructArray.from_arrays(
        [pa.array([f"sim-s{s}" for s in c.session[:n].tolist()]), pa.array(c.turn[:n]),
         pa.array(c.turns[:n]), pa.array([c.session_kind] * n), ns["after"],
         ns["tool_start"], ns["tool_end"], pa.nulls(n, pa.string())],
        names=["id", "turn", "turns", "kind", "after_ns", "tool_start_ns", "tool_end_ns",
               "tool_error"], mask=pa.array(~inside))
