"""The held-out runs `predict_intervals.py` checks intervals against: one latlab serve
(CPU), its capacity measured, then runs at shares of it (`measure`), and how far each run's
served steps sat off the calibration (`served_levels`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from latlab.load.target.launch import ServerLaunch, start_server
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.engine import EngineConfig
from latlab.records.folder import RunFolder
from latlab.records.steps import read_step_log
from latlab.services.bench import run_bench
from latlab.sim import calibration as calibrations
from latlab.sim.calibrate_engine import reference_ms

# Long enough for each user's requests to finish several times: a window shorter than a
# few E2E counts too few completions (15 s of 64 users measured 2.70 req/s of 4.4).
CAPACITY_S = 30.0
WARMUP_S, COOLDOWN_S = 5.0, 2.0  # of each held-out run


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
