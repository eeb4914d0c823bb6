"""`latlab calibrate`: fit the step-cost model `latlab predict` simulates a server with.

Without `--from`, latlab's own engine: its steps timed in process over a grid of batch
shapes, then a short probe through `latlab serve` for the per-request costs (preprocess,
postprocess, network). With `--from RUN_DIR` (bench runs or sweep folders), whatever server
they measured.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console

from latlab.commands.common import RunFailed, UsageError, console, print_json
from latlab.commands.groups import split_serve_args
from latlab.commands.options import Options, opt
from latlab.commands.serve import parse_serve_args
from latlab.records.calibration import CALIBRATION_JSON, Calibration
from latlab.records.config import BenchConfig
from latlab.records.folder import RunFolder
from latlab.records.steps import StepLogError, read_step_log
from latlab.records.workload import ArrivalConfig, WorkloadConfig
from latlab.sim import calibration as calibrations
from latlab.sim.calibrate_run import CalibrationError, request_costs
from latlab.sim.validate import compare

PROBE_REQUESTS = 16
LOADED_USERS = 4
PROBE_LOAD = 0.5  # the open-loop probe's rate, as a share of the predicted capacity
PROBE_OPEN_S = 20.0  # and about how long it runs


# latlab serve options the simulated replica does not follow (the scheduler's other options,
# prefix caching, priorities and fair share, it does).
NOT_SIMULATED = ("speculative_method", "max_queue_delay", "idle_unload")


class ShapeOptions(Options):
    max_num_seqs: int | None = opt(None, "--from: the server's batch limit (vLLM "
                                         "--max-num-seqs, llama-server --parallel) (default 256).")
    max_num_batched_tokens: int | None = opt(None, "--from: the server's token budget per step "
                                                   "(default 2048).")
    num_kv_blocks: int | None = opt(None, "--from: KV-cache blocks (default: unlimited).")
    block_size: int | None = opt(None, "--from: tokens per KV-cache block (default 16).")
    max_model_len: int | None = opt(None, "--from: the context length (default 2048).")
    max_waiting: int | None = opt(None, "--from: waiting-queue limit before 429s "
                                        "(default: none).")

    def shape(self) -> dict:
        return {k: getattr(self, k) for k in ShapeOptions.model_fields}


class CalibrateOptions(ShapeOptions):
    from_runs: list[Path] = opt([], "Fit from these run folders or sweep folders (repeatable) "
                                    "instead of timing latlab's engine.", "--from")
    serve_args: str = opt("", "latlab serve options of the engine to calibrate.")
    probe: bool = opt(True, "Time per-request costs through latlab serve (a short bench).")
    out: Path | None = opt(None, "Where to write the calibration (default: the engine's cache, "
                                 "or calibration.json in the first --from folder).")
    json_output: bool = opt(False, "Print calibration.json to stdout.", "--json")


def calibrate(options: CalibrateOptions) -> None:
    """Fit a server's step costs for `latlab predict`: latlab's engine timed directly, or any
    server from its run folders. Writes a calibration JSON stating its fit error and date."""
    err = console(stderr=True)
    if options.from_runs:
        if options.serve_args:
            raise UsageError("--serve-args is for latlab's engine; --from fits the run folders")
        try:
            cal = calibrations.run_calibration(options.from_runs, options.shape())
        except CalibrationError as e:
            raise UsageError(str(e)) from None
        path = options.out or Path(options.from_runs[0]) / CALIBRATION_JSON
    else:
        if any(v is not None for v in options.shape().values()):
            raise UsageError("--max-num-seqs and the like describe another server (--from); "
                             "latlab's engine takes them in --serve-args")
        serve = split_serve_args(options.serve_args)
        cal = calibrate_engine(serve, err, probe=options.probe)
        path = options.out or calibrations.cache_path(serve)
    calibrations.save(cal, path)
    if options.json_output:
        print_json(cal.model_dump(mode="json") | {"path": str(path)})
        return
    print_calibration(console(), cal, path)


def calibrate_engine(serve: list[str], err: Console, probe: bool = True) -> Calibration:
    """Time the engine `latlab serve SERVE` in process; with `probe`, its per-request costs
    through a short bench (sequential requests), and how well the calibration replays it."""
    from latlab.engine.config import ConfigError
    from latlab.engine.loader import ModelLoadError

    config = parse_serve_args(serve).engine_config()
    if unsimulated := [f"--{name.replace('_', '-')}" for name in NOT_SIMULATED
                       if getattr(config, name) is not None]:
        raise UsageError(f"--serve-args: latlab predict does not simulate {', '.join(unsimulated)}")
    err.print("calibrating latlab's engine: timing its steps over a grid of batch shapes…",
              style="dim", highlight=False)
    try:
        cal = calibrations.engine_calibration(
            config, lambda m: err.print(f"  {m}", style="dim", highlight=False),
            describe=" ".join(["latlab serve", *serve]) if serve else "")
    except (ConfigError, ModelLoadError) as e:
        raise UsageError(f"--serve-args: {e}") from None
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
    from latlab.commands.bench import run_bench
    from latlab.load.target.launch import EngineError, start_engine

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
        try:
            engine = start_engine([*serve, "--step-log", str(steps)],
                                  log_path=Path(tmp) / "engine.log")
        except EngineError as e:
            raise RunFailed(f"the probe could not start latlab serve: {e}") from None
        runs = []
        try:
            for arrivals, requests in plan:
                bench = BenchConfig(url=engine.url, workload=WorkloadConfig(),
                                    arrivals=arrivals, duration_s=None, requests=requests,
                                    out=Path(tmp), name="calibrate-probe")
                runs.append(RunFolder(run_bench(bench).run.path))
        finally:
            engine.stop()
        costs = request_costs(runs[0].read_records())
        cal = calibrations.with_request_costs(cal, costs, "a probe through latlab serve")
        open_loop = [r for r in runs[-1].read_records() if r.origin_ns and r.end_ns]
        start = min(r.origin_ns for r in open_loop)
        end = max(r.end_ns for r in open_loop)
        try:
            served = [s for s in read_step_log(steps) if start <= s.start_ns <= end]
            cal = calibrations.as_served(cal, served)
        except (StepLogError, CalibrationError) as e:
            raise RunFailed(f"the open-loop probe's steps: {e}") from None
        checks = [compare(cal, run) for run in runs]
    cal.notes += [f"probe replayed on the calibration: {c.line()}" for c in checks]
    return cal


def print_calibration(out: Console, cal: Calibration, path: Path | None) -> None:
    out.print(cal.headline(), highlight=False)
    out.print(f"  step time = {cal.step.describe()}", highlight=False, markup=False)
    r = cal.request
    out.print(f"  per request: preprocess {r.preprocess:.2f} ms, postprocess {r.postprocess:.2f} "
              f"ms, network {r.network:.2f} ms", highlight=False)
    e = cal.engine
    out.print(f"  engine: max {e.max_num_seqs} sequences, {e.max_num_batched_tokens} tokens a "
              f"step, {e.num_kv_blocks} KV blocks of {e.block_size}, context {e.max_model_len}, "
              f"{e.batching} batching" + (", chunked prefill" if e.chunked_prefill else "")
              + (", prefix caching" if e.enable_prefix_caching else "")
              + (f", {e.scheduling_policy} policy" if e.scheduling_policy != "fcfs" else "")
              + (", fair share" if e.fair_share else "")
              + (f", {e.max_prefill_tokens} prefill tokens a step" if e.max_prefill_tokens else "")
              + (f", {e.max_decode_tokens} decode tokens a step" if e.max_decode_tokens else ""),
              highlight=False)
    for note in cal.notes:
        out.print(f"  note: {note}", highlight=False, markup=False)
    if warning := calibrations.fit_warning(cal):
        out.print(f"  warning: {warning}", style="yellow", highlight=False, markup=False)
    if path is not None:
        out.print(f"calibration: {path}", highlight=False)
