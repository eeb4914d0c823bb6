"""How accurate `latlab predict` is on latlab's own engine: calibrate it, measure a sweep of
it, predict the same sweep, and compare — in one script.

    python benchmarks/predict_accuracy.py                     # about 15 minutes
    python benchmarks/predict_accuracy.py --measured runs/…-sweep-accuracy   # predict again

1. Calibrate the default engine as `latlab calibrate` does (steps timed in process over a
   grid, then probes through latlab serve for the per-request costs and serving overhead).
2. Against one latlab serve, measure its capacity — the achieved rate of a closed loop of 64
   users (latlab sweep's saturation probe) — then a sweep at --fractions of it (Poisson
   arrivals, bench's default mixed lengths: prompts lognormal 256 ± 128, outputs 64 ± 32),
   --duration each. The machine is shared: each step waits until the other processes have
   used under --quiet cores for 10 s, and the CPU they used during each point is printed.
3. Predict every point two ways: *replay* (the point's own requests — its scheduled times,
   prompt and output lengths — on the calibrated server, over the same window) and *fresh*
   (`latlab predict` at the point's rate, --predict-requests requests: the long-run
   distribution, independent of the measured sample); and the capacity probe, replayed.
4. Print per point the measured and predicted p50 and p99 of TTFT, TPOT and E2E with the
   errors, and the SLO-max (--slo, default p99 E2E ≤ 2.5 s) of the measured points and of
   both predicted sweeps.

The machine's own speed drifts: on a shared virtual machine the same engine step takes
20–40 % longer in one minute than in another, with nothing else running on it (its
neighbours on the host are invisible). Two things separate that from the model's error:
a fixed reference (decode steps at batch 1 and 16 and a 256-token prefill, timed in this
process on an engine of its own) runs right after calibrating and before and after every
measured point, its ratio to the calibration's printed as the point's drift; and the server
writes its steps (`latlab serve --step-log`), so each point's *served steps* are compared
with what the calibration charges for the same steps. Every prediction is shown twice: as
calibrated, and with the step costs scaled by that ratio ("steps as served"): the second is
the simulator's own error — its scheduling, queueing and per-request costs — once the
step costs are what the server really had.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from latlab.analysis import analyze, capacity
from latlab.analysis.slo_max import slo_max
from latlab.services.bench import run_bench
from latlab.records.engine import EngineConfig
from latlab.services.calibrate import calibrate_engine
from latlab.commands.common import console
from latlab.services.predict import predict_point, settings
from latlab.load.target.launch import interrupt_on_sigterm, start_engine
from latlab.records.bench import BenchConfig
from latlab.records.slo import parse_slo
from latlab.records.folder import RunFolder
from latlab.records.simulation import Fleet
from latlab.records.steps import read_step_log
from latlab.records.sweep import Point
from latlab.records.window import run_window
from latlab.records.arrivals import ArrivalConfig
from latlab.records.workload import WorkloadConfig
from latlab.sim import calibration as calibrations
from latlab.sim.validate import METRICS, QUANTILES, compare
from latlab.sim.workload import build, replay

PROBE_USERS = 64
STEP_LOG = "steps.jsonl"


class SpeedReference:
    """A fixed set of engine steps (decodes at batch 1 and 16, a 256-token prefill) timed in
    this process on an engine of its own: the machine's speed now, in ms (median of 3)."""

    def __init__(self) -> None:
        from latlab.engine.engine import LLMEngine

        self.engine = LLMEngine(EngineConfig())
        self.rng = np.random.default_rng(0)
        self.ids = 0

    def _run(self) -> float:
        from latlab.engine.sampling_params import SamplingParams

        engine, vocab = self.engine, self.engine.model_config.vocab_size
        started = time.perf_counter()
        for batch, steps in ((1, 40), (16, 20)):
            params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
            for _ in range(batch):
                self.ids += 1
                engine.add_request(f"ref{self.ids}", self.rng.integers(0, vocab, 64).tolist(),
                                   params)
            while engine.has_unfinished():
                engine.step()
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        self.ids += 1
        engine.add_request(f"ref{self.ids}", self.rng.integers(0, vocab, 256).tolist(), params)
        while engine.has_unfinished():
            engine.step()
        return (time.perf_counter() - started) * 1e3

    def ms(self) -> float:
        return float(np.median([self._run() for _ in range(3)]))


