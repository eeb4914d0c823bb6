"""How well a calibration predicts a measured run: replay the run's requests (their scheduled
times and lengths) on the simulated server and compare the percentiles."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from latlab.metrics.request import request_metrics
from latlab.metrics.stats import percentiles
from latlab.records.calibration import Calibration
from latlab.records.folder import RunFolder
from latlab.records.simulation import Fleet
from latlab.records.window import run_window
from latlab.sim.fleet import simulate
from latlab.sim.workload import replay

METRICS = ("ttft", "tpot", "e2e")
QUANTILES = (50.0, 99.0)


@dataclass
class Comparison:
    """Measured and predicted percentiles (ms) of one run, and their relative errors."""

    run: str
    requests: int
    measured: dict[str, dict[float, float]]
    predicted: dict[str, dict[float, float]]

    def error(self, metric: str, q: float) -> float:
        m, p = self.measured[metric][q], self.predicted[metric][q]
        return (p - m) / m if m and not math.isnan(m) and not math.isnan(p) else math.nan

    def line(self) -> str:
        parts = [f"{m} p{q:g} {self.measured[m][q]:.0f}→{self.predicted[m][q]:.0f} ms "
                 f"({100 * self.error(m, q):+.1f}%)" for m in METRICS for q in QUANTILES]
        return f"{self.requests} requests: " + ", ".join(parts)


def measured_percentiles(run: RunFolder) -> tuple[dict, int]:
    """The run's own TTFT, TPOT, E2E percentiles over its measurement window."""
    records = run.read_records()
    window = run_window(run.read_config(), records)
    chosen = [r for r in records if r.ok and (window is None or r.origin_ns in window)]
    metrics = [request_metrics(r) for r in chosen]
    values = {name: np.array([v for m in metrics if (v := getattr(m, name)) is not None],
                             dtype=float) for name in METRICS}
    return _quantiles(values), len(chosen)


def _quantiles(values: dict[str, np.ndarray]) -> dict[str, dict[float, float]]:
    return {name: dict(zip(QUANTILES, percentiles(v.copy(), QUANTILES))) if len(v)
            else dict.fromkeys(QUANTILES, math.nan) for name, v in values.items()}


def predicted_percentiles(calibration: Calibration, run: RunFolder,
                          fleet: Fleet | None = None) -> dict:
    """Replay the run on the calibrated server: the same percentiles over the same window
    (the requests scheduled inside it)."""
    workload = replay(run)
    config = run.read_config()
    result = simulate(workload, calibration, fleet)
    c = result.columns
    first, last = result.first_last_token()
    records = run.read_records()
    window = run_window(config, records)
    origin = np.sort([r.origin_ns for r in records if r.origin_ns is not None])
    inside = np.ones(len(result), bool)
    if window is not None and len(origin) == len(result):
        inside = (origin >= window.start_ns) & (origin < window.end_ns)
    ok = (c.outcome == 0) & inside
    tokens = c.output - 1
    values = {"ttft": (first - c.sent)[ok] * 1e3, "e2e": (c.done - c.sent)[ok] * 1e3,
              "tpot": ((last - first) / np.where(tokens > 0, tokens, np.nan))[ok & (tokens > 0)]
              * 1e3}
    return _quantiles(values)


def compare(calibration: Calibration, run: RunFolder, fleet: Fleet | None = None) -> Comparison:
    measured, n = measured_percentiles(run)
    return Comparison(str(run.path), n, measured, predicted_percentiles(calibration, run, fleet))
