"""`latlab tune`: the batching settings that give the most goodput under the SLOs, found by
simulating first and measuring the best few.

1. Measure the server as it is (one bench run of the workload); fit the run's own calibration.
2. Screen (`tune_screen`): every value of each knob alone (max sequences, token budget,
   prefix caching), then the best values of each combined, all simulated in the same drawn
   worlds as the start, so each candidate's gain over the start has its own interval. A
   candidate whose steps the calibration never timed (`calibration_reach`: a much smaller
   prefill chunk, a larger batch) is not simulated but screened by one real run of the
   workload, and says so.
3. Verify the best `verify` gains (as a share of the start: the simulated ones against the
   simulated start, the measured against the measured) with `ab` on the real server, within
   the time budget, and say where simulation and measurement disagree.

vLLM's benchmarks/auto_tune.sh runs the whole grid for real; this measures
1 + screened-by-run + 2·verify·(rounds + 1) runs (each ab's warm-up round a side included).

    result = run_tune(TuneConfig(bench=BenchConfig(serve_args="--model tiny", slos=...)), err)
"""

from __future__ import annotations

import math
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from latlab.analysis import analyze
from latlab.analysis.advice import server_of
from latlab.load import BenchError
from latlab.load.target.interrupts import remembered_interrupts
from latlab.records.ab import SIDES, ABConfig
from latlab.records.folder import RunFolder, write_json
from latlab.records.tune import TUNE_JSON, Candidate, TuneConfig, TuneRecord
from latlab.services.ab import compare_sides, run_ab
from latlab.services.advice_effects import run_calibration
from latlab.services.bench import run_bench
from latlab.services.errors import InputError, ServiceFailed
from latlab.services.predict_intervals import Intervals
from latlab.services.tune_screen import AB_OVERHEAD, Screening, candidates, goodput, screen
from latlab.sim.calibrate_run import CalibrationError

START_SLACK = 0.1  # beyond the start's predicted interval, the measured start disagrees


@dataclass
class TuneResult:
    folder: Path
    record: TuneRecord


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
    record.start_goodput = goodput(base.summary)
    try:
        cal = run_calibration(analysis)
    except CalibrationError as e:
        raise ServiceFailed(f"the starting run cannot calibrate the simulator: {e}") from None
    tried = candidates(config, analysis, record.server, start)
    if not tried:
        raise InputError(f"latlab tune: latlab knows no flag of {record.server or 'this server'}"
                         " for max sequences, the token budget or prefix caching")
    err.print(f"screening {len(tried)} settings ({config.draws} simulated draws each; "
              "a run each for those the calibration has not seen)…", style="dim")
    screening = Screening(config, cal, analysis, record.server, record.start_goodput or 0.0,
                          base_wall, started, err)
    with remembered_interrupts() as pressed:
        try:
            _check_start(record, screen(record, tried, screening, folder))
            write_json(folder / TUNE_JSON, record)
            _verify(record, config, err, base_wall, started, folder)
        except KeyboardInterrupt:
            record.interrupted = True
        if pressed():
            record.interrupted = True
    better = [c for c in record.candidates if c.verdict == "better"]
    if better:
        record.best = _choose(better, record, config)
    record.wall_s = time.monotonic() - started
    write_json(folder / TUNE_JSON, record)
    return TuneResult(folder, record)


def _choose(better: list[Candidate], record: TuneRecord, config: TuneConfig) -> str:
    """The largest measured gain (each against the start in its own ab, paired), unless a
    candidate that changes only some of the same knobs was measured better too and its
    gain's interval reaches the largest one's: what the other knobs add is then not shown,
    so the simpler one, with the ab that would measure the rest."""
    best = max(better, key=_measured_gain)
    simpler = [c for c in better if c.knobs.items() < best.knobs.items()
               and not (best.measured_low is not None and c.measured_high is not None
                        and best.measured_low > c.measured_high)]
    if not simpler:
        return best.args
    plain = max(simpler, key=_measured_gain)
    launch = config.bench.launch
    measure = (f"latlab ab --config {shlex.quote(record.baseline_run)}"
               + (f" --launch {shlex.quote(launch)}" if launch else "")
               + f" --a {shlex.quote(plain.args)} --b {shlex.quote(best.args)} "
               "--decide-on goodput")
    record.notes.append(
        f"use {plain.args}, not {best.args}: each measured better than the start in its own "
        f"ab ({_measured_gain(plain):+.0%} and {_measured_gain(best):+.0%}, their intervals "
        f"overlapping), so what {best.args} adds to {plain.args} is not shown; to measure it: "
        f"{measure}")
    return plain.args


def _measured_gain(c: Candidate) -> float:
    """What ab measured `c` to gain over the start it ran beside, as a share of that start
    (separate abs' starts differ on a busy host: their B sides alone do not compare)."""
    if c.measured is None or c.measured_start is None:
        return -math.inf
    gain = c.measured - c.measured_start
    return gain / c.measured_start if c.measured_start > 0 else gain


def _check_start(record: TuneRecord, start_draws: np.ndarray) -> None:
    """The simulated start against the measured one: a note where they disagree."""
    tail = Intervals().tail
    record.start_predicted = float(np.median(start_draws))
    lo, hi = np.quantile(start_draws, tail), np.quantile(start_draws, 1 - tail)
    measured = record.start_goodput or 0.0
    if not lo * (1 - START_SLACK) <= measured <= hi * (1 + START_SLACK):
        record.notes.append(
            f"the simulation disagrees with the start itself: it predicts {lo:.2f}–{hi:.2f} "
            f"req/s of goodput, {measured:.2f} was measured; its ranking is a guess here (a "
            "busy host, or a server the calibration does not describe): go by what ab "
            "measured")


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
            if change.interval is not None:
                c.measured_low, c.measured_high = change.interval.low, change.interval.high
            gain = change.b - change.a
            if c.screened == "simulation" and c.change_lo is not None \
                    and c.change_hi is not None:  # a run is a measurement, not a claim
                c.agrees = c.change_lo <= gain <= c.change_hi
        write_json(folder / TUNE_JSON, record)
        if done.record.interrupted:
            raise KeyboardInterrupt