def served_ratio(cal, steps, run: RunFolder) -> float:
    """Σ served step time / Σ what `cal` charges for the same steps, over `run`'s window."""
    window = run_window(run.read_config(), run.read_records())
    chosen = [s for s in steps if window.start_ns <= s.start_ns < window.end_ns]
    charged = float(calibrations.charged_ms(cal.step, chosen).sum())
    return sum(s.ms for s in chosen) / charged if charged else math.nan


def scaled(cal, factor: float):
    """`cal` with every step cost multiplied by `factor` (the machine `factor` times slower)."""
    return cal.model_copy(update={"step": calibrations.scaled_step(cal.step, factor)})


class Background:
    """CPU the rest of the machine uses (cores), sampled every second: all busy time less
    this process's and its children's (the server, the load generator)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def _ours() -> float:
        me = psutil.Process()
        total = 0.0
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return total

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def _run(self) -> None:
        last = (time.monotonic(), self._busy(), self._ours())
        while not self._stop.wait(1.0):
            now = (time.monotonic(), self._busy(), self._ours())
            cores = ((now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0])
            self.samples.append((now[0], max(0.0, cores)))
            last = now

    def mean(self, start: float, end: float) -> float:
        values = [c for t, c in self.samples if start <= t <= end]
        return float(np.mean(values)) if values else math.nan

    def wait_quiet(self, err, limit: float, patience_s: float) -> float:
        """Wait until the last 10 s averaged under `limit` cores (at most `patience_s`)."""
        started = time.monotonic()
        while time.monotonic() - started < patience_s:
            now = time.monotonic()
            if len(self.samples) >= 10 and self.mean(now - 10, now) < limit:
                break
            time.sleep(2)
        waited = time.monotonic() - started
        if waited > 5:
            err.print(f"  waited {waited:.0f} s for the machine to quieten "
                      f"(other processes: {self.mean(time.monotonic() - 10, time.monotonic()):.2f}"
                      " cores)")
        return waited


def measure(args, err, background: Background, reference: SpeedReference
            ) -> tuple[Path, list[Point], dict]:
    """The capacity probe and the measured points, each started when the machine is quiet,
    against one latlab serve; the other processes' CPU during each."""
    out = Path(args.out)
    folder = RunFolder.create(out, "sweep-accuracy").path
    engine = start_engine(["--step-log", str(folder / STEP_LOG)],
                          log_path=folder / "engine.log")
    noise, points, speed = {}, [], {}
    try:
        def point(arrivals, name):
            background.wait_quiet(err, args.quiet, args.patience)
            before = reference.ms()
            started = time.monotonic()
            result = run_bench(BenchConfig(url=engine.url, arrivals=arrivals,
                                           duration_s=args.duration, warmup_s=5.0,
                                           cooldown_s=2.0, out=folder, name=name,
                                           slos=args.slos), console=err)
            noise[str(result.run.path)] = background.mean(started, time.monotonic())
            speed[str(result.run.path)] = (before, reference.ms())
            return result

        probe = point(ArrivalConfig(process="closed", users=PROBE_USERS), "capacity")
        top = args.capacity or probe.summary.throughput.achieved_rate
        rates = [round(f * top, 2) for f in args.fractions]
        err.print(f"measured capacity {top:.2f} req/s; measuring {rates}")
        for rate in rates:
            result = point(ArrivalConfig(process="poisson", rate=rate), f"rate-{rate:g}")
            points.append(capacity.measure(analyze(result.run), f"{rate:g} req/s", "rate",
                                           rate, args.slos, 99.0))
    finally:
        engine.stop()
    (folder / "measured.json").write_text(json.dumps({
        "probe": str(probe.run.path), "points": [p.model_dump(mode="json") for p in points],
        "background_cores": noise, "reference_ms": speed}, indent=2))
    return folder, points, noise


