"""Whether the simulator's step costs vary as the served steps did: the calibration's probes'
steps (kept by `predict_intervals.py` under calibration-samples/), and any step log of
held-out runs (`latlab serve --step-log`), against draws of the world the calibration
fits to them (`world.Draw`: its drift, slow stretches and each step's jitter) at the same
step start times.

    python benchmarks/stretches_check.py --samples runs/calibration-samples \
        --steps runs/…-intervals/steps.jsonl

Per stretch of steps (a probe; a held-out run: steps with no gap over 3 s), of the log
misfit against the calibration's step cost (its median taken out): the lag-1
autocorrelation, the 90th and 99th percentiles, and the standard deviation of its means
over 0.5 s and 2 s windows; measured, and the 5th–50th–95th percentiles of the same over
`--draws` worlds. A measured value beyond the draws' 5–95% is marked.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np

from latlab.records.steps import StepRecord, read_step_log
from latlab.sim import calibration as calibrations
from latlab.sim.world import Draw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from intervals_calibration import recalibrated  # noqa: E402

GAP_S = 3.0
MIN_STEPS = 100


def stats(r: np.ndarray, t: np.ndarray) -> dict[str, float]:
    d = r - np.median(r)
    c = r - r.mean()
    out = {"lag-1": float(np.sum(c[1:] * c[:-1]) / np.sum(c * c)),
           "p90": float(np.percentile(d, 90)), "p99": float(np.percentile(d, 99))}
    for w in (0.5, 2.0):
        slot = np.floor((t - t[0]) / w).astype(int)
        n = np.bincount(slot)
        means = np.bincount(slot, weights=c)[n >= 2] / n[n >= 2]
        out[f"sd {w:g} s"] = float(np.std(means)) if len(means) > 2 else math.nan
    return out


def segments(steps: list[StepRecord]) -> list[list[StepRecord]]:
    t = np.array([s.start_ns for s in steps]) / 1e9
    cuts = np.flatnonzero(np.diff(t) > GAP_S) + 1
    return [[steps[i] for i in part] for part in np.split(np.arange(len(steps)), cuts)
            if len(part) >= MIN_STEPS]


def compare(name: str, steps: list[StepRecord], cal, draws: int, seed: int) -> dict:
    charged = calibrations.charged_ms(cal.step, steps)
    r = np.log(np.array([s.ms for s in steps]) / charged)
    t = np.array([s.start_ns for s in steps]) / 1e9
    t = t - t[0]
    measured = stats(r, t)
    drawn = []
    for d in range(draws):
        world = Draw.make(cal.spread, [seed, d], 0.5)
        drawn.append(stats(np.log([world.step_speed(x) for x in t]), t))
    row = {"name": name, "steps": len(steps), "seconds": float(t[-1])}
    cells = []
    for key, value in measured.items():
        v = np.array([s[key] for s in drawn])
        with warnings.catch_warnings():  # a probe too short for 2 s windows: nan
            warnings.simplefilter("ignore", RuntimeWarning)
            lo, mid, hi = np.nanpercentile(v, [5, 50, 95])
        row[key] = {"measured": value, "drawn": [lo, mid, hi]}
        mark = "" if lo <= value <= hi else " !"
        cells.append(f"{key} {value:+.2f} ({lo:+.2f} {mid:+.2f} {hi:+.2f}){mark}")
    print(f"{name:<14} {len(steps):>5} steps {t[-1]:>5.1f} s | " + " | ".join(cells))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=Path, required=True,
                        help="a calibration-samples folder (predict_intervals.py keeps it)")
    parser.add_argument("--steps", type=Path, action="append", default=[],
                        help="a step log of held-out runs")
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("/tmp"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cal = calibrations.load(recalibrated(args.samples, args.out))
    probes: dict[int, list[StepRecord]] = {}
    for line in (args.samples / "probes.jsonl").read_text().splitlines():
        row = json.loads(line)
        probes.setdefault(row.pop("probe"), []).append(StepRecord(**row))
    print("lag-1 autocorrelation, p90 / p99 of the log misfit over its median, sd of its "
          "0.5 s / 2 s means: measured (the draws' 5% 50% 95%)")
    rows = [compare(f"probe {i}", probes[i], cal, args.draws, 7) for i in sorted(probes)]
    held_out = [part for path in args.steps for part in segments(read_step_log(path))]
    for j, part in enumerate(held_out):
        rows.append(compare(f"held-out {j}", part, cal, args.draws, 7))
    if args.json:
        args.json.write_text(json.dumps({"spread": cal.spread.describe(), "rows": rows},
                                        indent=2))


if __name__ == "__main__":
    main()
