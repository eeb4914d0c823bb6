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
import os
import platform
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from pydantic import ValidationError

from latlab import __version__
from latlab.records.calibration import Calibration, RequestCosts
from latlab.records.folder import RunFolder, RunFolderError, read_json, write_json
from latlab.sim.calibrate_run import (CalibrationError, request_costs, rows, run_folders,
                                      shape_from)
from latlab.sim.fleet import simulate
from latlab.sim.stepcost import fit
from latlab.sim.workload import replay, replayed_records

RUN_FEATURES = ("step", "tokens", "decodes", "decode_context", "prefill_attention")
# A step of one row (a lone decode: a matrix-vector product) is cheaper than the line
# through the others: the hinges at 1 and 2 tokens let the fit step there.
ENGINE_KNOTS = (1.0, 2.0)
MIN_ROWS = 8
NOISY_FIT = 0.10  # a mean step-time error above this: the steps were not steady


def cache_path(serve_args: Sequence[str] = ()) -> Path:
    """Where the calibration of the engine `latlab serve SERVE_ARGS` is cached."""
    root = os.environ.get("LATLAB_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "latlab"
    key = hashlib.sha256(" ".join([__version__, platform.node(), *serve_args]).encode())
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
                       describe: str = "") -> Calibration:
    """Time latlab's engine (an `EngineConfig`) over the grid and fit the step costs."""
    from latlab.sim.calibrate_engine import time_engine

    started = time.perf_counter()
    x, ms, shape = time_engine(config, progress)
    step, error = fit(x, ms, ENGINE_KNOTS)
    return Calibration(
        latlab_version=__version__, source="engine",
        server=describe or f"latlab engine ({config.model} preset, {config.threads} thread)",
        target={"model": config.model, "threads": config.threads, "dtype": config.dtype,
                "host": platform.node()},
        engine=shape, step=step, fit=error,
        notes=[f"{len(ms)} engine steps timed in process in {time.perf_counter() - started:.0f} "
               f"s; per-request costs not measured (zero) unless a probe run set them"])


def fit_warning(calibration: Calibration) -> str | None:
    """A line for the user when an engine calibration's steps were too unsteady to trust."""
    mape = calibration.fit.mape
    if calibration.source != "engine" or mape <= NOISY_FIT:
        return None
    return (f"the fit error is {100 * mape:.0f}%: the engine's steps were not steady (another "
            "process sharing the CPU?); calibrate again when the machine is quiet")


def with_request_costs(calibration: Calibration, costs: RequestCosts, where: str
                       ) -> Calibration:
    notes = [n for n in calibration.notes if "per-request costs" not in n]
    notes.append(f"per-request costs from {where}: preprocess {costs.preprocess:.2f} ms, "
                 f"postprocess {costs.postprocess:.2f} ms, network {costs.network:.2f} ms")
    return calibration.model_copy(update={"request": costs, "notes": notes})


def serving_overhead(calibration: Calibration, runs: Sequence[RunFolder], rounds: int = 2
                     ) -> Calibration:
    """Add what serving costs beyond the engine's steps timed in process — the HTTP server's
    event loop and the load generator sharing the CPU with the engine — fitted so that
    replaying `runs` (probes through the server) gives their measured TPOT: least squares of
    each request's relative TPOT shortfall on the share of its decode steps that batch two
    or more sequences and on the mean tokens streamed per step. They become a jump in the
    step cost at two tokens (hinges at 1 and 2) and a cost per sampled token."""
    from scipy.optimize import lsq_linear

    added = np.zeros(2)
    for _ in range(rounds):
        xs, ys = [], []
        for run in runs:
            records = replayed_records(run)
            result = simulate(replay(run), calibration)
            first, last = result.first_last_token()
            streamed, multi = result.decode_means()
            for i, r in enumerate(records):
                n = r.output_tokens or 0
                if not (r.ok and n >= 3 and r.first_token_ns and r.last_token_ns
                        and np.isfinite(first[i]) and np.isfinite(streamed[i])):
                    continue
                measured = (r.last_token_ns - r.first_token_ns) / 1e6 / (n - 1)
                predicted = (last[i] - first[i]) * 1e3 / (n - 1)
                xs.append([multi[i] / measured, streamed[i] / measured])
                ys.append((measured - predicted) / measured)
        if len(ys) < MIN_ROWS:
            break
        step = lsq_linear(np.asarray(xs), np.asarray(ys), bounds=(-added, np.inf)).x
        added += step
        calibration = _add_overhead(calibration, float(step[0]), float(step[1]))
    calibration.notes.append(f"serving overhead fitted from {len(runs)} probes through the "
                             f"server: +{added[0]:.3f} ms a step that batches two or more, "
                             f"+{added[1]:.3f} ms a streamed token")
    return calibration


def _add_overhead(calibration: Calibration, multi: float, per_token: float) -> Calibration:
    step = calibration.step
    coefficients = dict(step.coefficients)
    coefficients["sampled"] = coefficients.get("sampled", 0.0) + per_token
    knots, hinges = list(step.knots), list(step.hinges)
    for knot, sign in ((1.0, 1.0), (2.0, -1.0)):  # (t−1)₊ − (t−2)₊: 1 from two tokens on
        if knot not in knots:
            knots.append(knot)
            hinges.append(0.0)
        hinges[knots.index(knot)] += sign * multi
    return calibration.model_copy(update={"step": step.model_copy(update={
        "coefficients": coefficients, "knots": knots, "hinges": hinges})})


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
    xs, ys, decodes, prefills = [], [], 0, 0
    for rs in per_run:
        x, y, d, p = rows(rs, costs, engine)
        xs.append(x)
        ys.append(y)
        decodes, prefills = decodes + d, prefills + p
    x, y = np.vstack(xs), np.concatenate(ys)
    if len(y) < MIN_ROWS or not decodes or not prefills:
        raise CalibrationError(f"too little to fit: {decodes} decodes (3+ tokens) and "
                               f"{prefills} prefills (server timings, or TTFT with nothing else "
                               f"in flight) in {len(records)} requests; run a sweep or a bench "
                               "with more requests, some at low load")
    step, error = fit(x, y, use=RUN_FEATURES, what="request prefill time and TPOT")
    target = configs[0].target
    server = " ".join(str(v) for v in (target.server_kind, target.url, target.model) if v)
    timed = sum(1 for r in records if r.ok and r.server is not None)
    return Calibration(
        latlab_version=__version__, source="run", server=server or "the server measured",
        target=target.model_dump(mode="json"), engine=engine, step=step, request=costs,
        fit=error, runs=[str(run.path) for run in runs],
        notes=[f"fitted from {decodes} decodes and {prefills} prefills of {len(records)} "
               f"requests in {len(runs)} run folders ({timed} with server timings)",
               "engine limits (max_num_seqs, max_num_batched_tokens, KV blocks) are "
               + ("as given" if shape else "defaults, not measured: pass the server's own")])
