"""`latlab tune`: the batching settings that give the most goodput under the SLOs, found by
simulating first and measuring the best few.

1. Measure the server as it is (one bench run of the workload); fit the run's own calibration.
2. Screen: every value of each knob alone (max sequences, token budget, prefix caching), then
   the best values of each combined, all simulated in the same drawn worlds as the start, so
   each candidate's gain over the start has its own interval. A candidate whose steps the
   calibration never timed (`calibration_reach`: a much smaller prefill chunk, a much larger
   batch) is not simulated but screened by one real run of the workload, and says so.
3. Verify the best `verify` gains (as a share of the start: the simulated ones against the
   simulated start, the measured against the measured) with `ab` on the real server, within
   the time budget, and say where simulation and measurement disagree.

vLLM's benchmarks/auto_tune.sh runs the whole grid for real; this measures
1 + screened-by-run + 2·verify·(rounds + 1) runs (each ab's warm-up round a side included).

    result = run_tune(TuneConfig(bench=BenchConfig(serve_args="--model tiny", slos=...)), err)
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np
from rich.console import Console

from latlab.analysis import analyze
from latlab.analysis.advice import FLAGS, launch_option, server_of, shares_prefixes, with_args
from latlab.analysis.findings import Change, Knob
from latlab.analysis.run_analysis import RunAnalysis
from latlab.load import BenchError
from latlab.load.target.launch import remembered_interrupts
from latlab.records.ab import SIDES, ABConfig
from latlab.records.calibration import Calibration
from latlab.records.folder import RunFolder, write_json
from latlab.records.simulation import Fleet
from latlab.records.summary import RunSummary
from latlab.records.tune import TUNE_JSON, Candidate, TuneConfig, TuneRecord
from latlab.services.ab import compare_sides, run_ab
from latlab.services.advice_effects import changed, run_calibration
from latlab.services.bench import run_bench
from latlab.services.calibration_reach import unseen
from latlab.services.errors import InputError, ServiceFailed
from latlab.services.predict_intervals import Intervals, reseeded, run_draws
from latlab.sim.calibrate_run import CalibrationError

REQUESTS = 1_000  # at most, per simulated draw
COMBINED = 2  # the best values of each knob combined with each other's
LEVEL = 0.9
AB_OVERHEAD = 1.3  # an ab round's runs against the baseline run's wall time (server starts)
START_SLACK = 0.1  # beyond the start's predicted interval, the measured start disagrees

Knobs = dict[Knob, int | bool]


@dataclass
class TuneResult:
    folder: Path
    record: TuneRecord


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


def run_tune(config: TuneConfig, err: Console) -> TuneResult:
    """Measure, screen, verify; tune.json is written as it goes. Ctrl-C keeps what ran."""
    started = time.monotonic()
    bench = config.bench
    if not bench.slos:
        raise InputError("latlab tune: give the SLOs the goodput is judged by (e.g. --slo "
                         "ttft=500ms --slo tpot=50ms)")
    folder = RunFolder.create(bench.out, "tune").path
    start = shlex.join(bench.serve_args)
    record = TuneRecord(created=time.time(), start=start, slos=dict(bench.slos))
    err.print(f"measuring the starting settings ({start or 'the defaults'})…", style="dim",
              highlight=False, markup=False)
    base = run_bench(bench.model_copy(update={"name": "tune-start"}), store=bench.out)
    if base.failed:
        raise ServiceFailed(f"the starting settings: {base.message}")
    base_wall = time.monotonic() - started
    analysis = base.analysis or analyze(base.run)
    record.baseline_run, record.server = str(base.run.path), server_of(analysis)[1]
    record.start_goodput = _goodput(base.summary)
    try:
        cal = run_calibration(analysis)
    except CalibrationError as e:
        raise ServiceFailed(f"the starting run cannot calibrate the simulator: {e}") from None
    candidates = _candidates(config, analysis, record.server, start)
    if not candidates:
        raise InputError(f"latlab tune: latlab knows no flag of {record.server or 'this server'}"
                         " for max sequences, the token budget or prefix caching")
    err.print(f"screening {len(candidates)} settings ({config.draws} simulated draws each; "
              "a run each for those the calibration has not seen)…", style="dim")
    screening = Screening(config, cal, analysis, record.server, record.start_goodput or 0.0,
                          base_wall, started, err)
    with remembered_interrupts() as pressed:
        try:
            _check_start(record, _screen(record, candidates, screening, folder))
            write_json(folder / TUNE_JSON, record)
            _verify(record, config, err, base_wall, started, folder)
        except KeyboardInterrupt:
            record.interrupted = True
        if pressed():
            record.interrupted = True
    better = [c for c in record.candidates if c.verdict == "better"]
    if better:
        record.best = max(better, key=lambda c: c.measured or 0.0).args
    record.wall_s = time.monotonic() - started
    write_json(folder / TUNE_JSON, record)
    return TuneResult(folder, record)


def _check_start(record: TuneRecord, start_draws: np.ndarray) -> None:
    """The simulated start against the measured one: a note where they disagree."""
    tail = (1 - LEVEL) / 2
    record.start_predicted = float(np.median(start_draws))
    lo, hi = np.quantile(start_draws, tail), np.quantile(start_draws, 1 - tail)
    measured = record.start_goodput or 0.0
    if not lo * (1 - START_SLACK) <= measured <= hi * (1 + START_SLACK):
        record.notes.append(
            f"the simulation disagrees with the start itself: it predicts {lo:.2f}–{hi:.2f} "
            f"req/s of goodput, {measured:.2f} was measured; its ranking is a guess here (a "
            "busy host, or a server the calibration does not describe): go by what ab "
            "measured")


def _goodput(summary: RunSummary) -> float | None:
    return summary.goodput.requests_per_s if summary.goodput else None


def _candidates(config: TuneConfig, a: RunAnalysis, kind: str | None, start: str
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


def _screen(record: TuneRecord, candidates: list[tuple[Knobs, str]], s: Screening,
            folder: Path) -> np.ndarray:
    """Each candidate screened (`record.candidates`, best gain first): simulated in the same
    draws as the start, or, where the calibration has not seen its steps, measured in one
    run; the best values of each knob combined and screened too. Returns the start's draws."""
    config = s.config
    intervals = Intervals(draws=config.draws, level=LEVEL, requests=REQUESTS)
    workload_for = reseeded(config.bench, intervals.requests)
    now = _now(s.analysis, s.kind)

    def goodput(c: Calibration) -> np.ndarray:
        outcomes = run_draws(c, workload_for, Fleet(), s.analysis.config, intervals,
                             lambda run: _goodput(run.summary) or 0.0)
        return np.array([o.judged for o in outcomes], dtype=float)

    start = goodput(s.cal)
    start_predicted = float(np.median(start))

    def screen(knobs: Knobs, args: str) -> None:
        reason = _unseen(s, knobs)
        if reason is not None:
            c = _measured_screen(knobs, args, reason, s)
        else:
            drawn = goodput(_simulated(s.cal, knobs, s.kind))
            gain = drawn - start
            tail = (1 - LEVEL) / 2
            c = Candidate(
                args=args, knobs=dict(knobs), predicted=float(np.median(drawn)),
                predicted_lo=float(np.quantile(drawn, tail)),
                predicted_hi=float(np.quantile(drawn, 1 - tail)),
                change=float(np.median(gain)), change_lo=float(np.quantile(gain, tail)),
                change_hi=float(np.quantile(gain, 1 - tail)))
            c.share = _share(c.change, start_predicted)
        if c is None:
            record.notes.append(f"not screened: {args} (not simulated: {reason}; a run of it "
                                "would not fit --budget)")
        else:
            record.candidates.append(c)
            record.candidates.sort(key=lambda c: -c.share)
            write_json(folder / TUNE_JSON, record)

    for knobs, args in candidates:
        screen(knobs, args)
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
        screen(knobs, args)
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
        value, run = _goodput(result.summary) or 0.0, str(result.run.path)
    gain = value - s.start_goodput
    return Candidate(args=args, knobs=dict(knobs), predicted=value, predicted_lo=value,
                     predicted_hi=value, change=gain, change_lo=gain, change_hi=gain,
                     share=_share(gain, s.start_goodput), screened="run", unseen=reason,
                     screen_run=run)


