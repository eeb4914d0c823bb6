"""SLOs: a limit on a latency metric, written `ttft=200ms` (`itl` bounds every token gap of a
request)."""

from __future__ import annotations

import re
from typing import Any

from latlab.records.catalog import metrics

SLO_METRICS = metrics(slo=True)
_SLO = re.compile(r"^\s*(?P<name>[a-z][a-z0-9_]*)\s*(?:=|<=?)\s*(?P<value>[0-9.]+)\s*"
                  r"(?P<unit>ms|s|us)?\s*$")
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "us": 0.001, None: 1.0}


def parse_slo(text: str) -> tuple[str, float]:
    """`"ttft=200ms"` → `("ttft", 200.0)`."""
    match = _SLO.match(text)
    if not match:
        raise ValueError(f"bad SLO {text!r}: expected NAME=VALUE[ms|s|us], e.g. ttft=200ms")
    name = match["name"]
    if name not in SLO_METRICS:
        raise ValueError(f"bad SLO {text!r}: unknown metric {name!r} "
                         f"(one of {', '.join(SLO_METRICS)})")
    value = float(match["value"]) * _UNIT_MS[match["unit"]]
    if value <= 0:
        raise ValueError(f"bad SLO {text!r}: the limit must be positive")
    return name, value


def slo_dict(value: Any) -> Any:
    """SLOs as `{metric: ms}`, also from the command line's `["ttft=200ms", ...]`; a limit
    on an unknown metric, or not positive, is refused."""
    if isinstance(value, (list, tuple)):
        return dict(parse_slo(str(item)) for item in value)
    if isinstance(value, dict):
        for name, limit in value.items():
            if name not in SLO_METRICS or not isinstance(limit, (int, float)) or limit <= 0:
                raise ValueError(f"--slo {name}={limit}: unknown metric or non-positive limit")
    return value
