"""The scoring of `latlab predict --check`'s intervals for `predict_intervals.py`: the
checks of every run by one version of latlab (`checked`), each interval's width and cell,
and a version's verdict (coverage, intervals at ∞, narrow ones below `NARROW_BELOW` of
capacity); the spread between identical runs, which no narrower interval can cover."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from latlab.records.folder import RunFolder

ROOT = Path(__file__).resolve().parent.parent
WIDE = 1.5  # hi/lo: the most an interval below NARROW_BELOW of capacity may span
NARROW_BELOW = 0.7


def checked(src: Path, runs: list[dict], calibration: Path, draws: int) -> tuple[dict, float]:
    """`latlab predict --check` of every run with the latlab in `src`: (run, metric,
    percentile) → the check, and the seconds it took."""
    env = os.environ | {"PYTHONPATH": str(src)}
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "latlab", "predict", "--calibration", str(calibration),
         "--no-probe", "--draws", str(draws), "--json",
         *[a for r in runs for a in ("--check", r["run"])]],
        env=env, capture_output=True, text=True, cwd=src, timeout=1200)
    if out.returncode != 0:
        raise SystemExit(f"latlab predict --check ({src}) failed:\n{out.stderr[-2000:]}")
    data = json.loads(out.stdout[out.stdout.index("{"):])
    return ({(c["run"], c["metric"], c["percentile"]): c for c in data["checks"]},
            time.perf_counter() - started)


def upper(c: dict) -> float:
    """The interval's upper end (JSON writes ∞ as null)."""
    return math.inf if c["hi"] is None else float(c["hi"])


def width(c: dict) -> float:
    hi, lo = upper(c), float(c["lo"])
    return math.inf if math.isinf(hi) or lo <= 0 else hi / lo


def cell(c: dict | None) -> str:
    if c is None:
        return f"{'–':>22}"
    hi = "∞" if math.isinf(upper(c)) else f"{upper(c):.0f}"
    w = width(c)
    return (f"{float(c['lo']):>6.0f}–{hi:<6} {'∞' if math.isinf(w) else f'{w:.2f}':>5}× "
            f"{'in ' if c['inside'] else 'OUT'}")


def summarised(checks: dict, runs: list[dict]) -> dict:
    """Coverage, and the median width (hi/lo) at each load, of `checks`."""
    fraction = {r["run"]: r["fraction"] for r in runs}
    values = list(checks.values())
    return {"coverage": float(np.mean([c["inside"] for c in values])),
            "median_width": {f: float(np.median([width(c) for c in values
                                                 if fraction[c["run"]] == f]))
                             for f in sorted(set(fraction.values()))},
            "coverage_by_load": {f: float(np.mean([c["inside"] for c in values
                                                   if fraction[c["run"]] == f]))
                                 for f in sorted(set(fraction.values()))}}


def verdict(name: str, checks: dict, runs: list[dict]) -> dict:
    fraction = {r["run"]: r["fraction"] for r in runs}
    values = list(checks.values())
    inside = [c["inside"] for c in values]
    below = [c for c in values if fraction[c["run"]] < NARROW_BELOW]
    infinite = sum(math.isinf(upper(c)) for c in values)
    narrow = sum(width(c) <= WIDE for c in below)
    finite = [width(c) for c in below if math.isfinite(width(c))]
    summary = {"coverage": float(np.mean(inside)), "inside": sum(inside), "checks": len(inside),
               "infinite": infinite, "below": len(below), "narrow": narrow,
               "median_width_below": float(np.median(finite)) if finite else math.inf}
    print(f"{name}: {sum(inside)} of {len(inside)} inside ({100 * summary['coverage']:.0f}%; "
          f"goal ≥ 85%), {infinite} end at ∞; below {NARROW_BELOW:.0%} of capacity "
          f"{narrow} of {len(below)} at most {WIDE}× wide (median "
          f"{summary['median_width_below']:.2f}×)")
    for f in sorted({r["fraction"] for r in runs}):
        mine = [c for c in values if fraction[c["run"]] == f]
        ws = [width(c) for c in mine]
        print(f"  at {f:.0%}: {sum(c['inside'] for c in mine)} of {len(mine)} inside, width "
              f"median {np.median(ws):.2f}×, max {max(ws):.2f}×")
    return summary


def identical(runs: list[dict]) -> dict:
    """How far runs of the same rate and seed (identical but for the machine) differ: per
    TTFT, TPOT and E2E p50/p90/p99, max/min over the runs and the 90% range (hi/lo) a normal
    of their log's standard deviation spans — what no predictor narrower than it can cover
    90% of (from 3 runs: a standard deviation of 2 degrees of freedom, itself ±50%)."""
    from scipy.stats import norm

    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(Path(r["run"]).name.split("-", 2)[-1], []).append(r)
    out = {}
    for key, same in groups.items():
        if len(same) < 2:
            continue
        summaries = [RunFolder(Path(r["run"])).read_summary() for r in same]
        print(f"\n{len(same)} identical runs ({key}, {same[0]['fraction']:.0%} of capacity; "
              f"requests {', '.join(str(s.in_window) for s in summaries)}): max/min, and the "
              "90% range of a normal of their log sd")
        rows = {}
        for metric in ("ttft", "tpot", "e2e"):
            cells = []
            for q in ("p50", "p90", "p99"):
                v = np.array([s.percentile(metric, q) for s in summaries], dtype=float)
                spread = float(np.exp(2 * norm.ppf(0.95) * np.std(np.log(v), ddof=1)))
                rows[f"{metric} {q}"] = {"values": v.tolist(), "max_min": float(v.max() / v.min()),
                                         "range90": spread}
                cells.append(f"{q} {v.max() / v.min():.2f}× ({spread:.2f}×)")
            print(f"  {metric.upper():<5} " + "  ".join(cells))
        out[key] = rows
    return out
