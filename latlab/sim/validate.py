"""How well a calibration predicts a measured run: replay the run's requests (their scheduled
times and lengths) on the simulated server and compare the percentiles."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from latlab.metrics.request import metric_columns
from latlab.metrics.stats import percentiles
from latlab.metrics.throughput import inside
from latlab.records.calibration import Calibration
from latlab.records.catalog import metrics
from latlab.records.columns import present
from latlab.records.folder import RunFolder
from latlab.records.simulation import Fleet
from latlab.records.table import RequestTable
from latlab.records.window import Window, run_window
from latlab.sim.fleet import simulate
from latlab.sim.workload import replay

METRICS = metrics(curve=True)
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


def _measured(t: RequestTable, chosen: np.ndarray) -> dict[str, dict[float, float]]:
    """The run's own TTFT, TPOT, E2E percentiles over the `chosen` requests."""
    m = metric_columns(t)
    return _quantiles({name: (v := getattr(m, name))[chosen & ~np.isnan(v)]
                       for name in METRICS})


def _quantiles(values: dict[str, np.ndarray]) -> dict[str, dict[float, float]]:
    return {name: dict(zip(QUANTILES, percentiles(v.copy(), QUANTILES))) if len(v)
            else dict.fromkeys(QUANTILES, math.nan) for name, v in values.items()}


def _predicted(calibration: Calibration, run: RunFolder, origin: np.ndarray,
               window: Window | None, fleet: Fleet | None) -> dict[str, dict[float, float]]:
    """Replay the run on the calibrated server: the same percentiles over the same window
    (the requests scheduled inside it; `origin`: the run's requests' origins, sorted)."""
    result = simulate(replay(run), calibration, fleet)
    chosen = np.ones(len(result), bool)
    if window is not None and len(origin) == len(result):
        chosen = inside(origin, window)
    return _quantiles({name: ms[chosen & ~np.isnan(ms)]
                       for name, ms in result.latencies_ms().items() if name in METRICS})


def compare(calibration: Calibration, run: RunFolder, fleet: Fleet | None = None) -> Comparison:
    """The run's measured percentiles and the calibration's prediction of them, from one
    read of its records."""
    t = run.read_table()
    window = run_window(run.read_config(), t)
    chosen = t.ok if window is None else t.ok & inside(t.origin_ns, window)
    origin = np.sort(t.origin_ns[present(t.origin_ns)])
    return Comparison(str(run.path), int(chosen.sum()), _measured(t, chosen),
                      _predicted(calibration, run, origin, window, fleet))
