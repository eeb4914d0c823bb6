"""`latlab tune`'s candidates and their screening: every value of each batching knob the
server has a flag for (and fits its context), each screened against the start — simulated in
the start's own calibration on the same drawn worlds, or, where that calibration never timed
the steps a candidate makes (`calibration_reach`), measured in one real run of the workload —
then the best values of each knob combined and screened too.

    record.candidates sorted best gain first;  start_draws = screen(record, candidates(...), s)
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np
from rich.console import Console

from latlab.analysis.advice import FLAGS, launch_option, shares_prefixes, with_args
from latlab.analysis.findings import Change, Knob
from latlab.analysis.run_analysis import RunAnalysis
from latlab.load import BenchError
from latlab.records.calibration import Calibration
from latlab.records.folder import write_json
from latlab.records.simulation import Fleet
from latlab.records.summary import RunSummary
from latlab.records.tune import TUNE_JSON, Candidate, TuneConfig, TuneRecord
from latlab.services.advice_effects import changed
from latlab.services.bench import run_bench
from latlab.services.calibration_reach import unseen
from latlab.services.errors import ServiceFailed
from latlab.services.predict_intervals import Intervals, paired_interval, reseeded, run_draws

REQUESTS = 1_000  # at most, per simulated draw
COMBINED = 2  # the best values of each knob combined with each other's
AB_OVERHEAD = 1.3  # an ab round's runs against the baseline run's wall time (server starts)

Knobs = dict[Knob, int | bool]


@dataclass
class Screening:
    """What screening needs: the start's calibration and run, and the clock it runs on."""

    config: TuneConfig
    cal: Calibration
    analysis: RunAnalysis
    kind: str | None
    start_goodput: float  # measured
    run_wall: float  # seconds one bench run of the workload took
    started: float  # tune's start (monotonic)
    err: Console


def goodput(summary: RunSummary) -> float | None:
    return summary.goodput.requests_per_s if summary.goodput else None


def candidates(config: TuneConfig, a: RunAnalysis, kind: str | None, start: str
               ) -> list[tuple[Knobs, str]]:
    """Every value of each knob the server has a flag for, one knob at a time."""
    now = _now(a, kind)
    context = _context(a, kind)
    values: dict[Knob, list[int | bool]] = {
        "max_num_seqs": [n for n in config.max_num_seqs if _fits(n, a, context)],
        "step_tokens": list(config.step_tokens),
        "prefix_caching": [True] if config.prefix_caching and now["prefix_caching"] is False
        and shares_prefixes(a) else []}
    out = []
    for knob, tried in values.items():
        flag = FLAGS[knob].get(kind or "")
        if flag is None or flag.where != "option" or not flag.spelling.startswith("-"):
            continue
        for value in tried:
            if value != now[knob] and _valid({knob: value}, now, kind):
                out.append(({knob: value}, with_args(start, flag.written(value))))
    return out


def _now(a: RunAnalysis, kind: str | None) -> dict[Knob, int | bool | None]:
    """The knobs as the server said they were set, else as its defaults set them."""
    s = a.config.target.settings
    told: dict[Knob, int | bool | None] = {
        "max_num_seqs": s.max_num_seqs if s else None,
        "step_tokens": s.step_tokens if s else None,
        "prefix_caching": s.prefix_caching if s else None}
    for knob, value in told.items():
        flag = FLAGS[knob].get(kind or "")
        if value is None and flag is not None:
            told[knob] = flag.default
    return told


def _valid(knobs: Knobs, now: dict[Knob, int | bool | None], kind: str | None) -> bool:
    """Whether the server takes the settings: latlab's budget holds a step's sequences."""
    merged = {**now, **knobs}
    seqs, budget = merged.get("max_num_seqs"), merged.get("step_tokens")
    return kind != "latlab" or not (isinstance(seqs, int) and isinstance(budget, int)
                                    and budget < seqs)


def _context(a: RunAnalysis, kind: str | None) -> int | None:
    """llama.cpp's whole context (tokens), which its slots split: `-c` on the command it was
    launched with, else the slots the server said times each one's context (None: another
    server, or one that did not say)."""
    if kind != "llamacpp":
        return None
    given = launch_option(a, "-c")
    if given is not None and given.isdigit() and int(given) > 0:
        return int(given)
    settings = a.config.target.settings
    props = settings.raw.get("/props") if settings is not None else None
    if not isinstance(props, dict) or not settings.max_num_seqs:
        return None
    per_slot = (props.get("default_generation_settings") or {}).get("n_ctx")
    return per_slot * settings.max_num_seqs if isinstance(per_slot, int) else None


def _fits(slots: int, a: RunAnalysis, context: int | None) -> bool:
    """Whether `slots` sequences leave each the context the run's longest request needed."""
    t = a.table
    if context is None or not len(t):
        return True
    longest = float(np.nanmax(np.nan_to_num(a.requests.prompt_tokens)
                              + np.nan_to_num(t.output_tokens)))
    return context / slots >= longest


