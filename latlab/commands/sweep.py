"""`latlab sweep`: options → `SweepConfig`, run the points, print the curve and its answers."""

from __future__ import annotations

import sys

from latlab.commands.bench import BenchOptions
from latlab.commands.common import EXIT_INTERRUPTED, RunFailed, console, print_json
from latlab.commands.groups import (OutputOptions, StopOptions, SweepPlan, TargetOptions,
                                    WorkloadOptions)
from latlab.commands.options import opt, parse_numbers
from latlab.commands.sweep_points import SweepConfig, run_sweep
from latlab.load.target.launch import interrupt_on_sigterm
from latlab.report.sweep import print_sweep


class SweepOptions(TargetOptions, WorkloadOptions, SweepPlan, StopOptions, OutputOptions):
    concurrencies: str | None = opt(None, "Closed-loop user counts to run instead of rates, "
                                          "e.g. 1,4,16.")
    saturation_users: int = opt(64, "Automatic plan: users of the closed-loop probe that finds "
                                    "the saturation throughput.")
    max_error_rate: float = opt(0.05, "Stop once a point's error rate exceeds this fraction.")
    price_per_hour: float | None = opt(None, "What the server costs per hour: adds cost per "
                                             "million output tokens and per thousand requests.")
    json_output: bool = opt(False, "Print sweep.json to stdout.", "--json")

    def sweep_config(self) -> SweepConfig:
        shared = self.model_dump(include=set(BenchOptions.model_fields))
        base = BenchOptions(**shared | {"users": 1, "arrival": None, "burstiness": None}
                            ).bench_config()
        return self.plan(base, concurrencies=parse_numbers(self.concurrencies,
                                                           "--concurrencies", int),
                         saturation_users=self.saturation_users,
                         max_error_rate=self.max_error_rate, price_per_hour=self.price_per_hour)


def sweep(options: SweepOptions) -> None:
    """Find the load a server takes: bench runs over rates (or concurrencies), the
    throughput–latency curve, its knee, the highest rate within the SLOs, and its cost.

    Each point is a bench run (--duration, --requests, the workload options); without --url
    one embedded engine (--serve-args) serves the whole sweep."""
    config = options.sweep_config()
    err = console(stderr=True)
    interrupt_on_sigterm()
    result = run_sweep(config, console=err, command=sys.argv,
                       progress=err.is_terminal if options.progress is None
                       else options.progress)
    if options.json_output:
        print_json(result.record.model_dump(mode="json") | {"folder": str(result.path)})
    else:
        print_sweep(console(), result.record, result.path)
    err.print(f"sweep folder: {result.path} (sweep.json, sweep.html)", highlight=False)
    if result.stop_reason == "interrupted":
        raise RunFailed(code=EXIT_INTERRUPTED)
    if not result.points:
        raise RunFailed()
