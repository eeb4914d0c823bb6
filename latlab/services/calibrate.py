"""Calibration: fit the step-cost model `latlab predict` simulates a server with.

Without `--from`, latlab's own engine: its steps timed in process over a grid of batch
shapes, then a short probe through `latlab serve` for the per-request costs (preprocess,
postprocess, network). With `--from RUN_DIR` (bench runs or sweep folders), whatever server
they measured.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console

from latlab.load.target.launch import embedded_engine
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.calibration import Calibration
from latlab.records.engine import ConfigError, EngineConfig
from latlab.records.folder import RunFolder
from latlab.records.steps import StepLogError, StepRecord, read_step_log
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench
from latlab.services.errors import InputError, ServiceFailed
from latlab.sim import calibration as calibrations
from latlab.sim.calibrate_run import CalibrationError, request_costs, request_spread
from latlab.sim.validate import compare

PROBE_REQUESTS = 16
LOADED_USERS = 4
PROBE_LOAD = 0.5  # the open-loop probe's rate, as a share of the predicted capacity
PROBE_OPEN_S = 20.0  # and about how long it runs


# latlab serve options that change when requests run, not what a step costs: a calibration
# is made without them (`calibration_args`), the simulator applies them (`records.simulation.
# Fleet`: a queue deadline, idle unload, speculative decoding).
RUN_TIME = {"max_queue_delay": "--max-queue-delay", "idle_unload": "--idle-unload",
            "speculative_method": "--speculative-method",
            "speculative_model": "--speculative-model",
            "num_speculative_tokens": "--num-speculative-tokens"}


def calibration_args(serve: list[str]) -> list[str]:
    """`serve` without the `RUN_TIME` options (and their values)."""
    out, skip = [], False
    for arg in serve:
        if skip:
            skip = False
        elif arg.split("=", 1)[0] in RUN_TIME.values():
            skip = "=" not in arg
        else:
            out.append(arg)
    return out


def calibrated_engine(config: EngineConfig) -> EngineConfig:
    """The engine a calibration of `config` times: without the `RUN_TIME` options."""
    return config.model_copy(update={name: EngineConfig.model_fields[name].default
                                     for name in RUN_TIME})


def calibrate_engine(config: EngineConfig, serve: list[str], err: Console,
                     probe: bool = True) -> Calibration:
    """Time the engine `latlab serve SERVE` (whose engine is `config`) in process; with
    `probe`, its per-request costs through a short bench (sequential requests), and how well
    the calibration replays it. The `RUN_TIME` options are left out of both."""
    from latlab.engine.loader import ModelLoadError

    dropped = [flag for name, flag in RUN_TIME.items()
               if getattr(config, name) not in (None, EngineConfig.model_fields[name].default)]
    config, serve = calibrated_engine(config), calibration_args(serve)
    if dropped:
        err.print(f"calibrating without {', '.join(dropped)}: they change when requests run, "
                  "not what a step costs; latlab predict simulates them", style="dim",
                  highlight=False)
    err.print("calibrating latlab's engine: timing its steps over a grid of batch shapes…",
              style="dim", highlight=False)
    try:
        cal = calibrations.engine_calibration(
            config, lambda m: err.print(f"  {m}", style="dim", highlight=False),
            describe=" ".join(["latlab serve", *serve]) if serve else "")
    except (ConfigError, ModelLoadError) as e:
        raise InputError(f"--serve-args: {e}") from None
    if probe:
        cal = _probe(cal, serve, err)
    return cal


def _probe(cal: Calibration, serve: list[str], err: Console) -> Calibration:
    """Short benches through one latlab serve writing its steps (`--step-log`): one request
    at a time (the per-request costs), a few users, as many users as the engine batches,
    and Poisson arrivals at half the capacity the in-process calibration predicts. The
    step cost is then fitted to the steps served under those arrivals
    (`calibration.as_served`): the engine's steps cost more while its HTTP server takes in
    and streams requests as they come than in a closed loop or in process. How well the
    result replays each probe is noted."""

    batch = cal.engine.max_num_seqs
    rate = round(PROBE_LOAD * calibrations.capacity(cal, 2 * batch), 2)
    plan = [(ArrivalConfig(process="closed", users=1), PROBE_REQUESTS),
            (ArrivalConfig(process="closed", users=LOADED_USERS), 8 * LOADED_USERS),
            (ArrivalConfig(process="closed", users=batch), 3 * batch),
            (ArrivalConfig(process="poisson", rate=rate), round(rate * PROBE_OPEN_S))]
    err.print("probing latlab serve: " + ", ".join(
        f"{n} requests from {a.users} user" + ("s" if a.users > 1 else "")
        if not a.open_loop else f"{n} at {a.rate:g}/s (Poisson)" for a, n in plan)
        + "…", style="dim", highlight=False)
    with tempfile.TemporaryDirectory(prefix="latlab-calibrate-") as tmp:
        steps = Path(tmp) / "steps.jsonl"
        runs = []
        with embedded_engine([*serve, "--step-log", str(steps)],
                             log_path=Path(tmp) / "engine.log",
                             name="the probe's latlab serve") as engine:
            for arrivals, requests in plan:
                bench = BenchConfig(url=engine.url, workload=WorkloadConfig(),
                                    arrivals=arrivals, duration_s=None, requests=requests,
                                    out=Path(tmp), name="calibrate-probe")
                runs.append(RunFolder(run_bench(bench).run.path))
        first = runs[0].read_records()
        cal = calibrations.with_request_costs(cal, request_costs(first),
                                              "a probe through latlab serve",
                                              request_spread(first))
        try:
            logged = read_step_log(steps)
            probes = [_during(logged, run) for run in runs]
            cal = calibrations.as_served(cal, probes[-1], probes)
        except (StepLogError, CalibrationError) as e:
            raise ServiceFailed(f"the open-loop probe's steps: {e}") from None
        checks = [compare(cal, run) for run in runs]
    cal.notes += [f"probe replayed on the calibration: {c.line()}" for c in checks]
    return cal


def _during(steps: list[StepRecord], run: RunFolder) -> list[StepRecord]:
    """The steps served while `run`'s requests were in flight."""
    records = [r for r in run.read_records() if r.origin_ns and r.end_ns]
    start, end = min(r.origin_ns for r in records), max(r.end_ns for r in records)
    return [s for s in steps if start <= s.start_ns <= end]
