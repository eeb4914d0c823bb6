"""Calibration: fit the step-cost model `latlab predict` simulates a server with.

Without `--from`, latlab's own engine: its steps timed in process over a grid of batch
shapes, then short probes through `latlab serve` for the per-request costs (preprocess,
postprocess, network) and the step costs as served. The probes' latlab serve starts first and
loads beside the in-process engine; the grid waits for it to be ready, so no step is timed
while it starts. With `--from RUN_DIR` (bench runs or sweep folders), whatever server they
measured.
"""

from __future__ import annotations

import math
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from latlab.load.generator import run_load
from latlab.load.target.launch import READY_TIMEOUT_S, ServerLaunch, ServerProcess, spawn_server
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.calibration import Calibration
from latlab.records.engine import ConfigError, EngineConfig
from latlab.records.folder import RunFolder
from latlab.records.lengths import LengthDistribution
from latlab.records.steps import StepLogError, StepRecord, read_step_log
from latlab.records.workload import WorkloadConfig
from latlab.services.errors import InputError, ServiceFailed
from latlab.sim import calibration as calibrations
from latlab.sim.calibrate_run import CalibrationError, request_costs, request_spread
from latlab.sim.validate import compare

PROBE_REQUESTS = 8  # one at a time: the per-request costs
PROBE_OUTPUT = 16  # their output tokens (a few decodes each: the costs are per request)
BATCH_OUTPUT = 32  # the full batch's output tokens: enough decodes at every size it shrinks by
PROMPT_ROOM = 8  # the probe's mean prompt at most this share of the context (1 in 8)
PROBE_LOAD = 0.5  # the open-loop probe's rate, as a share of the predicted capacity
PROBE_OPEN_S = 10.0  # and about how long it runs (what the served step costs are fitted to),
PROBE_OPEN_MIN = 8  # with this many requests at least if they fit in
PROBE_OPEN_LONGEST_S = 18.0  # this long (a busy host's lower rate: a longer probe)

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
    `probe`, short loads through that latlab serve (started first, loading beside the
    in-process engine) for the per-request costs and the step costs as served, and how well
    the calibration replays them. The `RUN_TIME` options are left out of both."""
    dropped = [flag for name, flag in RUN_TIME.items()
               if getattr(config, name) not in (None, EngineConfig.model_fields[name].default)]
    config, serve = calibrated_engine(config), calibration_args(serve)
    if dropped:
        err.print(f"calibrating without {', '.join(dropped)}: they change when requests run, "
                  "not what a step costs; latlab predict simulates them", style="dim",
                  highlight=False)
    err.print("calibrating latlab's engine: timing its steps over a grid of batch shapes…",
              style="dim", highlight=False)
    with tempfile.TemporaryDirectory(prefix="latlab-calibrate-") as tmp:
        steps = Path(tmp) / "steps.jsonl"
        server = (spawn_server(ServerLaunch.embedded([*serve, "--step-log", str(steps)],
                                                     name="the probe's latlab serve"),
                               log_path=Path(tmp) / "engine.log") if probe else nullcontext())
        with server:
            # torch loads here, beside the probes' latlab serve already starting (and so
            # does it there), not before it
            from latlab.engine.loader import ModelLoadError

            try:
                cal = calibrations.engine_calibration(
                    config, lambda m: err.print(f"  {m}", style="dim", highlight=False),
                    describe=" ".join(["latlab serve", *serve]) if serve else "",
                    before_timing=(lambda: _wait_ready(server, err)) if probe else None)
            except (ConfigError, ModelLoadError) as e:
                raise InputError(f"--serve-args: {e}") from None
            if probe:
                cal = _probe(cal, server, steps, err)
    return cal


def _wait_ready(server: ServerProcess, err: Console) -> None:
    """Wait for the probes' latlab serve, started beside the engine's build; say how long."""
    waited = time.perf_counter()
    server.wait_ready(READY_TIMEOUT_S)
    err.print(f"  latlab serve for the probes ready {server.ready_s:.1f} s after its start "
              f"(waited {time.perf_counter() - waited:.1f} s for it)", style="dim",
              highlight=False)


def open_probe(capacity: float) -> tuple[float, int]:
    """The open-loop probe's rate (`PROBE_LOAD` of `capacity`, req/s, to two significant
    figures: never rounded to none) and its requests: about `PROBE_OPEN_S` seconds of them,
    or `PROBE_OPEN_MIN` where they fit in `PROBE_OPEN_LONGEST_S` (on a busy host the steps
    of 3 or 4 requests fitted the served costs badly), two at least (a slow server's probe
    runs longer rather than not at all)."""
    if not (math.isfinite(capacity) and capacity > 0):
        raise ServiceFailed(f"the in-process calibration predicts a capacity of {capacity:g} "
                            "req/s: nothing to probe at half of it")
    rate = float(f"{PROBE_LOAD * capacity:.2g}")
    return rate, max(2, round(rate * PROBE_OPEN_S),
                     min(PROBE_OPEN_MIN, round(rate * PROBE_OPEN_LONGEST_S)))


def probe_prompts(context: int | None) -> LengthDistribution:
    """The open-loop probe's prompt lengths: a bench's default, scaled down where the
    engine's context is short enough for its tail to leave no room for output (a probe of
    hundreds of requests at a small model's high capacity draws that tail)."""
    default = WorkloadConfig.model_fields["prompt_tokens"].default
    if context is None or context >= PROMPT_ROOM * default.a:
        return default
    mean = max(1, context // PROMPT_ROOM)
    return LengthDistribution(kind=default.kind, a=mean, b=mean * default.b / default.a)


@dataclass(frozen=True)
class Probe:
    """One short bench through the probes' latlab serve, and what it is for."""

    arrivals: ArrivalConfig
    requests: int
    workload: WorkloadConfig
    why: str

    def line(self) -> str:
        a = self.arrivals
        shape = (f"{self.requests} at {a.rate:g}/s (Poisson)" if a.open_loop else
                 f"{self.requests} requests from {a.users} user" + ("s" if a.users > 1 else ""))
        return f"{shape}, {self.why}"


def probe_plan(batch: int, context: int | None, capacity: float) -> list[Probe]:
    """The probes of an engine that batches `batch` sequences of `context` tokens at most
    and completes `capacity` req/s (as calibrated in process): one request at a time, a
    full batch, and Poisson arrivals at half the capacity (`open_probe`)."""
    rate, opened = open_probe(capacity)
    return [Probe(ArrivalConfig(process="closed", users=1), PROBE_REQUESTS,
                  WorkloadConfig(output_tokens=f"fixed:{PROBE_OUTPUT}"),
                  "one at a time (the per-request costs)"),
            Probe(ArrivalConfig(process="closed", users=batch), batch,
                  WorkloadConfig(output_tokens=f"fixed:{BATCH_OUTPUT}"), "a full batch"),
            Probe(ArrivalConfig(process="poisson", rate=rate), opened,
                  WorkloadConfig(prompt_tokens=probe_prompts(context)),
                  "the step costs as served")]


def _probe(cal: Calibration, engine: ServerProcess, steps: Path, err: Console) -> Calibration:
    """Short benches through `engine`, a latlab serve writing its steps to `steps`, each a
    line on `err` as it starts and ends: one request at a time (the per-request costs), a
    full batch (as many users as the engine batches, one request each), and Poisson arrivals
    at half the capacity the in-process calibration predicts. The step cost is then fitted
    to the steps served under those arrivals (`calibration.as_served`): the engine's steps
    cost more while its HTTP server takes in and streams requests as they come than in a
    closed loop or in process. How well the result replays each probe is noted."""
    plan = probe_plan(cal.engine.max_num_seqs, cal.engine.max_model_len,
                      calibrations.capacity(cal, 2 * cal.engine.max_num_seqs))
    err.print("probing latlab serve…", style="dim", highlight=False)
    with tempfile.TemporaryDirectory(prefix="latlab-calibrate-probes-") as tmp:
        runs = []
        for i, probe in enumerate(plan, 1):
            err.print(f"  probe {i}/{len(plan)}: {probe.line()}…", style="dim",
                      highlight=False)
            started = time.perf_counter()
            bench = BenchConfig(url=engine.url, workload=probe.workload,
                                arrivals=probe.arrivals, duration_s=None,
                                requests=probe.requests, out=Path(tmp), name="calibrate-probe")
            load = run_load(bench)  # the records only: no summary, analysis or report
            if load.failed:
                raise ServiceFailed(f"probe {i}/{len(plan)} through latlab serve failed: "
                                    f"{load.message}")
            runs.append(load.run)
            err.print(f"  probe {i}/{len(plan)} done in {time.perf_counter() - started:.1f} s",
                      style="dim", highlight=False)
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
