"""A predicted run folder: a run folder like any other, marked simulated.

    config.json          kind "predict", `simulation` (calibration, fleet, what came out)
    requests.jsonl       the simulated requests as bench records them — all of them up to
                         `records` (default 20 000), else a random sample of that many
    all_requests.parquet every request, one row each (times, tokens, outcome, replica)
    summary.json         `latlab.metrics.summary.summarize` over every request

Above `records`, the summary is still over every request: `summarize` runs on their columns
without per-token stamps (`sim.table`: TTFT, TPOT, E2E, lateness, failures, goodput, rates),
and the per-token parts come from the sample's full records (ITL, inter-chunk gaps) and from
the simulated steps (output tokens per second) — writing and re-reading a million records
with 60 token stamps each would take longer than the simulation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from latlab.metrics.summary import RunContext, summarize
from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder
from latlab.records.summary import RunSummary
from latlab.records.window import run_window
from latlab.sim.results import BASE_NS, SimResult
from latlab.sim.table import request_table
from latlab.sim.workload import SimWorkload

RECORDS = 20_000
PER_TOKEN = ("itl", "itl_request_mean", "itl_max", "chunk_gap")


def write_run(result: SimResult, workload: SimWorkload, config: RunConfig, out: Path,
              name: str, records: int = RECORDS, notes: list[str] = ()) -> tuple[RunFolder,
                                                                               RunSummary]:
    """Write the predicted run folder of `result` under `out`; its summary."""
    run = RunFolder.create(out, name)
    n = len(result)
    lengths = workload.ensure(n)
    api = workload.config.api

    def timeline(i: int, tokens: bool = True):
        return result.timeline(i, api, tokens, lengths.tenant[i], lengths.priority[i])

    sample = np.arange(n) if n <= records else np.sort(
        np.random.default_rng(0).choice(n, records, replace=False))
    full = [timeline(int(i)) for i in sample]
    on_clock(config, workload)
    sim = config.simulation
    notes = [f"PREDICTED, not measured: simulated by latlab predict "
             f"({sim.calibration_fit or sim.calibration})", *notes]
    sim.records_total, sim.records_written = n, len(full)
    if n > records:
        sim.records_note = (f"requests.jsonl holds a random sample of {records} of the {n} "
                            "simulated requests; all_requests.parquet and summary.json cover "
                            "all of them")
    run.write_config(config)
    with run.record_writer() as writer:
        for r in full:
            writer.write(r)
    if n <= records:
        window = run_window(config, full)
        summary = summarize(full, window, config.slos or None,
                            context=RunContext(stop_reason="done", notes=notes))
    else:
        light = request_table(result, lengths, api, tokens=False)
        window = run_window(config, light)
        summary = summarize(light, window, config.slos or None, context=RunContext(
            stop_reason="done", notes=[*notes, sim.records_note]))
        per_token = summarize(full, window)
        for key in PER_TOKEN:
            summary.latency[key] = per_token.latency[key]
        if summary.throughput is not None and window is not None:
            t = summary.throughput
            tokens = result.tokens_in((window.start_ns - BASE_NS) / 1e9,
                                      (window.end_ns - BASE_NS) / 1e9) / window.duration_s
            t.total_tokens_per_s += tokens - t.output_tokens_per_s
            t.output_tokens_per_s = tokens
    run.write_summary(summary)
    write_parquet(result, run.path / "all_requests.parquet")
    return run, summary


def on_clock(config: RunConfig, workload: SimWorkload) -> RunConfig:
    """`config` with the simulated run's clock: from the simulation's t0 to the workload's
    duration, if it has one (where the measurement window is cut)."""
    config.clock.t0_ns = BASE_NS
    if workload.duration_s is not None:
        config.clock.end_ns = BASE_NS + int(workload.duration_s * 1e9)
    return config


def write_parquet(result: SimResult, path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    c = result.columns
    ms = result.latencies_ms()
    table = pa.table({
        "index": np.arange(len(result)), "replica": c.replica, "outcome": c.outcome,
        "scheduled_s": c.scheduled, "sent_s": c.sent, "done_s": c.done,
        "prompt_tokens": c.prompt, "cached_tokens": c.cached,
        "output_tokens": c.output,
        "ttft_ms": ms["ttft"], "tpot_ms": ms["tpot"], "e2e_ms": ms["e2e"],
        "queue_ms": (c.first_scheduled - c.engine_in) * 1e3, "preemptions": c.preemptions})
    pq.write_table(table, path)
    return path
