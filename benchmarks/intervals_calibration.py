"""The calibrations `predict_intervals.py` checks each version's intervals on: this
checkout's (its samples kept, to fit again later: `keeping_samples`, `recalibrated`) and a
baseline source tree's own (`baseline_calibration`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from latlab.sim import calibration as calibrations


def keeping_samples(out: Path) -> None:
    """From now on, an engine calibration made in this process keeps what it fitted under
    `out`: the in-process grid's steps (`grid.npz`), the calibration before the served fit
    (`in-process.json`) and each probe's served steps (`probes.jsonl`) — so that a later
    latlab can fit the same samples again (`recalibrated`)."""
    import latlab.sim.calibrate_engine as engine_module

    out.mkdir(parents=True, exist_ok=True)
    time_engine, as_served = engine_module.time_engine, calibrations.as_served

    def timed(*args, **kwargs):
        x, ms, when, shape, reference = time_engine(*args, **kwargs)
        np.savez(out / "grid.npz", x=x, ms=ms, when=when)
        return x, ms, when, shape, reference

    def served(cal, steps, probes=()):
        (out / "in-process.json").write_text(cal.model_dump_json(indent=1))
        (out / "probes.jsonl").write_text("".join(
            json.dumps({"probe": i, **s.model_dump()}) + "\n"
            for i, probe in enumerate(probes) for s in probe))
        return as_served(cal, steps, probes)

    engine_module.time_engine, calibrations.as_served = timed, served


def recalibrated(samples: Path, out: Path) -> Path:
    """The calibration this checkout fits to samples an earlier one kept (`keeping_samples`):
    the same timings, this checkout's fit and spread."""
    from latlab.records.calibration import Calibration
    from latlab.records.steps import StepRecord
    from latlab.sim.spread import estimate, misfit
    from latlab.sim.stepcost import fit

    grid = np.load(samples / "grid.npz")
    x, ms, when = grid["x"], grid["ms"], grid["when"]
    before = Calibration.model_validate_json((samples / "in-process.json").read_text())
    step, error = fit(x, ms, calibrations.ENGINE_KNOTS)
    spread, by_size = estimate(*misfit(step, x, ms), when, np.zeros(len(ms)))
    before = before.model_copy(update={
        "step": step.model_copy(update={"by_size": by_size}), "fit": error,
        "spread": spread.model_copy(update={"request": before.spread.request})})
    probes: dict[int, list[StepRecord]] = {}
    for line in (samples / "probes.jsonl").read_text().splitlines():
        row = json.loads(line)
        probes.setdefault(row.pop("probe"), []).append(StepRecord(**row))
    served = [probes[i] for i in sorted(probes)]
    cal = calibrations.as_served(before, served[-1], served)
    path = calibrations.save(cal, out / "intervals-calibration-recomputed.json")
    print(f"recomputed from {samples}: {cal.spread.describe()}")
    return path


def baseline_calibration(src: Path, out: Path) -> Path:
    """The baseline's own calibration of the engine (`latlab calibrate`, with the latlab in
    `src`): each version's intervals are checked on the calibration it makes itself."""
    path = out / "intervals-calibration-baseline.json"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "latlab", "calibrate", "--out", str(path)],
                          env=os.environ | {"PYTHONPATH": str(src)}, cwd=src, timeout=600,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"latlab calibrate ({src}) failed:\n{done.stderr[-2000:]}")
    cal = calibrations.load(path)
    print(f"baseline calibrated in {time.perf_counter() - started:.0f} s: {cal.headline()}")
    print(f"  spread: {cal.spread.describe() if cal.spread else 'none'}")
    return path
