"""`latlab predict --check RUN...`: predict measured runs from their own settings — not from
their requests: the prediction a user would have made before running them — and set what
was measured against the predicted value and its interval, percentile by percentile.

    runs = measured_runs(["runs/…-bench-a", "7"], Path("runs"))   # folders, or store ids
    checks = [c for run in runs for c in check_run(run, cal, Fleet(), Intervals())]
    coverage(checks)   # the share of (run, metric, percentile) inside the intervals
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from latlab.metrics.summary import summarize
from latlab.records.calibration import Calibration
from latlab.records.folder import RunFolder, RunFolderError
from latlab.records.simulation import Fleet
from latlab.records.window import run_window
from latlab.services.errors import InputError
from latlab.services.predict import settings
from latlab.services.predict_intervals import (
    Intervals,
    attach,
    reseeded,
    run_draws,
    runs_for,
)
from latlab.sim.calibrate_run import CalibrationError, run_folders
from latlab.sim.fleet import simulate
from latlab.sim.folder import on_clock
from latlab.sim.table import request_table
from latlab.store import resolve_run

CHECKED = ("ttft", "tpot", "e2e")
UNSTREAMED = ("e2e",)
PERCENTILES = ("p50", "p90", "p99")


@dataclass
class Checked:
    """One percentile of one run: measured, predicted and the interval."""

    run: str
    load: str
    metric: str
    percentile: str
    measured: float
    predicted: float
    lo: float
    hi: float

    @property
    def inside(self) -> bool:
        return self.lo <= self.measured <= self.hi

    @property
    def decides(self) -> bool:
        """Whether the interval could have missed: one that reaches ∞ (a queue the
        simulation saw grow) holds any measurement, so it decides nothing."""
        return not math.isinf(self.hi)

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1 if self.measured else float("nan")


def measured_runs(refs: Sequence[str], runs_dir: Path) -> list[RunFolder]:
    """The bench runs `refs` name: run folders, sweep folders (their points), store ids."""
    try:
        return run_folders([resolve_run(ref, runs_dir) for ref in refs])
    except (RunFolderError, CalibrationError) as e:
        raise InputError(f"--check: {e}") from None


def check_run(run: RunFolder, cal: Calibration, fleet: Fleet, intervals: Intervals
              ) -> list[Checked]:
    """Predict `run` from its bench settings (its load, workload, seed, length and window)
    and compare its percentiles with the prediction's."""
    try:
        config = run.read_config()
        measured = run.read_summary()
        if measured is None:
            table = run.read_table()
            measured = summarize(table, run_window(config, table))
    except (RunFolderError, ValidationError, OSError) as e:
        raise InputError(f"--check {run.path}: {e}") from None
    bench = config.bench
    if bench is None:
        raise InputError(f"--check {run.path}: not a bench run (no bench settings)")
    workload_for = reseeded(bench, max(bench.requests or 0, measured.requests, 1))
    workload = workload_for(0)
    predicted = on_clock(settings(bench, cal, "check", fleet), workload)
    result = simulate(workload, cal, fleet)
    table = request_table(result, workload.ensure(len(result)), workload.config.api)
    summary = summarize(table, run_window(predicted, table), bench.slos or None)
    outcomes = run_draws(cal, workload_for, fleet, predicted, intervals,
                         runs=runs_for(workload, intervals))
    summary = attach(summary, outcomes, intervals, cal)
    a = bench.arrivals
    load = f"{a.rate:g} req/s" if a.open_loop and a.rate else (
        "trace" if a.open_loop else f"{a.users} users")
    out = []
    # Without streaming the measured TTFT is the whole answer's time (E2E) and there is no
    # TPOT: only E2E is the same quantity on both sides.
    for metric in CHECKED if bench.stream else UNSTREAMED:
        for name in PERCENTILES:
            m, p = measured.latency.get(metric), summary.latency.get(metric)
            if m is None or p is None or m[name] is None or p[name] is None:
                continue
            q = p.percentiles[name]
            out.append(Checked(str(run.path), load, metric, name, m[name], q.value,
                               q.lo if q.lo is not None else q.value,
                               q.hi if q.hi is not None else q.value))
    return out


def coverage(checks: Sequence[Checked]) -> float:
    """The share of the checks whose interval decides (a finite one) that hold the measured
    value; nan when none decides."""
    deciding = [c for c in checks if c.decides]
    return sum(c.inside for c in deciding) / len(deciding) if deciding else float("nan")
