"""Whether `latlab predict`'s intervals decide anything: calibrate latlab's engine, measure
held-out runs of one latlab serve (CPU) at three shares of its measured capacity, and check
each against the intervals of two versions of latlab side by side (`latlab predict --check
RUN --calibration CAL`, each version with the calibration it makes itself, both before the
runs): this checkout's, and `--baseline-src`'s (a source tree of an older latlab, e.g. `git
archive` of main before the change).

    python benchmarks/predict_intervals.py --baseline-src /tmp/latlab-before   # ≤ 10 min
    python benchmarks/predict_intervals.py --measured runs/…-intervals --calibration C \
        --baseline-src /tmp/latlab-before                        # check again, no load
    python benchmarks/predict_intervals.py --measured runs/…-intervals \
        --recalibrate runs/calibration-samples     # this checkout's fit of the same timings

Per run, metric and percentile (TTFT, TPOT, E2E at p50, p90, p99): measured, each version's
interval, its width (hi/lo) and whether the measurement falls inside. Then per version: the
coverage (goal ≥ 85%), the intervals that end at ∞, and those at most 1.5× wide below 70% of
capacity. The runs are held out: the calibration (made first, or given) never saw them. Runs
of the same rate and seed (several invocations with `--repeats 1 --first-seed S`) are
identical but for the machine: how far they differ is the bar no interval narrower than it
can cover (`identical`). `--fractions ''` measures the capacity alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from latlab.commands.common import console
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.load.target.launch import ServerLaunch, start_server
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.calibration import RequestSpread
from latlab.records.engine import EngineConfig
from latlab.records.folder import RunFolder
from latlab.records.steps import read_step_log
from latlab.services.bench import run_bench
from latlab.services.calibrate import calibrate_engine
from latlab.sim import calibration as calibrations
from latlab.sim.calibrate_engine import reference_ms
from latlab.sim.spread import drift_limit, spread_of

ROOT = Path(__file__).resolve().parent.parent
WIDE = 1.5  # hi/lo: the most an interval below NARROW_BELOW of capacity may span
NARROW_BELOW = 0.7
# Long enough for each user's requests to finish several times: a window shorter than a
# few E2E counts too few completions (15 s of 64 users measured 2.70 req/s of 4.4).
CAPACITY_S = 30.0
WARMUP_S, COOLDOWN_S = 5.0, 2.0  # of each held-out run


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


def load_average() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def measure(args, cal, err) -> Path:
    """`args.repeats` runs at each of `args.fractions` of the capacity (measured: a closed
    loop of the engine's batch for `CAPACITY_S`) against one latlab serve."""
    folder = RunFolder.create(Path(args.out), "intervals").path
    # The served steps, as the calibration's probes log theirs: how far each held-out run's
    # steps sit off the calibrated cost (its level) is in them.
    engine = start_server(ServerLaunch.embedded(["--step-log", str(folder / "steps.jsonl")]),
                          log_path=folder / "engine.log")
    runs = []
    try:
        capacity = args.capacity
        if capacity is None:
            probe = run_bench(BenchConfig(
                url=engine.url, arrivals=ArrivalConfig(process="closed",
                                                       users=cal.engine.max_num_seqs),
                duration_s=CAPACITY_S, warmup_s=5.0, cooldown_s=0.0, out=folder,
                name="capacity"), console=err)
            capacity = probe.summary.throughput.achieved_rate
        err.print(f"  capacity {capacity:.2f} req/s (simulated: "
                  f"{calibrations.capacity(cal, 2 * cal.engine.max_num_seqs):.2f})")
        (folder / "measured.json").write_text(json.dumps({"capacity": capacity, "runs": runs}))
        for fraction in args.fractions:
            rate = round(fraction * capacity, 2)
            # long enough for `--requests` in the window at this rate, at least `--duration`
            duration = max(args.duration, (args.requests or 0) / rate + WARMUP_S + COOLDOWN_S)
            for repeat in range(args.first_seed, args.first_seed + args.repeats):
                load = load_average()
                reference = sum(reference_ms(EngineConfig()))  # the machine's speed now
                result = run_bench(BenchConfig(
                    url=engine.url, arrivals=ArrivalConfig(process="poisson", rate=rate,
                                                           seed=repeat),
                    duration_s=duration, warmup_s=WARMUP_S, cooldown_s=COOLDOWN_S, out=folder,
                    name=f"rate-{rate:g}-{repeat}"), console=err)
                runs.append({"run": str(result.run.path), "fraction": fraction, "rate": rate,
                             "reference_ms": reference, "requests": result.summary.requests,
                             "reference_after_ms": sum(reference_ms(EngineConfig())),
                             "achieved": result.summary.throughput.achieved_rate,
                             "load_average": [load, load_average()]})
                # after every run: a run cut short (timeout, SIGTERM) loses only itself
                (folder / "measured.json").write_text(json.dumps(
                    {"capacity": capacity, "runs": runs}, indent=2))
                err.print(f"  {fraction:.0%} ({rate:g} req/s) run {repeat + 1}: achieved "
                          f"{runs[-1]['achieved']:.2f} req/s, load {load} → {load_average()}")
    finally:
        engine.stop()
    return folder


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


def served_levels(folder: Path, runs: list[dict], calibration: Path, total: bool = False
                  ) -> list[float] | None:
    """How far each run's served steps (the server's `--step-log`) sat off what the
    calibration charges for them: the mean of log(served / charged) over the steps served
    while the run's requests were in flight (`total`: the log of their sums' ratio, what a
    queue sees). None without a step log."""
    if not (folder / "steps.jsonl").exists():
        return None
    cal = calibrations.load(calibration)
    steps = read_step_log(folder / "steps.jsonl")
    levels = []
    for r in runs:
        records = [x for x in RunFolder(Path(r["run"])).read_records()
                   if x.origin_ns and x.end_ns]
        start, end = min(x.origin_ns for x in records), max(x.end_ns for x in records)
        served = [s for s in steps if start <= s.start_ns <= end]
        charged = calibrations.charged_ms(cal.step, served)
        ms = np.array([s.ms for s in served])
        levels.append(float(np.log(ms.sum() / charged.sum()) if total
                            else np.mean(np.log(ms / charged))))
    return levels


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, help="an older latlab's source tree")
    parser.add_argument("--fractions", default="0.3,0.5,0.7",
                        help="shares of the capacity to run at ('': measure the capacity only)")
    parser.add_argument("--repeats", type=int, default=2, help="runs at each load")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds a run")
    parser.add_argument("--requests", type=int,
                        help="at least this many requests a run (its duration from the rate)")
    parser.add_argument("--capacity", type=float,
                        help="req/s measured before (skips the capacity probe: runs split over "
                             "several locked invocations share their rates)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first run's seed")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--calibration", type=Path, help="reuse a calibration file")
    parser.add_argument("--baseline-calibration", type=Path,
                        help="the baseline's calibration file (default: --calibration, else "
                             "the baseline calibrates too, before the runs)")
    parser.add_argument("--measured", type=Path, action="append",
                        help="a folder of an earlier run: check only (again: their runs "
                             "together)")
    parser.add_argument("--out", default="runs")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--recalibrate", type=Path, metavar="SAMPLES",
                        help="instead of --calibration: fit the samples an earlier run kept "
                             "(its calibration-samples folder) with this checkout")
    parser.add_argument("--measure-only", action="store_true",
                        help="calibrate and measure, then stop: check later with --measured "
                             "(outside a benchmark lock: the checks time nothing)")
    parser.add_argument("--levels", action="store_true",
                        help="also the level known or probed (level_variants)")
    parser.add_argument("--parts", action="store_true",
                        help="also the width with each part of the spread turned off")
    args = parser.parse_args()
    interrupt_on_sigterm()  # SIGTERM stops the server this script started, as Ctrl-C does
    args.fractions = [float(f) for f in args.fractions.split(",") if f]  # none: capacity
    err = console(stderr=True)
    print(f"load average {load_average()} at the start")
    if args.recalibrate:
        args.calibration = recalibrated(args.recalibrate, Path(args.out))
    if args.calibration:
        cal = calibrations.load(args.calibration)
    else:
        keeping_samples(Path(args.out) / "calibration-samples")
        started = time.perf_counter()
        cal = calibrate_engine(EngineConfig(), [], err)
        args.calibration = calibrations.save(cal, Path(args.out) / "intervals-calibration.json")
        print(f"calibrated in {time.perf_counter() - started:.0f} s")
    print(f"calibration {args.calibration}: {cal.headline()}")
    print(f"  spread: {cal.spread.describe() if cal.spread else 'none'}")
    args.calibration = args.calibration.resolve()  # each version checks in its own tree
    if args.baseline_src and not args.baseline_calibration:
        args.baseline_calibration = (args.calibration if args.measured else
                                     baseline_calibration(args.baseline_src, Path(args.out)))
    if args.baseline_calibration:
        args.baseline_calibration = args.baseline_calibration.resolve()
    folders = args.measured or [measure(args, cal, err)]
    if args.measure_only:
        print(f"measured: {folders[0]}; check with --measured {folders[0]} --calibration "
              f"{args.calibration}" + (f" --baseline-calibration {args.baseline_calibration}"
                                       if args.baseline_src else ""))
        return
    each = [json.loads((f / "measured.json").read_text()) for f in folders]
    for f, m in zip(folders, each):  # absolute: the checks run in each version's own tree
        m["runs"] = [r | {"run": str((f / Path(r["run"]).name).resolve())} for r in m["runs"]]
    measured = {"capacity": each[0]["capacity"], "runs": [r for m in each for r in m["runs"]]}
    runs = measured["runs"]
    print(f"measured capacity {measured['capacity']:.2f} req/s; runs (achieved, load average "
          "before/after):")
    for r in runs:
        print(f"  {Path(r['run']).name}: {r['fraction']:.0%}, achieved {r['achieved']:.2f} "
              f"req/s, load {' → '.join(r['load_average'])}")
    for name, calibration in (("this version", args.calibration),
                              ("the baseline", args.baseline_calibration)):
        levels = [v for f, m in zip(folders, each)
                  for v in (served_levels(f, m["runs"], calibration) or [])
                  ] if calibration else None
        if levels:
            print(f"the runs' served steps against {name}'s calibration (log(served / "
                  "charged), mean): " + ", ".join(f"{v:+.2f}" for v in levels))
    versions = {"new": (ROOT, args.calibration)} | (
        {"old": (args.baseline_src, args.baseline_calibration)} if args.baseline_src else {})
    checks, took = {}, {}
    for name, (src, calibration) in versions.items():
        checks[name], took[name] = checked(src, runs, calibration, args.draws)
        print(f"{name} ({src}): checked in {took[name]:.0f} s, load average {load_average()}")
    if all("reference_ms" in r for r in runs):  # what the machine probe would have done
        for name, (src, calibration) in list(versions.items()):
            print(f"{name} with the machine probe before each run (--on-drift rescale):")
            # the baseline's --on-drift rescale acted beyond the spread only
            checks[f"{name}+probe"] = probed(src, runs, calibration, args.draws,
                                             Path(args.out).resolve() / "probed", name == "old")
            versions[f"{name}+probe"] = versions[name]
    names = list(versions)[::-1]
    print(f"\n{'load':>4} {'run':>3} {'metric':<9} {'measured':>8}  "
          + "  ".join(f"{n + ': interval, hi/lo':<28}" for n in names))
    for i, r in enumerate(runs):
        for key in [k for k in checks["new"] if k[0] == r["run"]]:
            c = checks["new"][key]
            print(f"{r['fraction']:>4.0%} {i % args.repeats + 1:>3} "
                  f"{key[1] + ' ' + key[2]:<9} {c['measured']:>8.0f}  "
                  + "  ".join(f"{cell(checks[n].get(key)):<28}" for n in names))
    print()
    result = {name: verdict(name, checks[name], runs) for name in names}
    same = identical(runs)
    split = parts(runs, args.calibration, args.draws, Path(args.out)) if args.parts else None
    levels = None
    if args.levels:
        served = [v for f, m in zip(folders, each)
                  for v in served_levels(f, m["runs"], args.calibration, total=True)]
        levels = level_variants([r | {"served_level": v} for r, v in zip(runs, served)],
                                args.calibration, args.draws, Path(args.out) / "levels")
    if args.json:
        args.json.write_text(json.dumps({"calibration": cal.headline(), "measured": measured,
                                         "verdict": result, "seconds": took, "parts": split,
                                         "levels": levels, "identical": same},
                                        indent=2))


if __name__ == "__main__":
    sys.exit(main())
