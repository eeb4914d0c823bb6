"""What `latlab predict` and `latlab calibrate` are asked: the calibration's source (latlab's
engine, or run folders of another server and its limits), and for predict the load, the
fleet and the question (one point, a sweep, or the replicas a goal needs)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from latlab.records.bench import BenchConfig, serve_args
from latlab.records.catalog import metrics
from latlab.records.engine import EngineConfig
from latlab.records.settings import CALIBRATION, FLEET, INTERVALS, OUTPUT, setting
from latlab.records.simulation import Fleet
from latlab.records.sweep import SweepPlan


def _lower(text: str) -> str:
    """An engine option's help as a phrase: lower-case unless it opens with an acronym, and
    without the engine's own default, which `OTHER_SERVER` replaces."""
    text = re.sub(r"\s*\[default:[^]]*\]", "", text).rstrip(".")
    return text if text[1:2].isupper() else text[:1].lower() + text[1:]


# Another server's scheduling limits where `--from` is not told them (vLLM's defaults).
OTHER_SERVER = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "num_kv_blocks": 100_000,
                "block_size": 16, "max_model_len": 2048, "max_waiting": 100_000}

# The server `--from` run folders measured: its limits, latlab serve's settings of the same
# names (unset: `OTHER_SERVER`'s).
ServerShape = create_model("ServerShape", __module__=__name__, **{
    name: (EngineConfig.model_fields[name].annotation | None,
           setting(None, f"--from: the server's "
                   f"{_lower(EngineConfig.model_fields[name].description or name)} "
                   f"(default {default}).", group=CALIBRATION, ge=1))
    for name, default in OTHER_SERVER.items()})


class CalibrationSource(BaseModel):
    """Where a calibration comes from: latlab's engine (`serve_args`), or run folders of
    any server (`from_runs`, with the limits of that server)."""

    from_runs: list[Path] = setting([], "Fit from these run folders or sweep folders "
                                    "(repeatable) instead of timing latlab's engine.", "--from",
                                    group=CALIBRATION)
    server: ServerShape = ServerShape()

    @model_validator(mode="after")
    def _check_source(self) -> CalibrationSource:
        if not self.from_runs and self.server.model_fields_set:
            raise ValueError("--max-num-seqs and the like describe another server (--from); "
                             "latlab's engine takes them in --serve-args")
        return self


class CalibrateConfig(CalibrationSource):
    """`latlab calibrate`."""

    serve_args: list[str] = setting([], "latlab serve options of the engine to calibrate.",
                                    group=CALIBRATION, cli_type=str)
    probe: bool = setting(True, "Time per-request costs through latlab serve (a short bench).",
                          group=CALIBRATION)
    out: Path | None = setting(None, "Where to write the calibration (default: the engine's "
                               "cache, or calibration.json in the first --from folder).",
                               group=OUTPUT)

    _args = field_validator("serve_args", mode="before")(lambda value: serve_args(value))

    @model_validator(mode="after")
    def _one_source(self) -> CalibrateConfig:
        if self.from_runs and self.serve_args:
            raise ValueError("--serve-args is for latlab's engine; --from fits the run folders")
        return self


_GOAL = re.compile(r"^\s*p(?P<q>[0-9.]+)[_ ](?P<metric>[a-z][a-z0-9_]*)\s*<=?\s*(?P<value>[0-9.]+)"
                   r"\s*(?P<unit>ms|s)?\s*@\s*(?P<rate>[0-9.]+)\s*(?:rps|req/s)?\s*$")
SIZING_METRICS = metrics(sizing=True)


class Goal(BaseModel):
    """A latency goal at a rate, written `p99_e2e<2s@40rps`."""

    percentile: float = Field(gt=0, lt=100)
    metric: str
    limit_ms: float = Field(gt=0)
    rate: float = Field(gt=0)
    text: str = ""

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        if not isinstance(data, str):
            return data
        m = _GOAL.match(data)
        if not m:
            raise ValueError(f"{data!r}: expected pQ_METRIC<LIMIT@RATE, e.g. p99_e2e<2s@40rps")
        if m["metric"] not in SIZING_METRICS:
            raise ValueError(f"{data!r}: the metric is one of {', '.join(SIZING_METRICS)}")
        return {"percentile": float(m["q"]), "metric": m["metric"], "text": data,
                "limit_ms": float(m["value"]) * (1000.0 if m["unit"] == "s" else 1.0),
                "rate": float(m["rate"])}

    def __str__(self) -> str:
        return self.text or (f"p{self.percentile:g}_{self.metric}<{self.limit_ms:g}ms"
                             f"@{self.rate:g}rps")


