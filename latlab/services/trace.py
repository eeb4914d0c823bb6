"""`latlab trace`: a trace's window characterised (`profile_trace`), and written as a
Mooncake-style JSONL without text (`export_trace`) — from any trace latlab reads, a run folder
included, so a run's traffic can be shared without its prompts.

    profile = profile_trace(TraceConfig(arrivals={"trace": "conversation_trace.jsonl"}))
    profile.rate, profile.sharing.cacheable_share, profile.flags

The export's rows: `timestamp` (ms from the window's first request, at --trace-speed),
`input_length`, `output_length`, `hash_ids` (the trace's blocks, renumbered from 0 in order of
first use; 512 tokens each), and latlab's `session`, `turn`, `tenant`, `priority` where known,
and `api` where the trace says which API a request used (its `input_length` is then the
server's count, the model's whole input: a replay through a chat API does not add its chat
template to it again).
"""

from __future__ import annotations

from pathlib import Path

import orjson

from latlab.load.workload.traces import block_tokens, replay_window, scaled
from latlab.metrics.traffic import TrafficProfile
from latlab.records.trace import TraceConfig, TraceProfile
from latlab.services.errors import InputError


def profile_trace(config: TraceConfig) -> TraceProfile:
    """The window's traffic as `--trace` with the same settings would replay it."""
    a = config.arrivals
    trace, rows = replay_window(a, config.duration_s, config.requests)
    profile = TrafficProfile(block_tokens(a.length_scale))
    for replayed in rows:
        row = replayed.row
        profile.add(replayed.offset_s,
                    None if row.prompt_tokens is None else scaled(row.prompt_tokens,
                                                                   a.length_scale),
                    None if row.output_tokens is None else scaled(row.output_tokens,
                                                                   a.length_scale),
                    row.hash_ids, row.session)
    if not len(profile.times):
        raise InputError(f"--trace {a.trace}: no request in the window (--trace-start "
                         f"{a.trace_start_s:g} s is past its end?)")
    return profile.profile(str(a.trace), trace.format, trace.describe_skipped())


def export_trace(config: TraceConfig, path: Path) -> int:
    """Write the window to `path` as Mooncake-style JSONL; the requests written."""
    a = config.arrivals
    trace, rows = replay_window(a, config.duration_s, config.requests)
    renumbered: dict[int, int] = {}
    count = 0
    try:
        with open(path, "wb") as out:
            for replayed in rows:
                row = replayed.row
                if row.prompt_tokens is None or row.output_tokens is None:
                    raise InputError(f"--trace {a.trace}: line {row.line} gives no prompt and "
                                     "output lengths: only its times could be exported")
                line = {"timestamp": round(replayed.offset_s * 1e3, 3),
                        "input_length": row.prompt_tokens, "output_length": row.output_tokens,
                        "hash_ids": [renumbered.setdefault(h, len(renumbered))
                                     for h in row.hash_ids or ()]}
                for name in ("session", "turn", "tenant", "priority", "api"):
                    if getattr(row, name) is not None:
                        line[name] = getattr(row, name)
                out.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
                count += 1
    except OSError as e:
        raise InputError(f"--export {path}: {e.strerror or e}") from None
    if not count:
        raise InputError(f"--trace {a.trace}: no request in the window to export")
    return count
