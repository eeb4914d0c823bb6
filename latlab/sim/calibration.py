"""Making, reading and caching calibrations (`latlab.records.calibration.Calibration`).

    calibration = engine_calibration(EngineConfig())       # time latlab's engine in process
    calibration = run_calibration([Path("runs/…-sweep-x")])  # fit any server's run folders
    save(calibration, path); load(path)

The default engine's calibration is cached per machine (`cache_path`: under
`$LATLAB_CACHE`, else `$XDG_CACHE_HOME/latlab`, else `~/.cache/latlab`), keyed by the
engine's options, so `latlab predict` calibrates on first use only.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from latlab import __version__
from latlab.records.arrivals import ArrivalConfig
from latlab.records.calibration import (
    Calibration,
    Reference,
    RequestCosts,
    RequestSpread,
    SizeFactor,
    Spread,
    StepCost,
)
from latlab.records.folder import RunFolderError, read_json, write_json
from latlab.records.steps import StepRecord
from latlab.records.workload import WorkloadConfig
from latlab.sim.calibrate_run import (
    CalibrationError,
    request_costs,
    request_spread,
    rows,
    run_folders,
    shape_from,
)
from latlab.sim.fleet import simulate
from latlab.sim.spread import estimate, misfit
from latlab.sim.stepcost import StepCostModel, features, fit, told_apart
from latlab.sim.stretches import window_variance
from latlab.sim.workload import build

RUN_FEATURES = ("step", "tokens", "decodes", "decode_context", "prefill_attention")
# A step of one row (a lone decode: a matrix-vector product) is cheaper than the line
# through the others: the hinges at 1 and 2 tokens let the fit step there.
ENGINE_KNOTS = (1.0, 2.0)
MIN_ROWS = 8
METHOD = "served-steps-stretches"  # how the engine is calibrated: a change makes cached ones stale
NOISY_FIT = 0.10  # a mean step-time error above this: the steps were not steady


def cache_path(serve_args: Sequence[str] = ()) -> Path:
    """Where the calibration of the engine `latlab serve SERVE_ARGS` is cached."""
    root = os.environ.get("LATLAB_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "latlab"
    key = hashlib.sha256(" ".join([__version__, METHOD, platform.node(), *serve_args]).encode())
    return Path(root) / f"calibration-engine-{key.hexdigest()[:12]}.json"


def load(path: Path) -> Calibration:
    """A calibration file; `CalibrationError` says what is wrong with it."""
    try:
        return read_json(Path(path), Calibration)
    except RunFolderError as e:
        raise CalibrationError(str(e)) from None


def save(calibration: Calibration, path: Path) -> Path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(path), calibration)
    return Path(path)


def engine_calibration(config, progress: Callable[[str], None] | None = None,
                       describe: str = "", before_timing: Callable[[], None] | None = None
                       ) -> Calibration:
    """Time latlab's engine (an `EngineConfig`) over the grid and fit the step costs
    (`before_timing`: see `time_engine`)."""
    from latlab.sim.calibrate_engine import time_engine

    started = time.perf_counter()
    x, ms, when, shape, reference = time_engine(config, progress, before_timing)
    step, error = fit(x, ms, ENGINE_KNOTS)
    spread, by_size = estimate(*misfit(step, x, ms), when, np.zeros(len(ms)))
    return Calibration(
        latlab_version=__version__, source="engine",
        server=describe or f"latlab engine ({config.model} preset, {config.threads} thread)",
        target={"model": config.model, "threads": config.threads, "dtype": config.dtype,
                "host": platform.node()},
        engine=shape, step=step.model_copy(update={"by_size": by_size}), fit=error,
        spread=spread,
        reference=Reference(ms=reference, load_average=os.getloadavg()[0],
                            cpus=os.cpu_count()),
        notes=[f"{len(ms)} engine steps timed in process in {time.perf_counter() - started:.0f} "
               f"s; per-request costs not measured (zero) unless a probe run set them"])


def fit_warning(calibration: Calibration) -> str | None:
    """A line for the user when the fit is too loose to trust: an engine whose steps were
    not steady, or run folders the step-cost model does not reproduce."""
    mape = calibration.fit.mape
    if mape <= NOISY_FIT:
        return None
    if calibration.source == "engine":
        return (f"the fit error is {100 * mape:.0f}%: the engine's steps were not steady "
                "(another process sharing the CPU?); calibrate again when the machine is quiet")
    return (f"the fit error is {100 * mape:.0f}%: the step-cost model reproduces these runs' "
            "timings loosely (a noisy machine, or limits other than the server's: "
            "--max-num-seqs, --max-num-batched-tokens); the intervals carry that error — "
            "check the predictions against measured runs (latlab predict --check RUN)")


def with_request_costs(calibration: Calibration, costs: RequestCosts, where: str,
                       spread: RequestSpread | None = None) -> Calibration:
    notes = [n for n in calibration.notes if "per-request costs" not in n]
    notes.append(f"per-request costs from {where}: preprocess {costs.preprocess:.2f} ms, "
                 f"postprocess {costs.postprocess:.2f} ms, network {costs.network:.2f} ms")
    update = {"request": costs, "notes": notes}
    if spread is not None and calibration.spread is not None:
        update["spread"] = calibration.spread.model_copy(update={"request": spread})
    return calibration.model_copy(update=update)


def as_served(calibration: Calibration, steps: Sequence[StepRecord],
              probes: Sequence[Sequence[StepRecord]] = ()) -> Calibration:
    """The step cost fitted to the steps a server really ran (`latlab serve --step-log`):
    served ms ≈ scale × the cost timed in process + a fixed cost a step, least squares on
    relative error. What serving adds to a step lands in those two numbers: the HTTP event
    loop and the load generator sharing the CPU (and the GIL) with the engine, and the
    machine's speed at the time. With `probes` (the served steps of each probe run), the
    spread is theirs around the result (`served_spread`)."""
    from scipy.optimize import lsq_linear

    if len(steps) < MIN_ROWS:
        raise CalibrationError(f"{len(steps)} served steps: too few to fit")
    linear = calibration.step.model_copy(update={"by_size": []})
    charged = charged_ms(linear, steps)
    served = np.array([s.ms for s in steps])
    a = np.column_stack([charged / served, 1 / served])
    scale, extra = lsq_linear(a, np.ones(len(served)), bounds=(0.0, np.inf),
                              method="bvls").x  # exact (`stepcost.fit` says why)
    before = float(np.mean(np.abs(charged / served - 1)))
    after = float(np.mean(np.abs((scale * charged + extra) / served - 1)))
    step = scaled_step(linear, float(scale), float(extra))  # in-process factors: replaced
    spread = calibration.spread
    if probes:  # the factors by size, too, are the served steps' (`served_spread`)
        spread, by_size = served_spread(step, probes, calibration.spread)
        step = step.model_copy(update={"by_size": by_size})
    note = (f"step costs fitted to {len(steps)} steps served through latlab serve: "
            f"{scale:.3f} × the steps timed in process + {extra:.3f} ms a step (mean error on "
            f"the served steps {before:.1%} before, {after:.1%} after)")
    return calibration.model_copy(update={"step": step, "spread": spread,
                                          "notes": [*calibration.notes, note]})


def served_spread(step: StepCost, probes: Sequence[Sequence[StepRecord]],
                  timed: Spread | None) -> tuple[Spread, list[SizeFactor]]:
    """The spread of each probe's served steps around `step`'s linear model (each probe a
    run; single steps in time order: their slow stretches too), its drift pooled with the
    drift of the steps `timed` in process (over their windows, beyond what the stretches
    make of a window), and the factors by size of the served steps."""
    chosen = [(i, s) for i, probe in enumerate(probes) for s in probe]
    x = features([s.features() for _, s in chosen])
    ms = np.array([s.ms for _, s in chosen])
    when = np.array([s.start_ns / 1e9 for _, s in chosen])
    spread, by_size = estimate(*misfit(step, x, ms), when, np.array([i for i, _ in chosen]),
                               request=timed.request if timed else RequestSpread(),
                               with_stretches=True)
    if timed is None or not timed.windows:
        return spread, by_size
    windows = spread.windows + timed.windows
    timed_drift = timed.drift ** 2 - window_variance(
        spread.stretches, timed.window_s, timed.window_s * timed.windows)
    drift = math.sqrt((spread.windows * spread.drift ** 2 + timed.windows * max(0.0, timed_drift))
                      / windows)
    return spread.model_copy(update={"drift": drift, "windows": windows}), by_size


def rescaled(calibration: Calibration, factor: float, why: str) -> Calibration:
    """`calibration` with every step cost × `factor` (the machine that much slower), noted."""
    note = f"step costs scaled by {factor:.3f}: {why}"
    return calibration.model_copy(update={"step": scaled_step(calibration.step, factor),
                                          "notes": [*calibration.notes, note]})


def charged_ms(cost: StepCost, steps: Sequence[StepRecord]) -> np.ndarray:
    """What `cost` charges for each of `steps` (ms)."""
    model = StepCostModel(cost)
    return np.array([model.seconds(*s.features()) for s in steps]) * 1e3


def scaled_step(step: StepCost, scale: float, extra_ms: float = 0.0) -> StepCost:
    """`step` with every cost times `scale`, plus `extra_ms` a step (its factors by size
    where the linear model's times moved to)."""
    coefficients = {k: v * scale for k, v in step.coefficients.items()}
    coefficients["step"] = coefficients.get("step", 0.0) + extra_ms
    by_size = [f.model_copy(update={"ms": f.ms * scale + extra_ms}) for f in step.by_size]
    return step.model_copy(update={"coefficients": coefficients, "by_size": by_size,
                                   "hinges": [h * scale for h in step.hinges]})


def capacity(calibration: Calibration, users: int) -> float:
    """Requests a second the calibrated server completes under a closed loop of `users`
    (bench's default workload), simulated."""
    workload = build(WorkloadConfig(), ArrivalConfig(process="closed", users=users),
                     20 * users, None)
    c = simulate(workload, calibration).columns
    return len(c.done) / float(c.done.max() - c.sent.min())


def run_calibration(paths: Sequence[Path], shape: dict | None = None) -> Calibration:
    """Fit the step costs and per-request costs of the server the run folders measured."""
    try:
        runs = run_folders(paths)
        per_run = [run.read_records() for run in runs]
        configs = [run.read_config() for run in runs]
    except (RunFolderError, ValidationError, OSError) as e:
        raise CalibrationError(str(e)) from None
    records = [r for rs in per_run for r in rs]
    if not records:
        raise CalibrationError(f"{', '.join(map(str, paths))}: no request records")
    costs = request_costs(records)
    engine = shape_from(records, shape or {})
    xs, ys, whens, decodes, prefills = [], [], [], 0, 0
    for rs in per_run:
        x, y, when, d, p = rows(rs, costs, engine)
        xs.append(x)
        ys.append(y)
        whens.append(when)
        decodes, prefills = decodes + d, prefills + p
    x, y = np.vstack(xs), np.concatenate(ys)
    if len(y) < MIN_ROWS or not decodes or not prefills:
        raise CalibrationError(f"too little to fit: {decodes} decodes (3+ tokens) and "
                               f"{prefills} prefills (server timings, or TTFT with nothing else "
                               f"in flight) in {len(records)} requests; run a sweep or a bench "
                               "with more requests, some at low load")
    step, error = fit(x, y, use=RUN_FEATURES, what="request prefill time and TPOT")
    spread, by_size = estimate(*misfit(step, x, y), np.concatenate(whens),
                               np.repeat(np.arange(len(ys)), [len(v) for v in ys]),
                               request=request_spread(records))
    target = configs[0].target
    server = " ".join(str(v) for v in (target.server_kind, target.url, target.model) if v)
    timed = sum(1 for r in records if r.ok and r.server is not None)
    told = told_apart(x, y, RUN_FEATURES)
    unsure = [] if told == len(RUN_FEATURES) else [
        f"the run tells apart {told} of the {len(RUN_FEATURES)} step costs (its requests' "
        "lengths and concurrency varied too little): the fit keeps the fewest costs that "
        "explain it, and a prediction for other lengths is an extrapolation"]
    return Calibration(
        latlab_version=__version__, source="run", server=server or "the server measured",
        target=target.model_dump(mode="json"), engine=engine,
        step=step.model_copy(update={"by_size": by_size}), request=costs,
        fit=error, runs=[str(run.path) for run in runs], spread=spread,
        notes=[f"fitted from {decodes} decodes and {prefills} prefills of {len(records)} "
               f"requests in {len(runs)} run folders ({timed} with server timings)",
               "engine limits (max_num_seqs, max_num_batched_tokens, KV blocks) are "
               + ("as given" if shape else "defaults, not measured: pass the server's own"),
               *unsure])
