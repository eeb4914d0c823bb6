"""When a run's requests go: a closed loop of users, an open loop at a rate (Poisson, gamma or
constant gaps), or a trace's timestamps (a trace also says what each request asks for:
`latlab.load.workload.traces` reads it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, model_validator

from latlab.records.settings import LOAD, TRACE, flag_of, setting
from latlab.records.summary import Unbounded

Process = Literal["closed", "poisson", "gamma", "constant", "trace"]
OPEN_LOOP = ("poisson", "gamma", "constant")


LOAD_KINDS = ("users", "rate", "trace")  # what sets the load; each excludes the others
TRACE_SHAPE = ("trace_speed", "trace_start_s", "length_scale")  # what shapes a trace replay


class ArrivalShape(BaseModel):
    """How arrivals come, whatever their load: the process (Poisson, gamma with its
    `burstiness` shape: 1 is Poisson, below 1 burstier, CV = 1/sqrt(burstiness); constant
    gaps), and `max_concurrency`, a cap on requests in flight (late sends show as lateness)."""

    process: Process = setting("closed", "Open-loop arrivals: poisson, gamma or constant "
                               "(default: poisson; gamma with --burstiness).", "--arrival",
                               group=LOAD, cli_type=str | None, show_default=False)
    burstiness: float = setting(1.0, "Gamma shape: 1 is Poisson, below 1 burstier "
                                "(CV = 1/sqrt(burstiness)).", group=LOAD, gt=0)
    max_concurrency: int | None = setting(None, "Cap on requests in flight (open loop); "
                                          "waiting shows as lateness.", group=LOAD, ge=1)

    def open_loop_process(self) -> str:
        """The open-loop process named, else Poisson (gamma if a burstiness was given)."""
        if "process" in self.model_fields_set and self.process in OPEN_LOOP:
            return self.process
        if "process" in self.model_fields_set and self.process != "closed":
            raise ValueError(f"--arrival {self.process!r}: expected one of "
                             f"{', '.join(OPEN_LOOP)}")
        return "gamma" if "burstiness" in self.model_fields_set else "poisson"


class ArrivalConfig(ArrivalShape):
    """Closed loop: `users` each send their next request when the last one ends.
    Open loop: `rate` requests/s with the shape's process, or the timestamps of a `trace`.
    `ramp_s` grows the rate (or the number of users) linearly from zero. Without a
    `process`, the load given decides it (a rate: Poisson, gamma with a burstiness)."""

    users: int = setting(4, "Closed loop: N users, each sends when its last request ends "
                         "(default: 4 without --rate).", group=LOAD, ge=1)
    rate: Unbounded | None = setting(None, "Open loop: requests per second (inf: every "
                                     "request at once, a burst).", group=LOAD, gt=0,
                                     cli_type=float | None)
    ramp_s: float = setting(0.0, "Seconds to ramp the rate (or users) up from zero.",
                            group=LOAD, ge=0)
    trace: Path | None = setting(None, "Replay a trace: its arrival times, lengths, prefix "
                                 "sharing and sessions (Mooncake JSONL, Azure LLM or BurstGPT "
                                 "CSV, latlab's JSONL, or a run folder).", group=TRACE)
    trace_speed: float = setting(1.0, "Replay the trace this many times faster (0.5: at half "
                                 "its speed).", group=TRACE, gt=0)
    trace_start_s: float = setting(0.0, "Start this many seconds into the trace; --duration "
                                   "or --requests end the window.", group=TRACE, ge=0)
    length_scale: float = setting(1.0, "Scale the trace's prompt and output lengths, and its "
                                  "prefix blocks with them, so a fleet's trace fits a small "
                                  "server (0.1: a tenth).", group=TRACE, gt=0)
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _infer(cls, data: Any) -> Any:
        """The process from the load given, when none is named (the command line's way);
        loads that exclude each other, or a shape with no load to shape, are refused."""
        if not isinstance(data, dict):
            return data
        named = data.get("process")
        if named in ("closed", "trace") or (named in OPEN_LOOP and data.get("rate") is not None):
            return data
        if named is not None and named not in OPEN_LOOP:
            raise ValueError(f"--arrival {named!r}: expected one of {', '.join(OPEN_LOOP)}")
        given = [k for k in LOAD_KINDS if data.get(k) is not None]
        if len(given) > 1:
            raise ValueError("--trace replays its own timestamps: drop --rate/--users"
                             if "trace" in given else "--users (closed loop) and --rate (open "
                             "loop) exclude each other; cap an open loop with --max-concurrency")
        if given == ["trace"]:
            return data | {"process": "trace"}
        if given == ["rate"]:
            return data | {"process": named or ("gamma" if "burstiness" in data else "poisson")}
        if named is not None or "burstiness" in data:
            raise ValueError("--arrival and --burstiness shape an open loop: give --rate")
        return data | {"process": "closed"}

    @model_validator(mode="after")
    def _check(self) -> ArrivalConfig:
        if self.process in OPEN_LOOP and self.rate is None:
            raise ValueError(f"a {self.process} arrival process needs a rate")
        if self.process == "trace" and self.trace is None:
            raise ValueError("trace replay needs a trace file")
        shaped = [name for name in TRACE_SHAPE
                  if getattr(self, name) != type(self).model_fields[name].default]
        if shaped and self.trace is None:
            raise ValueError(f"{flag_of(ArrivalConfig, shaped[0])} shapes a trace replay: "
                             "give --trace")
        if self.process == "closed" and self.rate is not None:
            raise ValueError("--rate is an open loop: drop --arrival closed")
        return self

    @classmethod
    def under(cls, base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        """`base` (a config file's arrivals) without what `over` (the flags) replaces: users
        replace the open loop and its shape; a trace or a rate the other loads (a rate keeps
        an open-loop process); a burstiness the process (it means gamma)."""
        drop: set[str] = set()
        if "users" in over:
            drop = {"rate", "trace", *TRACE_SHAPE, "process", "burstiness"}
        elif "trace" in over:
            drop = {"rate", "users", "process"}
        elif "rate" in over:
            drop = {"users", "trace", *TRACE_SHAPE} | (
                {"process"} if base.get("process") not in OPEN_LOOP else set())
        if "burstiness" in over:
            drop.add("process")
        return {k: v for k, v in base.items() if k not in drop}

    @property
    def open_loop(self) -> bool:
        return self.process != "closed"

    @property
    def burst(self) -> bool:
        """`--rate inf`: every request scheduled at once."""
        return self.open_loop and self.rate == float("inf")
