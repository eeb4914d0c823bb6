"""`coldstart.json`: each start of the server, its time to ready, the first request against
the warm ones after it, the requests after idle gaps, and the spread over the starts."""

from __future__ import annotations

from typing import Any, Literal

from latlab.records import SCHEMA_VERSION
from latlab.records.summary import Record

COLDSTART_JSON = "coldstart.json"
DEFINITIONS = {
    "ready_s": "from just before the server process starts to the first 200 of its readiness "
               "URL (polled every 20 ms)",
    "warm": "median of the requests that follow the first, one at a time, on the same process",
    "excess": "first request − warm median (TTFT, E2E as in bench)",
    "idle": "the request after the server sat idle for the gap − the same run's warm median",
}


class Spread(Record):
    """Median, min and max over the starts that have the value."""

    n: int
    median: float | None
    min: float | None
    max: float | None


class FirstRequest(Record):
    id: str
    ok: bool
    error: str | None
    ttft: float | None
    e2e: float | None


class WarmBaseline(Record):
    ttft: float | None
    e2e: float | None
    n: int
    ids: list[str]


class Excess(Record):
    ttft: float | None
    e2e: float | None


class IdleProbe(Record):
    gap_s: float
    id: str
    ok: bool
    ttft: float | None
    e2e: float | None
    excess_ttft: float | None
    excess_e2e: float | None


class Start(Record):
    """One start of the server and its probes."""

    run: int
    ready_s: float | None
    first: FirstRequest
    warm: WarmBaseline
    excess: Excess
    idle: list[IdleProbe] = []
    error: str | None = None


class IdleSpread(Record):
    gap_s: float
    ttft: Spread
    excess_ttft: Spread
    e2e: Spread
    excess_e2e: Spread


class ColdstartRecord(Record):
    """Everything `coldstart.json` holds."""

    schema_version: int = SCHEMA_VERSION
    kind: Literal["coldstart"] = "coldstart"
    target: dict[str, Any] = {}
    runs: list[Start] = []
    summary: dict[str, Spread] = {}
    idle: list[IdleSpread] = []
    interrupted: bool = False
    definitions: dict[str, str] = DEFINITIONS
