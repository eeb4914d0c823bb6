"""What the width of `predict_intervals.py`'s intervals is made of: each part of the
calibration's spread turned off (`parts`), the level known or probed (`level_variants`), and
the checks the machine probe before each run would have given (`probed`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from intervals_scoring import ROOT, checked, summarised, width

from latlab.records.calibration import RequestSpread
from latlab.sim import calibration as calibrations
from latlab.sim.spread import drift_limit, spread_of

# Each part of the spread turned off alone, then all of them: what is left of the width is the
# runs' own sampling (a short run's percentile varies from run to run).
PARTS = {
    "as calibrated": {},
    "no level across step sizes (shape 0)": {"shape": 0.0},
    "no level between runs (between 0)": {"between": 0.0},
    "no level (shape, between 0)": {"shape": 0.0, "between": 0.0},
    "no drift (drift 0)": {"drift": 0.0},
    "no request costs' spread": {"request": RequestSpread()},
    "nothing: the runs' sampling alone": {"shape": 0.0, "between": 0.0, "drift": 0.0,
                                          "request": RequestSpread()},
}


def parts(runs: list[dict], calibration: Path, draws: int, out: Path) -> dict:
    """The intervals of this checkout with each part of the calibration's spread turned off
    (`PARTS`): per part, the coverage and the median width below `NARROW_BELOW` of capacity
    and at each load."""
    cal = calibrations.load(calibration)
    fraction = {r["run"]: r["fraction"] for r in runs}
    print("\nthe width, part by part (this checkout; each line a calibration with that part "
          "of its spread set to zero):")
    result = {}
    for name, update in PARTS.items():
        path = out / f"parts-{len(result)}.json"
        calibrations.save(cal.model_copy(update={"spread": cal.spread.model_copy(
            update=update)}), path)
        checks, _ = checked(ROOT, runs, path, draws)
        values = list(checks.values())
        by_load = {f: float(np.median([width(c) for c in values
                                       if fraction[c["run"]] == f]))
                   for f in sorted(set(fraction.values()))}
        by_percentile = {q: float(np.median([width(c) for c in values
                                             if c["percentile"] == q]))
                         for q in sorted({c["percentile"] for c in values})}
        inside = float(np.mean([c["inside"] for c in values]))
        result[name] = {"coverage": inside, "median_width": by_load,
                        "median_width_by_percentile": by_percentile,
                        "checks": [{k: c[k] for k in ("run", "metric", "percentile",
                                                      "measured", "predicted", "lo", "hi",
                                                      "inside")} for c in values]}
        print(f"  {name:<40} {100 * inside:>4.0f}% inside; hi/lo median "
              + ", ".join(f"{w:.2f}× at {f:.0%}" for f, w in by_load.items()) + "; "
              + ", ".join(f"{q} {w:.2f}×" for q, w in by_percentile.items()))
    return result


def level_variants(runs: list[dict], calibration: Path, draws: int, out: Path) -> dict:
    """The level, known or probed (this checkout, each run checked on its own calibration
    file): as calibrated; the machine probe's ratio before the run always applied (the step
    costs × it); without the level between runs (between 0), alone and after the probe; and,
    as a bound no method reaches, scaled by the run's own served steps' level (the level
    known exactly)."""
    cal = calibrations.load(calibration)
    out.mkdir(parents=True, exist_ok=True)
    variants = {"as calibrated": (False, {}), "probe: rescaled before each run": (True, {}),
                "between 0": (False, {"between": 0.0}),
                "probe + between 0": (True, {"between": 0.0}),
                "bound: the served level known, between 0": ("served", {"between": 0.0})}
    print("\nthe level, known or probed (this checkout; coverage, hi/lo median by load):")
    result = {}
    for i, (name, (rescale, update)) in enumerate(variants.items()):
        by_file: dict[Path, list[dict]] = {}
        for j, r in enumerate(runs):
            factor = (r["reference_ms"] / sum(cal.reference.ms) if rescale is True
                      else math.exp(r["served_level"]) if rescale == "served" else 1.0)
            mine = calibrations.rescaled(cal, factor, name) if factor != 1.0 else cal
            path = calibrations.save(mine.model_copy(update={"spread": mine.spread.model_copy(
                update=update)}), out / f"variant-{i}-run{j}.json")
            by_file.setdefault(path, []).append(r)
        checks = {}
        for path, mine in by_file.items():
            checks |= checked(ROOT, mine, path, draws)[0]
        result[name] = summarised(checks, runs)
        s = result[name]
        print(f"  {name:<42} {100 * s['coverage']:>4.0f}% inside ("
              + ", ".join(f"{100 * c:.0f}% at {f:.0%}" for f, c in s["coverage_by_load"].items())
              + "); hi/lo " + ", ".join(f"{w:.2f}× at {f:.0%}"
                                        for f, w in s["median_width"].items()))
    return result


def probed(src: Path, runs: list[dict], calibration: Path, draws: int, out: Path,
           beyond_only: bool = False) -> dict:
    """The checks `latlab predict --on-drift rescale` would have given just before each run:
    the calibration's reference steps were timed then (`reference_ms`), and the step costs
    are scaled by that ratio (`calibration.rescaled`) for that run's check — within the
    calibration's spread too (`beyond_only`: only beyond it, as before)."""
    cal = calibrations.load(calibration)
    limit = drift_limit(spread_of(cal)[0])
    out.mkdir(parents=True, exist_ok=True)
    by_file: dict[Path, list[dict]] = {}
    for i, r in enumerate(runs):
        ratio = r["reference_ms"] / sum(cal.reference.ms)
        path = calibration
        if not beyond_only or not 1 / limit <= ratio <= limit:
            path = calibrations.save(calibrations.rescaled(cal, ratio, "the machine probe"),
                                     out / f"{calibration.stem}-run{i}.json")
        by_file.setdefault(path, []).append(r)
        print(f"  {Path(r['run']).name}: reference steps {ratio:.2f}× the calibration's "
              f"(limit ×{1 / limit:.2f}–{limit:.2f}): "
              + ("rescaled" if path != calibration else "as calibrated"))
    checks = {}
    for path, mine in by_file.items():
        checks |= checked(src, mine, path, draws)[0]
    return checks
