"""`latlab sweep`: options → `SweepConfig` → `run_sweep` → the curve and its answers."""

from __future__ import annotations

import sys

from latlab.commands.bench import Display
from latlab.commands.common import EXIT_INTERRUPTED, RunFailed, UsageError, console, print_json
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.records.sweep import SweepConfig
from latlab.report.sweep import print_sweep
from latlab.services.sweep import run_sweep

# The sweep sets each point's load; the arrival shape is the plan's; a trace is swept at
# the speeds that give the plan's rates.
NOT_TAKEN = frozenset(f"base.arrivals.{name}" for name in (
    "process", "burstiness", "max_concurrency", "users", "rate", "ramp_s"))


def sweep(config: SweepConfig, options: Display) -> None:
    """Find the load a server takes: bench runs over rates (or concurrencies), the
    throughput–latency curve, its knee, the highest rate within the SLOs, and its cost.

    Each point is a bench run (--duration, --requests, the workload options); without --url
    one embedded engine (--serve-args) serves the whole sweep."""
    err = console(stderr=True)
    try:
        config.base.check_target()
    except ValueError as e:
        raise UsageError(str(e)) from None
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
