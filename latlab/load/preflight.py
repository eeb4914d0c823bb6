"""What is checked before a run sends anything: a replayed trace's window read through, and
every prompt fitting the server's context."""

from __future__ import annotations

from rich.console import Console

from latlab.load import BenchError
from latlab.load.workload.requests import Workload
from latlab.load.workload.traces import survey
from latlab.records.bench import BenchConfig

FIT_CHECK_REQUESTS = 1000  # requests drawn to check that prompts fit the context


def survey_trace(config: BenchConfig, console: Console | None) -> list[str]:
    """Read the trace's window through before anything starts; say what it holds."""
    a = config.arrivals
    window = survey(a, config.duration_s, config.requests)
    if not window.requests:
        raise BenchError(f"--trace {a.trace}: no request in the window (--trace-start "
                         f"{a.trace_start_s:g} s is past the trace's end?)")
    if console is not None:
        scale = f", lengths ×{a.length_scale:g}" if window.lengths and a.length_scale != 1 else ""
        console.print(f"replaying {window.requests:,} requests of {a.trace} ({window.format}) "
                      f"over {window.span_s:,.1f} s (×{a.trace_speed:g} speed{scale})",
                      style="dim", markup=False, highlight=False)
    return [f"--trace: {window.skipped}"] if window.skipped else []


def fit_context(workload: Workload, config: BenchConfig, context: int | None) -> None:
    """Fit every request into the server's context (its output is shortened where needed);
    `BenchError` before anything is sent when prompts alone do not fit."""
    if context is None:
        return
    config.workload.context_tokens = context  # the same object as workload.config
    count = min(config.requests or FIT_CHECK_REQUESTS, FIT_CHECK_REQUESTS)
    over, longest, count = workload.prompts_too_long(count)
    if over:
        lower = ("--length-scale" if config.arrivals.process == "trace"
                 and workload.trace.first.row.prompt_tokens is not None else "--prompt-tokens")
        raise BenchError(f"{over} of the first {count} prompts (up to {longest} tokens) leave no "
                         f"room for output in the server's context of {context} tokens: lower "
                         f"{lower}, or serve a longer context")
