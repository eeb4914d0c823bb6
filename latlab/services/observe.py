"""`latlab observe`: a service's own traffic explained from its spans, as a run folder.

    result = run_observe(ObserveConfig(otlp_port=4318, duration_s=600))
    result.summary.percentile("e2e", "p99"), result.analysis.findings, result.windows

Spans arrive (OTLP/HTTP, or a file of exported ones), are grouped per trace and each LLM call
becomes a record (`load.telemetry.observer`), appended to requests.jsonl as it completes; the
calls are analysed a window at a time (`observe_windows`), each window once the watermark
(`load.telemetry.watermark`) says every call that started in it is in. At the end (the
duration, the file's end, Ctrl-C) what is still waiting is explained with the spans it has,
and the folder is finished like a bench run's: summary.json, report.html, the run store,
plus the traffic as a replayable trace (trace.jsonl, latlab's trace rows) and the synthetic
workload fitted to it (config.json → `bench`, what `latlab bench --config FOLDER` reruns;
`latlab predict --replay FOLDER` replays the calls themselves).

Python's cyclic garbage collector is paused while spans come in (`load.workers.collector`):
the spans waiting for their traces to complete live for seconds, so every young collection
walked and promoted all of them and the full ones came often, a quarter of the intake's CPU;
spans, traces and calls make no reference cycles, and what piles up regardless is collected
at most once a refresh (`sweep_if_piled`).
"""

from __future__ import annotations

import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from latlab import __version__
from latlab.analysis import RunAnalysis, analyze
from latlab.analysis.findings import Finding
from latlab.load.telemetry.observer import Observer
from latlab.load.telemetry.trace_wait import TraceWait
from latlab.load.telemetry.watermark import EXPORT_DELAY_NS, Watermark
from latlab.load.workers.collector import collector_paused
from latlab.metrics.summary import RunContext, summarize
from latlab.metrics.workload_fit import fit_workload
from latlab.records.columns import present
from latlab.records.config import Clock, RunConfig, Target
from latlab.records.files import write_json
from latlab.records.folder import RunFolder
from latlab.records.observe import (
    OBSERVE_JSON,
    TRACE_JSONL,
    ObserveConfig,
    ObservedWindow,
    ObserveRecord,
    trace_rows,
)
from latlab.records.spans import SPANS, SpanJoin
from latlab.records.summary import RunSummary
from latlab.records.target import redact
from latlab.records.window import run_window
from latlab.report.html import write_html
from latlab.services.errors import InputError
from latlab.services.observe_intake import (
    TAKE_CALLS,
    Live,
    Session,
    Spans,
    follow,
    from_file,
    json_line,
    listen,
)
from latlab.services.observe_memory import release
from latlab.services.observe_notes import notes_on
from latlab.services.observe_scratch import clear_stale
from latlab.services.observe_windows import Windows
from latlab.store import RunStore, key_numbers


@dataclass
class ObserveResult:
    run: RunFolder
    record: ObserveRecord
    summary: RunSummary
    analysis: RunAnalysis | None
    windows: list[ObservedWindow]
    peak: Finding | None = None  # latency against rate over the windows
    unsupported_peak: Finding | None = None  # ... found over the windows, not over all calls
    cleared: list[Path] = field(default_factory=list)  # run folders a killed observe left