def predicted_sweep(cals, points, how: str, args, tmp: Path):
    """Predicted points at the measured points' rates, each on its calibration: `replay` or
    `fresh`."""
    out = []
    for cal, p in zip(cals, points):
        run = RunFolder(Path(p.run))
        bench = run.read_config().bench.model_copy(update={"out": tmp, "slos": args.slos})
        if how == "replay":  # the same requests, the same measurement window
            workload = replay(run)
        else:
            bench = bench.model_copy(update={"requests": args.predict_requests,
                                             "duration_s": None, "warmup_s": 0.0,
                                             "cooldown_s": 0.0})
            workload = build(WorkloadConfig(), bench.arrivals, args.predict_requests, None)
        predicted = predict_point(cal, workload, Fleet(), settings(bench, cal, "bench", Fleet()),
                                  tmp, f"{how}-{p.label}", explain=False)
        analysis = analyze(predicted.run)
        out.append(capacity.measure(analysis, p.label, p.mode, p.load, args.slos, 99.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=90.0, help="seconds per point")
    parser.add_argument("--fractions", default="0.25,0.4,0.55,0.7,0.8,0.9")
    parser.add_argument("--capacity", type=float,
                        help="req/s the fractions are of (default: the measured probe's)")
    parser.add_argument("--slo", action="append", default=[], help="e.g. e2e=2500ms")
    parser.add_argument("--predict-requests", type=int, default=20_000)
    parser.add_argument("--measured", help="a sweep folder of an earlier run: predict only")
    parser.add_argument("--calibration", type=Path, help="reuse a calibration file")
    parser.add_argument("--out", default="runs")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--quiet", type=float, default=0.3,
                        help="start a point when other processes used under this many cores")
    parser.add_argument("--patience", type=float, default=600.0,
                        help="seconds to wait for a quiet machine before each point")
    args = parser.parse_args()
    interrupt_on_sigterm()  # SIGTERM stops the servers this script started, as Ctrl-C does
    args.fractions = [float(f) for f in args.fractions.split(",")]
    args.slos = dict(parse_slo(s) for s in (args.slo or ["e2e=2500ms"]))
    err = console(stderr=True)
    background = Background()
    reference = SpeedReference()
    if args.calibration:
        cal = calibrations.load(args.calibration)
        saved_reference = args.calibration.with_suffix(".reference_ms")
    else:
        background.wait_quiet(err, args.quiet, args.patience)
        cal = calibrate_engine(EngineConfig(), [], err)
        args.calibration = Path(args.out) / "accuracy-calibration.json"
        calibrations.save(cal, args.calibration)
        saved_reference = args.calibration.with_suffix(".reference_ms")
        saved_reference.write_text(f"{reference.ms():.3f}")
    if not saved_reference.exists():
        saved_reference.write_text(f"{reference.ms():.3f}")
        print(f"(no speed reference from the calibration's time: taken now, {saved_reference})")
    args.reference_ms = float(saved_reference.read_text())
    print(f"calibration: {cal.headline()}")
    for note in cal.notes:
        print(f"  {note}")
    if args.measured:
        folder = Path(args.measured)
    else:
        folder, _, _ = measure(args, err, background, reference)
    saved = json.loads((folder / "measured.json").read_text())
    points = [Point.model_validate(p) for p in saved["points"]]
    probe_path = Path(saved["probe"])
    probe_check = compare(cal, RunFolder(probe_path))
    measured_top = RunFolder(probe_path).read_summary().throughput.achieved_rate
    noise = saved["background_cores"]
    references = saved.get("reference_ms", {})
    steps = read_step_log(folder / STEP_LOG) if (folder / STEP_LOG).exists() else []
    args.served = {run: served_ratio(cal, steps, RunFolder(Path(run))) if steps else 1.0
                   for run in [str(probe_path), *(p.run for p in points)]}
    print(f"\ncapacity: measured {measured_top:.2f} req/s ({PROBE_USERS} users, closed loop; "
          f"other processes {noise[str(probe_path)]:.2f} cores), replayed: {probe_check.line()}")
    print("other processes' CPU during each point (cores): "
          + ", ".join(f"{p.label} {noise.get(p.run, math.nan):.2f}" for p in points))
    print(f"the machine's speed (reference {args.reference_ms:.0f} ms at calibration; before/"
          "after each point as a multiple of it) and the served steps' time as a multiple of "
          "what the calibration charges for them: " + ", ".join(
              f"{label} " + "/".join(f"{ms / args.reference_ms:.2f}"
                                     for ms in references.get(run, []))
              + f" served {args.served[run]:.2f}"
              for label, run in [("capacity", str(probe_path)),
                                 *((p.label, p.run) for p in points)]))
    served = compare(scaled(cal, args.served[str(probe_path)]), RunFolder(probe_path))
    print(f"capacity replayed with its steps as served: {served.line()}")
    report(cal, points, slo_max(points, args.slos, 99.0), measured_top, args)


