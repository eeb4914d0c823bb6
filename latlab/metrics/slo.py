"""Whether a request met its service-level objectives (parsed by `records.config.parse_slo`)."""

from __future__ import annotations

import numpy as np

from latlab.metrics.request import MetricColumns, RequestMetrics


def slo_value(m: RequestMetrics | MetricColumns, metric: str):
    """The value an SLO on `metric` judges (per request of columns): the request's largest
    token gap for `itl`."""
    return m.itl_max if metric == "itl" else getattr(m, metric)


def meets_slos(m: RequestMetrics | MetricColumns, slos: dict[str, float]):
    """True when every SLO holds (per request of columns); a metric undefined for the
    request (TPOT of 1 token) holds."""
    met = np.True_
    for name, limit in slos.items():
        met = met & ~(np.asarray(slo_value(m, name), dtype=float) > limit)
    return met
