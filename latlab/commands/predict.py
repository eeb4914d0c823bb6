"""`latlab predict`: the latency a server would show under a load, simulated from its
calibration — a predicted run folder that reports, `compare` and sweep curves read.

    latlab predict --rate 5 --requests 100000        # latlab's engine, calibrated on first use
    latlab predict --calibration cal.json --rate 40 --replicas 4 --router round_robin
    latlab predict --sweep --slo ttft=1s             # the predicted throughput–latency curve
    latlab predict --replicas-for "p99_e2e<2s@40rps"
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from latlab.commands.calibrate import ShapeOptions
from latlab.commands.common import UsageError, console, print_json
from latlab.commands.groups import (OutputOptions, SweepPlan, WorkloadOptions, arrival_process,
                                   split_serve_args, window_s)
from latlab.commands.options import opt, validation_message
from latlab.commands.predict_plans import (cold_start_s, parse_goal, predict_sweep,
                                            replicas_for)
from latlab.commands.predicting import Predicted, predict_point, resolve_calibration, settings
from latlab.records.config import BenchConfig
from latlab.records.folder import RunFolder, RunFolderError
from latlab.records.simulation import ROUTERS, Autoscale, Fleet
from latlab.records.workload import ArrivalConfig
from latlab.report.console import print_analysis, print_summary
from latlab.sim.calibration import fit_warning
from latlab.sim.folder import RECORDS
from latlab.sim.workload import SimWorkload, build, replay

DEFAULT_REQUESTS = 10_000


class FleetOptions(ShapeOptions):
    replicas: int = opt(1, "Replicas behind the router (with --autoscale: at the start).")
    router: str = opt("least_outstanding", "round_robin, least_outstanding or prefix_affinity.")
    max_waiting: int | None = opt(None, "Per replica: requests waiting beyond this get 429 "
                                        "(default: the calibration's).")
    autoscale: str | None = opt(None, "Autoscale on concurrency (in flight per replica) or "
                                      "queue (waiting per replica).")
    scale_target: float = opt(8.0, "--autoscale: the metric's target per replica.")
    min_replicas: int = opt(1, "--autoscale: at least this many.")
    max_replicas: int = opt(16, "--autoscale: at most this many.")
    scale_interval: float = opt(5.0, "--autoscale: seconds between decisions.")
    scale_lag: float = opt(0.0, "--autoscale: seconds from a decision to scale up until the "
                                "new replica starts (provisioning).")
    cold_start: str | None = opt(None, "--autoscale: a new replica's start: seconds, or a "
                                       "`latlab coldstart` folder (its median time to ready).")
    scale_down_after: float = opt(60.0, "--autoscale: seconds below target before draining one.")

    def fleet(self) -> Fleet:
        if self.router not in ROUTERS:
            raise UsageError(f"--router {self.router!r}: expected one of {', '.join(ROUTERS)}")
        autoscale = None
        cold_start = cold_start_s(self.cold_start)
        try:
            if self.autoscale is not None:
                if self.autoscale not in ("concurrency", "queue"):
                    raise UsageError(f"--autoscale {self.autoscale!r}: expected concurrency "
                                     "or queue")
                autoscale = Autoscale(
                    metric=self.autoscale, target=self.scale_target,
                    min_replicas=self.min_replicas, max_replicas=self.max_replicas,
                    interval_s=self.scale_interval, lag_s=self.scale_lag,
                    cold_start_s=cold_start,
                    scale_down_after_s=self.scale_down_after)
            return Fleet(replicas=self.replicas, router=self.router, autoscale=autoscale,
                         max_waiting=self.max_waiting)
        except ValidationError as e:
            raise UsageError(validation_message(e, self.flags_by_target())) from None


class PredictOptions(WorkloadOptions, SweepPlan, FleetOptions, OutputOptions):
    not_options = frozenset({"salt_prompts", "progress"})  # nothing is sent, nothing to watch
    rate: float | None = opt(None, "Open loop: requests per second.")
    users: int | None = opt(None, "Closed loop: N users, each sends when its last request ends.")
    ramp: float = opt(0.0, "Seconds to ramp the rate (or users) up from zero.", to="ramp_s")
    trace: Path | None = opt(None, "Replay arrival times from JSONL (`timestamp` s or "
                                   "`timestamp_ms` per line).")
    requests: int | None = opt(None, f"Requests to simulate (default {DEFAULT_REQUESTS} unless "
                                     "--duration).")
    duration: float | None = opt(None, "Seconds of simulated load.", to="duration_s")
    warmup: float | None = opt(None, "Seconds excluded at the start (default with --duration: "
                                     "10%, at most 5).", to="warmup_s")
    cooldown: float | None = opt(None, "Seconds excluded at the end (default with --duration: "
                                       "5%, at most 2).", to="cooldown_s")
    calibration: Path | None = opt(None, "The server's calibration (`latlab calibrate`).")
    from_runs: list[Path] = opt([], "Calibrate from these run or sweep folders now (the "
                                    "server they measured).", "--from")
    serve_args: str = opt("", "latlab serve options of the engine to predict (calibrated on "
                              "first use, cached).")
    replay: Path | None = opt(None, "Replay a measured run's requests: its scheduled times and "
                                    "lengths.")
    records: int = opt(RECORDS, "Write at most this many request records (a sample beyond).")
    sweep: bool = opt(False, "Predict a sweep: the throughput–latency curve and SLO-max.")
    replicas_for: str | None = opt(None, "The fewest replicas meeting a goal, e.g. "
                                         "\"p99_e2e<2s@40rps\".")
    json_output: bool = opt(False, "Print summary.json to stdout.", "--json")

    def bench_config(self) -> BenchConfig:
        requests = self.requests
        if requests is None and self.duration is None and self.trace is None:
            requests = DEFAULT_REQUESTS
        warmup, cooldown = window_s(self.duration, self.warmup, self.cooldown)
        try:
            return BenchConfig(
                workload=self.workload(), arrivals=self.arrivals(), duration_s=self.duration,
                requests=requests, warmup_s=warmup, cooldown_s=cooldown,
                slos=self.slos(), out=self.out, name=self.name or "predict", tags=self.tag)
        except ValidationError as e:
            raise UsageError(validation_message(e, self.flags_by_target())) from None

    def arrivals(self) -> ArrivalConfig:
        process = arrival_process(self.arrival, self.burstiness, self.rate, self.users,
                                  self.trace)
        try:
            return ArrivalConfig(process=process, users=self.users or 1, rate=self.rate,
                                 burstiness=1.0 if self.burstiness is None else self.burstiness,
                                 max_concurrency=self.max_concurrency, ramp_s=self.ramp,
                                 trace=self.trace, seed=self.seed)
        except ValidationError as e:
            raise UsageError(validation_message(e, self.flags_by_target())) from None


def predict(options: PredictOptions) -> None:
    """Predict the latency a server would show under a load, from its calibration:
    simulated with the engine's own scheduler and a fitted step-cost model, written as a
    predicted run folder (marked simulated) with the same summary, budget and findings.

    Without --calibration or --from: latlab's engine, calibrated on first use and cached."""
    out, err = console(), console(stderr=True)
    o = options
    if o.records < 1:
        raise UsageError(f"--records {o.records}: write at least one record")
    fleet = o.fleet()
    bench = o.bench_config()
    if o.sweep and o.replicas_for:
        raise UsageError("--sweep and --replicas-for are two questions: ask one at a time")
    if o.replicas_for:
        parse_goal(o.replicas_for)
    if o.rate is None and o.users is None and o.trace is None and not (o.sweep or o.replay):
        if o.replicas_for is None:
            raise UsageError("give the load: --rate, --users, --trace or --replay (or --sweep)")
    cal, where = resolve_calibration(o.calibration, o.from_runs, split_serve_args(o.serve_args), err,
                                     o.shape() if o.from_runs else None)
    err.print(f"calibration: {cal.headline()}", highlight=False)
    err.print(f"  from {where}", style="dim", highlight=False)
    if warning := fit_warning(cal):
        err.print(f"  warning: {warning}", style="yellow", highlight=False)
    if o.sweep:
        return predict_sweep(o, cal, where, fleet, bench, out, err)
    if o.replicas_for:
        return replicas_for(o, cal, where, fleet, bench, out, err)
    workload, replayed, bench = _workload(o, bench)
    point = predict_point(cal, workload, fleet, settings(bench, cal, where, fleet, replayed),
                          o.out, bench.name, o.records)
    _print(o, point, out, err)


