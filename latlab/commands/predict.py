"""`latlab predict`: options → `PredictConfig` → the calibration → one point, a sweep, or the
replicas a goal needs → print.

    latlab predict --rate 5 --requests 100000        # latlab's engine, calibrated on first use
    latlab predict --calibration cal.json --rate 40 --replicas 4 --router round_robin
    latlab predict --sweep --slo ttft=1s             # the predicted throughput–latency curve
    latlab predict --replicas-for "p99_e2e<2s@40rps"   # a range, and the count to provision
    latlab predict --check runs/…-bench-a               # measured against predicted

Every percentile comes with an interval (`--draws` worlds drawn from the calibration's spread).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rich.console import Console

from latlab.commands.common import EXIT_INTERRUPTED, RunFailed, UsageError, console, print_json
from latlab.commands.options import NamedWorkload, TestedAdvice, parse_args
from latlab.commands.predict_output import print_checks, print_sizing, sizing_json
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.records.bench import BenchConfig
from latlab.records.engine import ServeConfig
from latlab.records.folder import RunFolder, RunFolderError
from latlab.records.predict import PredictConfig
from latlab.report.console import print_analysis, print_summary
from latlab.report.sweep import print_sweep
from latlab.services.predict import (
    Predicted,
    fleet_for,
    predict_point,
    resolve_calibration,
    settings,
)
from latlab.services.predict_check import check_run, coverage, measured_runs
from latlab.services.predict_intervals import Intervals, reseeded
from latlab.services.predict_plans import predict_sweep, replicas_for
from latlab.sim.calibration import fit_warning
from latlab.sim.workload import SimWorkload, build, replay

# Nothing is sent: no target, client, workers or telemetry; the fleet's --max-waiting is the
# replicas' queue; an open-loop sweep's shape is the --arrival/--burstiness given with a rate.
NOT_TAKEN = frozenset({
    "bench.url", "bench.model", "bench.api_key", "bench.api_key_file", "bench.timeout_s",
    "bench.ignore_eos", "bench.continuous_usage", "bench.stream", "bench.keepalive",
    "bench.server_kind", "bench.drain_s", "bench.workers", "bench.ray", "bench.otlp_port",
    "bench.span_wait_s", "bench.scrape_interval_s", "bench.workload.prompts",
    "server.max_waiting", "plan.shape"})


def predict(config: PredictConfig, options: TestedAdvice) -> None:
    """Predict the latency a server would show under a load, from its calibration:
    simulated with the engine's own scheduler and a fitted step-cost model, written as a
    predicted run folder (marked simulated) with the same summary, budget and findings.

    Without --calibration or --from: latlab's engine, calibrated on first use and cached."""
    interrupt_on_sigterm()  # a first use's probe latlab serve stopped on SIGTERM too
    out, err = console(), console(stderr=True)
    bench = config.bench
    a = bench.arrivals
    if not (a.rate or a.trace or "users" in a.model_fields_set or config.sweep or config.replay
            or config.replicas_for or config.check):
        raise UsageError("give the load: --rate, --users, --trace or --replay (or --sweep)")
    serve = parse_args(ServeConfig, bench.serve_args, "--serve-args") if bench.serve_args else None
    if serve is not None:
        config.fleet = fleet_for(serve.engine, config.fleet)
    if unused := config.fleet.unused_techniques() or _unsimulated(bench):
        raise UsageError(unused)
    cal, where = resolve_calibration(config, config.calibration, bench.serve_args,
                                     serve.engine if serve else None, err, config.probe,
                                     config.on_drift)
    err.print(f"calibration: {cal.headline()}", highlight=False)
    err.print(f"  from {where}", style="dim", highlight=False)
    if warning := fit_warning(cal):
        err.print(f"  warning: {warning}", style="yellow", highlight=False)
    intervals = intervals_of(config)
    if config.sweep:
        sweep = predict_sweep(config, cal, where, err, intervals)
        if options.json_output:
            print_json(sweep.record().model_dump(mode="json"))
        else:
            print_sweep(out, sweep.record(), sweep.folder)
        err.print(f"predicted sweep folder: {sweep.folder} (sweep.json, sweep.html)",
                  highlight=False)
        if sweep.stopped.reason == "interrupted":
            raise RunFailed(code=EXIT_INTERRUPTED)
        return
    if config.replicas_for is not None:
        sizing = replicas_for(config, cal, where, err, intervals)
        if options.json_output:
            print_json(sizing_json(sizing))
        else:
            print_sizing(out, sizing)
        return
    if config.check:
        runs = measured_runs(config.check, bench.out)
        checks = [c for run in runs for c in check_run(run, cal, config.fleet, intervals)]
        if options.json_output:
            covered = coverage(checks)
            print_json({"level": intervals.level, "draws": intervals.draws,
                        "coverage": None if math.isnan(covered) else covered,
                        "checks": [vars(c) | {"inside": c.inside, "decides": c.decides}
                                   for c in checks]})
        else:
            print_checks(out, checks, intervals)
        return
    workload, replayed, bench, workload_for = _workload(config)
    point = predict_point(cal, workload, config.fleet,
                          settings(bench, cal, where, config.fleet, replayed), bench.out,
                          bench.name, config.records, intervals=intervals_of(config),
                          workload_for=workload_for, test_advice=options.test_advice)
    _print(options, point, out, err)


def _workload(config: PredictConfig) -> tuple[SimWorkload, str | None, BenchConfig,
                                               Callable[[int], SimWorkload]]:
    """The simulated clients and those of each draw; with --replay, the run's own requests
    (every draw's too), and its bench settings (so `latlab compare RUN PREDICTED` compares
    the same workload)."""
    bench = config.bench
    if config.replay is None:
        return (build(bench.workload, bench.arrivals, bench.requests, bench.duration_s), None,
                bench, reseeded(bench, config.draw_requests))
    if bench.arrivals.open_loop or "users" in bench.arrivals.model_fields_set:
        raise UsageError("--replay sends the run's own requests: drop --rate/--users/--trace")
    try:
        run = RunFolder.open(config.replay)
        workload = replay(run)
        measured = run.read_config().bench
    except RunFolderError as e:
        raise UsageError(f"--replay: {e}") from None
    bench = measured.model_copy(update={"out": bench.out, "name": bench.name,
                                        "tags": bench.tags, "slos": bench.slos or measured.slos})
    return workload, str(config.replay), bench, lambda d: replay(run)


def _unsimulated(bench: BenchConfig) -> str | None:
    """What of the sessions asked for the simulator cannot do, in a line."""
    sessions = bench.workload.sessions
    if sessions is None:
        return None
    if bench.arrivals.max_concurrency is not None:
        return "--max-concurrency with sessions is not simulated"
    if sessions.tool_url is not None:
        return "--tool-url: the simulator calls no tool; give its time with --tool-latency"
    if bench.workload.dataset is not None:
        return ("--dataset with sessions is not simulated: give the lengths as distributions "
                "(--prompt-tokens, --message-tokens, --output-tokens)")
    return None


def intervals_of(config: PredictConfig) -> Intervals:
    return Intervals(draws=config.draws, level=config.level, requests=config.draw_requests)


def _print(options: NamedWorkload, p: Predicted, out: Console, err: Console) -> None:
    if options.json_output:
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
