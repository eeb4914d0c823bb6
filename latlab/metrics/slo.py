"""Whether a request met its service-level objectives (parsed by `records.config.parse_slo`)."""

from __future__ import annotations

from latlab.metrics.request import RequestMetrics


def slo_value(m: RequestMetrics, metric: str) -> float | None:
    """The value an SLO on `metric` judges: the request's largest token gap for `itl`."""
    return m.itl_max if metric == "itl" else getattr(m, metric)


def meets_slos(m: RequestMetrics, slos: dict[str, float]) -> bool:
    """True when every SLO holds; a metric undefined for the request (TPOT of 1 token) holds."""
    for name, limit in slos.items():
        value = slo_value(m, name)
        if value is not None and value > limit:
            return False
    return True