def report(cal, points, measured_best, measured_top, args) -> None:
    ratios = [args.served[p.run] for p in points]
    plain, corrected = [cal] * len(points), [scaled(cal, r) for r in ratios]
    with tempfile.TemporaryDirectory() as tmp:
        sweeps = {how: predicted_sweep(cals, points, how.split(",")[0], args, Path(tmp))
                  for how, cals in (("replay", plain), ("fresh", plain),
                                    ("replay, steps as served", corrected),
                                    ("fresh, steps as served", corrected))}
        tables = {"replay": [compare(cal, RunFolder(Path(p.run))) for p in points],
                  "replay, steps as served": [compare(c, RunFolder(Path(p.run)))
                                              for c, p in zip(corrected, points)]}
    numbers = []
    for how, comparisons in tables.items():
        print(f"\n{how}: {'point':<12} {'n':>4} {'served':>6}  "
              + "  ".join(f"{m} p{q:g} meas→pred (err)".ljust(27) for m in METRICS
                          for q in QUANTILES))
        for p, c, d in zip(points, comparisons, ratios):
            cells = [f"{c.measured[m][q]:>7.0f}→{c.predicted[m][q]:<7.0f}"
                     f"({100 * c.error(m, q):+5.1f}%)".ljust(27) for m in METRICS
                     for q in QUANTILES]
            print(f"{'':>{len(how) + 1}} {p.label:<12} {c.requests:>4} {d:>6.2f}  "
                  + "  ".join(cells))
    for i, (p, c) in enumerate(zip(points, tables["replay"])):
        row = {"point": p.label, "requests": c.requests, "served_ratio": ratios[i],
               "measured": c.measured}
        for how, sweep in sweeps.items():
            lat = sweep[i].latencies
            row[how] = {m: {q: lat[m][f"p{q:g}"] for q in QUANTILES} for m in METRICS}
        numbers.append(row)
    print("\nfresh predictions (the long-run distribution at the point's rate), error against "
          "the measured point (with the steps as served in brackets):")
    for n in numbers:
        cells = [f"{m} p{q:g} {100 * (n['fresh'][m][q] / n['measured'][m][q] - 1):+5.1f}% "
                 f"({100 * (n['fresh, steps as served'][m][q] / n['measured'][m][q] - 1):+5.1f}%)"
                 for m in METRICS for q in QUANTILES]
        print(f"  {n['point']:<12} " + ", ".join(cells))
    for how in sweeps:
        by_q = {f"p{q:g}": [abs(n[how][m][q] / n["measured"][m][q] - 1) for n in numbers
                            for m in METRICS] for q in QUANTILES}
        print(f"{how}: mean |error| " + ", ".join(
            f"{q} {100 * np.mean(v):.1f}% (max {100 * np.max(v):.1f}%)" for q, v in by_q.items()))
    answers = {"measured": measured_best} | {how: slo_max(sweep, args.slos, 99.0)
                                             for how, sweep in sweeps.items()}
    for how, best in answers.items():
        load = best.load if best else None
        print(f"SLO-max {how}: {load if load is None else round(load, 2)} req/s — "
              f"{best.statement if best else 'no SLO'}")
    m = answers["measured"].load if answers["measured"] else None
    for how in sweeps:
        p = answers[how].load if answers[how] else None
        if m and p:
            print(f"SLO-max error ({how}): {100 * (p - m) / m:+.1f}%")
    if args.json:
        args.json.write_text(json.dumps({"calibration": cal.headline(), "points": numbers,
                                         "slo_max": {k: (v.load if v else None)
                                                     for k, v in answers.items()},
                                         "capacity": measured_top}, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
