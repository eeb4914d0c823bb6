"""Prediction: find the calibration, run one simulated point into a predicted run folder,
and explain it like a measured run.

    cal, where = resolve_calibration(PredictConfig(), EngineConfig(), err=console)
    point = predict_point(cal, workload, Fleet(), settings, out=Path("runs"), name="predict")
    point.summary.percentile("ttft", "p99"), point.analysis.findings
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from latlab import __version__
from latlab.analysis import RunAnalysis, analyze
from latlab.records.bench import BenchConfig
from latlab.records.calibration import Calibration
from latlab.records.config import RunConfig, Target
from latlab.records.engine import EngineConfig
from latlab.records.folder import RunFolder
from latlab.records.predict import CalibrationSource
from latlab.records.server import ServerSettings
from latlab.records.simulation import Fleet, Simulation
from latlab.records.summary import RunSummary
from latlab.records.target import ServerKind
from latlab.report.html import write_html
from latlab.services.advice_effects import DRAWS, annotate
from latlab.services.calibrate import calibrate_engine, calibrated_engine, calibration_args
from latlab.services.errors import InputError
from latlab.services.predict_intervals import Intervals, predicted_intervals
from latlab.sim import calibration as calibrations
from latlab.sim import machine
from latlab.sim.calibrate_run import CalibrationError
from latlab.sim.fleet import simulate
from latlab.sim.folder import RECORDS, write_run
from latlab.sim.results import SimResult
from latlab.sim.workload import SimWorkload
from latlab.store import RunStore, key_numbers


def resolve_calibration(source: CalibrationSource, calibration: Path | None,
                        serve: list[str], engine: EngineConfig | None, err: Console,
                        probe: bool = False, on_drift: str = "warn"
                        ) -> tuple[Calibration, str]:
    """The calibration to simulate with, and where it came from: a file, run folders fitted
    now, or latlab's engine (`serve`, whose engine config is `engine`), calibrated on first
    use and cached. With `probe`, a calibration of latlab's engine made on this machine is
    checked first (its reference steps timed again); beyond its spread, `on_drift` says
    what to do: make a cached one again ("recalibrate"; a file's is warned about), or warn;
    "rescale" scales its step costs to the machine now whatever the probe found (within the
    spread too: on a shared host the probe tracks how fast the served steps will be)."""
    engine = calibrated_engine(engine or EngineConfig())
    try:
        if calibration is not None:
            cal = calibrations.load(calibration)
            if probe:
                cal = _machine(cal, engine, err, on_drift, cached=False)
            return cal, str(calibration)
        if source.from_runs:
            cal = calibrations.run_calibration(source.from_runs,
                                               source.server.model_dump(exclude_none=True))
            return cal, "fitted now from " + ", ".join(map(str, source.from_runs))
    except CalibrationError as e:
        raise InputError(str(e)) from None
    path = calibrations.cache_path(calibration_args(serve))
    if path.is_file():
        try:
            cal = calibrations.load(path)
        except CalibrationError:
            err.print(f"the cached calibration {path} is unreadable: calibrating again",
                      style="yellow", highlight=False)
        else:
            checked = _machine(cal, engine, err, on_drift, cached=True) if probe else cal
            if checked is not None:
                return checked, str(path)
    try:
        cal = calibrate_engine(engine, serve, err)
    except ImportError as e:
        raise InputError(f"calibrating latlab's engine needs torch ({e}): install latlab's "
                         "engine extra, or predict another server with --calibration FILE or "
                         "--from RUN_DIR") from None
    calibrations.save(cal, path)
    return cal, f"{path} (calibrated now)"


def _machine(cal: Calibration, engine: EngineConfig, err: Console, on_drift: str,
             cached: bool) -> Calibration | None:
    """The probe, printed: `cal` as it is (the machine within its spread, or nothing to
    compare), rescaled to the machine now, or None — a cached one to be made again."""
    try:
        check = machine.check_machine(cal, engine)
    except ImportError:
        return cal  # no torch here: nothing to time the reference steps with
    if check is None:
        return cal
    if on_drift == "rescale":  # the machine now, within the spread too: the probe tracks it
        err.print(f"{'warning: ' if check.beyond else 'machine check: '}{check.line()}: its "
                  f"step costs scaled by {check.ratio:.2f} (--on-drift rescale)",
                  style="yellow" if check.beyond else "dim", highlight=False)
        return calibrations.rescaled(cal, check.ratio, "the machine probe")
    if not check.beyond:
        err.print(f"machine check: {check.line()}", style="dim", highlight=False)
        return cal
    recalibrate = on_drift == "recalibrate" and cached
    err.print(f"warning: {check.line()}: "
              + ("calibrating again (--on-drift warn keeps it)" if recalibrate else
                 "the predictions may be off by that much; calibrate again with the machine "
                 "as it will be, or --on-drift rescale"), style="yellow", highlight=False)
    return None if recalibrate else cal


def fleet_for(engine: EngineConfig, fleet: Fleet) -> Fleet:
    """`fleet` with the run-time techniques of the engine `--serve-args` describes (a queue
    deadline, idle unload, speculative decoding) where it does not give its own."""
    given = fleet.model_fields_set
    update = {}
    if engine.max_queue_delay is not None and "max_queue_delay" not in given:
        update["max_queue_delay"] = engine.max_queue_delay
    if engine.idle_unload is not None and "idle_unload" not in given:
        update["idle_unload"] = engine.idle_unload
    if engine.speculative_method is not None and "speculative_tokens" not in given:
        update["speculative_tokens"] = engine.num_speculative_tokens
    if not update:
        return fleet
    if "speculative_tokens" in update and fleet.acceptance is None:
        raise InputError("--serve-args --speculative-method: give --acceptance, each request's "
                         "chance of accepting a draft (e.g. uniform:0.5,0.9)")
    if "idle_unload" in update and fleet.reload_s is None:
        raise InputError("--serve-args --idle-unload: give --reload-time, the seconds the model "
                         "takes to load again (or a latlab coldstart folder)")
    try:
        return Fleet.model_validate(fleet.model_dump(exclude_unset=True) | update)
    except ValueError as e:
        raise InputError(f"--serve-args: {_message(e)}") from None


def _message(e: ValueError) -> str:
    errors = getattr(e, "errors", None)
    return errors()[0]["msg"].removeprefix("Value error, ") if errors else str(e)


@dataclass
class Predicted:
    run: RunFolder
    summary: RunSummary
    analysis: RunAnalysis | None
    result: SimResult
    wall_s: float


def settings(bench: BenchConfig, cal: Calibration, where: str, fleet: Fleet,
             replay: str | None = None) -> RunConfig:
    """config.json of a predicted run: the bench it stands for, marked simulated."""
    return RunConfig(
        kind="predict", latlab_version=__version__,
        command=shlex.join(sys.argv),
        name=bench.name, tags=bench.tags, bench=bench,
        target=Target(url=None, model=cal.server, embedded=False,
                      server_kind=ServerKind.LATLAB if cal.source == "engine" else None,
                      settings=ServerSettings.of_shape(cal.engine)),
        warmup_s=bench.warmup_s, cooldown_s=bench.cooldown_s, duration_s=bench.duration_s,
        slos=bench.slos,
        simulation=Simulation(calibration=where, calibration_created=cal.created,
                              calibration_fit=cal.headline(), server=cal.server, fleet=fleet,
                              replay=replay))


def predict_point(cal: Calibration, workload: SimWorkload, fleet: Fleet, config: RunConfig,
                  out: Path, name: str, records: int = RECORDS, explain: bool = True,
                  store: Path | None = None, intervals: Intervals | None = None,
                  workload_for: Callable[[int], SimWorkload] | None = None,
                  test_advice: bool = False) -> Predicted:
    """Simulate, write the predicted run folder (summary, report.html), register it; with
    `intervals`, every percentile's interval from draws of `workload_for(d)` (draw d's
    workload: another seed); with `test_advice`, each setting a finding suggests simulated
    too (`advice_effects`)."""
    started = time.perf_counter()
    try:
        result = simulate(workload, cal, fleet)
    except RuntimeError as e:
        raise InputError(f"the calibration's engine cannot serve this workload: {e}") from None
    wall = time.perf_counter() - started
    sim = config.simulation
    sim.wall_s = wall
    sim.outcome = result.fleet
    sim.steps, sim.decode_run_steps = result.steps, result.decode_run_steps
    sim.preemptions = result.preemptions
    run, summary = write_run(result, workload, config, out, name, records)
    if intervals is not None and intervals.draws and workload_for is not None:
        summary = predicted_intervals(cal, summary, workload_for, fleet, config, intervals)
        run.write_summary(summary)
    analysis = None
    if explain:
        analysis = analyze(run)
        if test_advice:  # no drawn worlds where the prediction has none (--draws 0)
            annotate(analysis, cal, fleet,
                     draws=0 if intervals is not None and not intervals.draws else DRAWS)
        write_html(run, analysis)
    with RunStore(store or out) as runs:
        runs.register(run.path, "predict", config, key_numbers(summary))
    return Predicted(run, summary, analysis, result, wall)