def _simulated(cal: Calibration, knobs: Knobs, kind: str | None) -> Calibration:
    for knob, value in knobs.items():
        cal = changed(cal, Change(knob, value, kind or "", ""))
    return cal


def _unseen(s: Screening, knobs: Knobs) -> str | None:
    """Why the calibration cannot predict `knobs` (None: it can)."""
    reasons = [unseen(s.cal, s.analysis, Change(knob, value, s.kind or "", ""))
               for knob, value in knobs.items()]
    return "; ".join(r for r in reasons if r) or None


def screen(record: TuneRecord, candidates: list[tuple[Knobs, str]], s: Screening,
            folder: Path) -> np.ndarray:
    """Each candidate screened (`record.candidates`, best gain first): simulated in the same
    draws as the start, or, where the calibration has not seen its steps, measured in one
    run; the best values of each knob combined and screened too. Returns the start's draws."""
    config = s.config
    intervals = Intervals(draws=config.draws, requests=REQUESTS)
    workload_for = reseeded(config.bench, intervals.requests)
    now = _now(s.analysis, s.kind)

    def drawn_goodput(c: Calibration) -> np.ndarray:
        outcomes = run_draws(c, workload_for, Fleet(), s.analysis.config, intervals,
                             lambda run: goodput(run.summary) or 0.0)
        return np.array([o.judged for o in outcomes], dtype=float)

    start = drawn_goodput(s.cal)
    start_predicted = float(np.median(start))

    def one(knobs: Knobs, args: str) -> None:
        reason = _unseen(s, knobs)
        if reason is not None:
            c = _measured_screen(knobs, args, reason, s)
        else:
            drawn = drawn_goodput(_simulated(s.cal, knobs, s.kind))
            gain = drawn - start
            tail = intervals.tail
            span = paired_interval(s.cal, gain, intervals)
            c = Candidate(
                args=args, knobs=dict(knobs), predicted=float(np.median(drawn)),
                predicted_lo=float(np.quantile(drawn, tail)),
                predicted_hi=float(np.quantile(drawn, 1 - tail)),
                change=float(np.median(gain)), change_lo=span[0] if span else None,
                change_hi=span[1] if span else None)
            c.share = _share(c.change, start_predicted)
        if c is None:
            record.notes.append(f"not screened: {args} (not simulated: {reason}; a run of it "
                                "would not fit --budget)")
        else:
            record.candidates.append(c)
            record.candidates.sort(key=lambda c: -c.share)
            write_json(folder / TUNE_JSON, record)

    for knobs, args in candidates:
        one(knobs, args)
    best: dict[Knob, list[Candidate]] = {}
    for c in list(record.candidates):
        (knob,) = c.knobs
        if c.change > 0 and len(best.setdefault(knob, [])) < COMBINED:
            best[knob].append(c)
    start_args = shlex.join(config.bench.serve_args)
    for combo in product(*best.values()):
        merged = {k: v for c in combo for k, v in c.knobs.items()}
        if len(combo) < 2 or not _valid(merged, now, s.kind):  # type: ignore[arg-type]
            continue
        knobs: Knobs = {}
        args = start_args
        for c in combo:
            (knob,) = c.knobs
            knobs[knob] = c.knobs[knob]
            args = with_args(args, FLAGS[knob][s.kind or ""].written(c.knobs[knob]))
        one(knobs, args)
    return start


def _share(gain: float, start: float) -> float:
    """A gain as a share of the start's goodput (the gain itself when the start had none)."""
    return gain / start if start > 0 else gain


def _measured_screen(knobs: Knobs, args: str, reason: str, s: Screening) -> Candidate | None:
    """One real run of the workload with `args`, its goodput against the measured start's;
    None when it would not fit the budget (said in the record's notes by the caller)."""
    left = s.config.budget_s - (time.monotonic() - s.started)
    if left < s.run_wall * (1 + AB_OVERHEAD):  # leave room for more than this run
        return None
    s.err.print(f"not simulated ({reason}): measuring {args} in one run…", style="dim",
                highlight=False, markup=False)
    bench = s.config.bench.model_copy(update={"serve_args": shlex.split(args),
                                              "name": "tune-screen"})
    try:
        result = run_bench(bench, store=bench.out)
    except (ServiceFailed, BenchError, ValueError) as e:  # BenchError: it would not start
        value, run = 0.0, f"failed: {e}"
    else:
        value, run = goodput(result.summary) or 0.0, str(result.run.path)
    gain = value - s.start_goodput
    return Candidate(args=args, knobs=dict(knobs), predicted=value, predicted_lo=value,
                     predicted_hi=value, change=gain, change_lo=gain, change_hi=gain,
                     share=_share(gain, s.start_goodput), screened="run", unseen=reason,
                     screen_run=run)