DEFAULT_REQUESTS = 10_000


class PredictConfig(CalibrationSource):
    """`latlab predict`: the load (a bench's workload, arrivals and window), the fleet, the
    calibration, and the question: one point, a sweep, or the replicas a goal needs."""

    bench: BenchConfig
    fleet: Fleet = Fleet()
    calibration: Path | None = setting(None, "The server's calibration (`latlab calibrate`).",
                                       group=CALIBRATION)
    replay: Path | None = setting(None, "Replay a measured run's requests: its scheduled times "
                                  "and lengths.", group=CALIBRATION)
    records: int = setting(50_000, "Write at most this many request records (a sample "
                           "beyond).", group=OUTPUT, ge=1)
    sweep: bool = setting(False, "Predict a sweep: the throughput–latency curve and SLO-max.",
                          group=FLEET)
    replicas_for: Goal | None = setting(None, "The fewest replicas meeting a goal, e.g. "
                                        "\"p99_e2e<2s@40rps\".", group=FLEET,
                                        cli_type=str | None)
    plan: SweepPlan = SweepPlan()
    draws: int = setting(20, "Intervals: simulate again in this many worlds drawn from the "
                         "calibration's spread (its step costs, the workload's seed); 0: the "
                         "point estimate alone.", group=INTERVALS, ge=0, le=1000)
    level: float = setting(0.9, "The intervals' level: the central share of the draws each "
                           "spans.", "--interval-level", group=INTERVALS, gt=0, lt=1)
    draw_requests: int = setting(20_000, "At most this many requests in each draw.",
                                 group=INTERVALS, ge=100)
    check: list[str] = setting([], "Predict measured runs (run folders, sweep folders or run "
                               "ids of the store; repeatable) from their own settings: "
                               "measured against predicted, and how many fall inside the "
                               "intervals.", group=INTERVALS)
    probe: bool = setting(True, "Before using a calibration of latlab's engine on this "
                          "machine, time a few engine steps (a few seconds) to see whether "
                          "the machine has changed since.", "--probe/--no-probe",
                          group=INTERVALS)
    on_drift: Literal["recalibrate", "rescale", "warn"] = setting(
        "recalibrate", "When the probe finds the machine beyond the calibration's spread: "
        "calibrate again (a cached calibration; a file's is warned about), or warn; rescale: "
        "scale its step costs by what the probe found, within the spread too (the machine "
        "now).", group=INTERVALS, cli_type=str)

    @model_validator(mode="before")
    @classmethod
    def _requests(cls, data: Any) -> Any:
        """Without --duration, --requests or a trace: 10,000 requests; named `predict`."""
        if not isinstance(data, dict) or not isinstance(data.get("bench", {}), dict):
            return data
        b = {"name": "predict"} | data.get("bench", {})
        if all(b.get(k) is None for k in ("duration_s", "requests")) \
                and (b.get("arrivals") or {}).get("trace") is None:
            b["requests"] = DEFAULT_REQUESTS
        return data | {"bench": b}

    @model_validator(mode="after")
    def _check(self) -> PredictConfig:
        if self.calibration is not None and self.from_runs:
            raise ValueError("--calibration and --from both name the server: give one")
        if (self.calibration is not None or self.from_runs) and self.bench.serve_args:
            raise ValueError("--serve-args is for latlab's engine, not --calibration/--from")
        asked = [flag for flag, given in (("--sweep", self.sweep),
                                          ("--replicas-for", self.replicas_for is not None),
                                          ("--check", bool(self.check)),
                                          ("--replay", self.replay is not None)) if given]
        if len(asked) > 1:
            raise ValueError(f"{' and '.join(asked)} are different questions: ask one at a "
                             "time")
        return self