def _workload(o: PredictOptions, bench: BenchConfig
              ) -> tuple[SimWorkload, str | None, BenchConfig]:
    """The simulated clients; with --replay, the run's own requests, and its bench settings
    (so `latlab compare RUN PREDICTED` compares the same workload)."""
    if o.replay is None:
        return (build(bench.workload, bench.arrivals, bench.requests, bench.duration_s), None,
                bench)
    if o.rate is not None or o.users is not None or o.trace is not None:
        raise UsageError("--replay sends the run's own requests: drop --rate/--users/--trace")
    try:
        run = RunFolder.open(o.replay)
        workload = replay(run)
        measured = run.read_config().bench
    except RunFolderError as e:
        raise UsageError(f"--replay: {e}") from None
    bench = measured.model_copy(update={"out": o.out, "name": bench.name, "tags": bench.tags,
                                        "slos": bench.slos or measured.slos})
    return workload, str(o.replay), bench


def _print(o: PredictOptions, p: Predicted, out, err) -> None:
    if o.json_output:
        print_json(p.summary.to_json() | {"run": str(p.run.path), "simulated": True})
        return
    print_summary(out, p.summary, p.run.path)
    f = p.result.fleet
    if len(p.result.replicas) > 1 or f.scale_ups:
        out.print(f"fleet       {f.mean_replicas:.2f} replicas on average, {f.peak_replicas} at "
                  f"most, {f.replica_seconds:.0f} replica-seconds · {f.scale_ups} scale-ups, "
                  f"{f.scale_downs} scale-downs", highlight=False)
    if p.analysis is not None:
        print_analysis(out, p.analysis)
    err.print(f"simulated {len(p.result)} requests ({p.result.steps} engine steps, "
              f"{p.result.decode_run_steps} of them in decode runs) in {p.wall_s:.1f} s",
              style="dim", highlight=False)