def _verify(record: TuneRecord, config: TuneConfig, err: Console, base_wall: float,
            started: float, folder: Path) -> None:
    """`ab` of the start against each of the best predicted gains, while the budget lasts."""
    warmup = ABConfig.model_fields["warmup_rounds"].default  # ab's warm-up round a side
    per_ab = base_wall * 2 * (config.rounds + warmup) * AB_OVERHEAD
    chosen = [c for c in record.candidates if c.change > 0][:config.verify]
    if len(chosen) < config.verify:
        record.notes.append(f"{config.verify - len(chosen)} fewer verified than asked: no "
                            "other candidate was predicted to gain goodput")
    for c in chosen:
        left = config.budget_s - (time.monotonic() - started)
        if left < per_ab:
            record.notes.append(f"not verified: {c.args} (about {per_ab:.0f} s of ab left "
                                f"{left:.0f} s of --budget)")
            continue
        err.print(f"verifying with ab: {c.args}", style="dim", highlight=False, markup=False)
        ab = ABConfig(a=record.start, b=c.args, rounds=config.rounds,
                      max_rounds=max(config.rounds, config.max_rounds),
                      max_time=max(left - per_ab, 1.0), bench=config.bench,
                      decide_on=("goodput",))  # more rounds only while goodput is open
        try:
            done = run_ab(ab, err)
            if not all(done.analyses[side] for side in SIDES):  # Ctrl-C before a whole round
                c.ab_folder = str(done.folder)
                raise KeyboardInterrupt
            comparison = compare_sides(done)
        except (ServiceFailed, BenchError, ValueError) as e:  # BenchError: it would not start
            record.notes.append(f"{c.args}: ab failed ({e})")
            c.verdict = "failed"
            write_json(folder / TUNE_JSON, record)
            continue
        c.ab_folder = str(done.folder)
        change = next((ch for ch in comparison.changes if ch.key == "goodput"), None)
        if change is not None and change.a is not None and change.b is not None:
            c.measured_start, c.measured, c.verdict = change.a, change.b, change.verdict
            gain = change.b - change.a
            if c.screened == "simulation":  # a screening run is a measurement, not a claim
                c.agrees = c.change_lo <= gain <= c.change_hi
        write_json(folder / TUNE_JSON, record)
        if done.record.interrupted:
            raise KeyboardInterrupt
