"""The end of `latlab observe`: once its last window has closed, the run folder finished over
every call of the run, exactly, whatever the run's length: the windows checked against all
the calls, the clock and the fitted workload in config.json, summary.json, trace.jsonl,
observe.json, the run store, and report.html from the run's analysis.

Every column it reads or makes is a file's mapping (`records.spill`): the run's own columns
(`requests.columns/`, read-only), and each column derived from them (the metrics, the
decomposition, the in-flight counts, ...) written to a scratch folder of the run a block of
calls at a time as it is made. After each step (and each rule and chart of the report) the
pages read are given back, so what is resident at once is what one step reads, not the
run's every column: a step holds its own intermediate columns (a sort's, a percentile's
copy of one column, a mask), a few bytes a call, and the run's columns stay on disk.

    result = finish(run, settings, config, windows, record, join, model, "duration", store)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import orjson

from latlab.analysis import RunAnalysis, analyze
from latlab.analysis.analyze import derived
from latlab.analysis.findings import Finding
from latlab.metrics.request import metric_columns
from latlab.metrics.summary import RunContext, summarize
from latlab.metrics.workload_fit import fit_workload
from latlab.records.columns import present
from latlab.records.config import Clock, RunConfig
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
from latlab.records.spans import SpanJoin
from latlab.records.spill import Spill
from latlab.records.summary import RunSummary
from latlab.records.table import RequestTable
from latlab.records.window import run_window
from latlab.report.html import write_html
from latlab.services.observe_memory import release
from latlab.services.observe_notes import notes_on
from latlab.services.observe_scratch import END_SCRATCH
from latlab.services.observe_windows import Windows
from latlab.store import RunStore, key_numbers

TRACE_ROWS = 2000  # trace.jsonl's rows written at a time


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


def finish(run: RunFolder, settings: RunConfig, config: ObserveConfig, windows: Windows,
           record: ObserveRecord, join: SpanJoin, model: str | None, stop_reason: str,
           store: Path | None, step: Callable[[str], None] = lambda name: None
           ) -> ObserveResult:
    """The folder completed (see the module's docstring) from what the intake saw: its
    `record` (observe.json), how its spans joined, the model most called; `step` is told
    each step's name as it ends (the benchmark's measure)."""
    release()  # what the intake freed, before the calls are read
    with Spill(run.path / END_SCRATCH) as spill:
        table = run.read_table(read_only=True)
        spill.adopt(table)
        derived(table, spill)
        step("read the calls")
        windows.check(table)
        spill.give_back()
        step("check the windows")
        _clock(settings, config, record, table)
        if model is not None:
            settings.target.model = model
        run.write_config(settings)
        spill.give_back()
        step("fit the workload")
        record.notes = notes_on(record)
        summary = summarize(table, run_window(settings, table), settings.slos or None,
                            context=RunContext(stop_reason=stop_reason, notes=record.notes),
                            metrics=metric_columns(table, spill), spill=spill)
        summary.spans = join.model_copy(update={"notes": record.notes})
        run.write_summary(summary)
        spill.give_back()
        step("summary")
        _trace(run, table, spill)
        step("trace.jsonl")
        write_json(run.path / OBSERVE_JSON, record)
        with RunStore(store or config.out) as runs:
            runs.register(run.path, "observed", settings, key_numbers(summary), summary)
        calls = len(table)
        del table  # `analyze` maps the run again
        release()
        step("run store")
        analysis = None
        if calls:
            analysis = analyze(run, spill=spill)
            step("report's analysis")
            write_html(run, analysis)
            step("report.html")
    return ObserveResult(run, record, summary, analysis, windows.kept, windows.peak,
                         windows.unsupported_peak)


def json_line(data: object) -> bytes:
    """`data` as a JSON line of its own size: orjson's bytes keep its whole output buffer
    (16 KB), so the 2,000 lines taken at a time held 32 MB instead of 2."""
    return bytes(memoryview(orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE)))


def _clock(settings: RunConfig, config: ObserveConfig, record: ObserveRecord,
           table: RequestTable) -> None:
    """The run's clock and length from its calls, and the workload fitted to them."""
    starts, ends = table.origin_ns, table.end_ns
    started, ended = present(starts), present(ends)
    if not started.any():
        return
    t0 = int(starts[started].min())
    end = int(max(ends[ended].max(initial=0), starts[started].max())) + 1
    del started, ended
    settings.clock = Clock(perf_counter_ns=t0, unix_time=t0 / 1e9, t0_ns=t0, end_ns=end)
    settings.duration_s = (end - t0) / 1e9
    fitted = fit_workload(table, max(1.0, round(settings.duration_s)), config.name)
    if fitted is not None:
        settings.bench, record.workload_flags = fitted


def _trace(run: RunFolder, table: RequestTable, spill: Spill) -> None:
    """trace.jsonl, `TRACE_ROWS` rows at a time, the pages they read given back after each."""
    rows = trace_rows(table)
    with open(run.path / TRACE_JSONL, "wb") as f:
        while chunk := list(islice(rows, TRACE_ROWS)):
            f.write(b"".join([json_line(row) for row in chunk]))
            spill.give_back()
