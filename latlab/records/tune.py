"""`latlab tune`: a server's batching settings searched for the most goodput under the SLOs
(what is asked: `TuneConfig`), and `tune.json` (what it found: `TuneRecord`): every candidate
the simulator screened, and the few `ab` then measured against the server as it was."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, field_validator

from latlab.records.bench import BenchConfig
from latlab.records.settings import TUNE, setting
from latlab.records.summary import Record

TUNE_JSON = "tune.json"


def _counts(value: object) -> object:
    """"4,8,16" → [4, 8, 16]."""
    if isinstance(value, str):
        try:
            return [int(v) for v in value.replace(" ", "").split(",") if v]
        except ValueError:
            raise ValueError(f"expected whole numbers separated by commas, got {value!r}"
                             ) from None
    return value


class TuneConfig(BaseModel):
    """The server (--serve-args for latlab's engine, or --launch with --serve-args as the
    settings it starts from), its workload and SLOs, and the settings to search."""

    max_num_seqs: list[int] = setting([1, 2, 4, 8, 16, 32], "Sequences batched at once, the "
                                      "values to try (llama.cpp: slots, -np).", group=TUNE,
                                      cli_type=str, metavar="N,N,...")
    step_tokens: list[int] = setting([64, 128, 256, 512, 1024, 2048], "Token budgets of one "
                                     "step (the prefill chunk; llama.cpp: -b with -ub), the "
                                     "values to try.", group=TUNE, cli_type=str,
                                     metavar="N,N,...")
    prefix_caching: bool = setting(True, "Also try prefix caching on, where the server has it "
                                   "off and the workload shares prefixes.",
                                   "--prefix-caching/--no-prefix-caching", group=TUNE)
    verify: int = setting(2, "Candidates, best predicted first, measured with ab against the "
                          "starting settings.", group=TUNE, ge=0, le=10)
    rounds: int = setting(2, "A/B rounds for each candidate verified, at first.", group=TUNE,
                          ge=1, le=10)
    max_rounds: int = setting(4, "A/B rounds at most for each candidate verified, while ab "
                              "cannot tell (within --budget).", group=TUNE, ge=1, le=20)
    draws: int = setting(6, "Simulated worlds each candidate is screened in (the same ones "
                         "for all).", group=TUNE, ge=1, le=50)
    budget_s: float = setting(900.0, "Seconds tune may take; it stops verifying when the next "
                              "ab would not fit.", "--budget", group=TUNE, gt=0)
    bench: BenchConfig = BenchConfig()

    _lists = field_validator("max_num_seqs", "step_tokens", mode="before")(
        lambda value: _counts(value))

    @field_validator("max_num_seqs", "step_tokens")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if not values or any(v < 1 for v in values):
            raise ValueError("expected at least one value, each ≥ 1")
        return sorted(set(values))


class Candidate(Record):
    """One setting: its arguments, what screening found (goodput, req/s: the simulator's
    median of the draws and their interval, the change against the start paired draw by
    draw; or, for a setting the calibration has not seen, one real run's, against the
    measured start), and what `ab` measured when it was verified."""

    args: str
    knobs: dict[str, int | bool]
    predicted: float
    predicted_lo: float
    predicted_hi: float
    change: float  # the paired difference against the starting settings (req/s): median
    change_lo: float | None  # its interval (None: the drawn worlds did not set it apart)
    change_hi: float | None
    share: float = 0.0  # the change as a share of the start's goodput (what ranks them)
    screened: Literal["simulation", "run"] = "simulation"
    unseen: str | None = None  # why the simulation was not trusted with it
    screen_run: str | None = None  # the run folder that screened it (or why it failed)
    measured_start: float | None = None  # goodput (req/s) ab measured, the start's side
    measured: float | None = None
    measured_low: float | None = None  # ab's interval of measured / measured_start - 1
    measured_high: float | None = None
    ab_folder: str | None = None
    agrees: bool | None = None  # the measured change inside the predicted interval
    verdict: str | None = None  # ab's on goodput ("better", "worse", ...), or "failed"


class TuneRecord(Record):
    created: float
    start: str  # the arguments it started from
    server: str | None = None  # the server's kind, as it said
    slos: dict[str, float] = {}
    baseline_run: str = ""
    start_goodput: float | None = None  # measured in the baseline run (req/s)
    start_predicted: float | None = None  # the simulation's of the same settings (median)
    candidates: list[Candidate] = []
    best: str | None = None  # the arguments to use: the best measured improvement
    notes: list[str] = []
    wall_s: float = 0.0
    interrupted: bool = False