def run_observe(config: ObserveConfig, *, stop: threading.Event | None = None,
                view: Callable[[Live], None] | None = None,
                command: Sequence[str] | None = None, store: Path | None = None
                ) -> ObserveResult:
    """Observe until the duration, the file's end or `stop` (the command sets it on Ctrl-C),
    then finish the folder. Raises `InputError` for a file it cannot open or a port it
    cannot listen on (before any folder is made)."""
    stop = stop or threading.Event()
    if config.from_file is not None and not config.from_file.is_file():
        raise InputError(f"--from {config.from_file}: no such file")
    mark = Watermark(EXPORT_DELAY_NS, int(config.max_lateness_s * 1e9))
    wait = TraceWait(None if config.trace_wait_s is None else int(config.trace_wait_s * 1e9))
    spans = Spans(Observer(wait, config.max_pending_spans, mark))
    receiver = None if config.from_file is not None else listen(config, spans)
    try:
        cleared = clear_stale(config.out)
        run = RunFolder.create(config.out, config.name)
        settings = RunConfig(
            kind="observed", latlab_version=__version__,
            command=shlex.join(redact(command if command is not None else sys.argv)),
            name=run.path.name, tags=config.tags, observe=config, slos=config.slos,
            target=Target(otlp_endpoint=receiver.endpoint if receiver else None),
            clock=Clock(perf_counter_ns=0, unix_time=0.0))
        run.write_config(settings)
        windows = Windows(run, settings, int(config.window_s * 1e9), mark.bound_ns,
                          since_ns=None if receiver is None else time.time_ns())
        with windows, run.record_writer() as writer, collector_paused(), \
                (open(run.path / SPANS, "ab") if config.keep_spans else nullcontext()) as kept:
            spans.file = kept
            session = Session(run, settings, config, spans, windows, writer, stop)
            if receiver is None:
                from_file(session)
            else:
                follow(session, receiver, view)
                receiver.__exit__(None, None, None)
                receiver = None
            session.take(0, final=True)
    finally:
        if receiver is not None:
            receiver.__exit__(None, None, None)
    stopped = ("stopped" if stop.is_set() else
               "end of file" if config.from_file is not None else "duration")
    result = _finish(session, stopped, store)
    result.cleared = cleared
    return result


def _finish(s: Session, stop_reason: str, store: Path | None) -> ObserveResult:
    """The folder completed: the clock and the fitted workload in config.json, summary.json,
    trace.jsonl, observe.json, report.html, the run store. Every call is read (a batch at a
    time into the run's kept columns, mapped: `RunFolder.read_table`), and everything is
    computed over all of them, exactly."""
    run, settings, o = s.run, s.settings, s.observer
    release()  # what the intake freed, before the calls are read
    table = run.read_table()
    s.windows.check(table)
    starts, ends = table.origin_ns[present(table.origin_ns)], table.end_ns[present(table.end_ns)]
    record = s.record()
    if len(starts):
        t0, end = int(starts.min()), int(max(ends.max(initial=0), starts.max())) + 1
        settings.clock = Clock(perf_counter_ns=t0, unix_time=t0 / 1e9, t0_ns=t0, end_ns=end)
        settings.duration_s = (end - t0) / 1e9
        fitted = fit_workload(table, max(1.0, round(settings.duration_s)), s.config.name)
        if fitted is not None:
            settings.bench, record.workload_flags = fitted
    if o.models:
        settings.target.model = o.models.most_common(1)[0][0]
    run.write_config(settings)
    record.notes = notes_on(record)
    summary = summarize(table, run_window(settings, table), settings.slos or None,
                        context=RunContext(stop_reason=stop_reason, notes=record.notes))
    summary.spans = SpanJoin(spans=o.spans, requests_joined=o.calls, requests_with_trace=o.calls,
                             sources=dict(o.sources), notes=record.notes)
    run.write_summary(summary)
    rows = trace_rows(table)
    with open(run.path / TRACE_JSONL, "wb") as f:
        while chunk := list(islice(rows, TAKE_CALLS)):
            f.write(b"".join([json_line(row) for row in chunk]))
    write_json(run.path / OBSERVE_JSON, record)
    with RunStore(store or s.config.out) as runs:
        runs.register(run.path, "observed", settings, key_numbers(summary), summary)
    analysis, calls = None, len(table)
    del table, starts, ends, rows  # `analyze` reads the run again: not two copies at once
    release()
    if calls:
        analysis = analyze(run)
        write_html(run, analysis)
    return ObserveResult(run, record, summary, analysis, s.windows.kept, s.windows.peak,
                         s.windows.unsupported_peak)


