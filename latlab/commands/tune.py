"""`latlab tune`: options → `TuneConfig` → `run_tune` → the setting to use → exit code.

    latlab tune --serve-args "--model tiny" --users 8 --slo ttft=500ms --slo tpot=50ms
    latlab tune --launch "llama-server -m M --port {port} {args}" --serve-args "-np 4" ...
"""

from __future__ import annotations

from latlab.commands.common import Interrupted, UsageError, console, print_json
from latlab.commands.options import NamedWorkload
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.records.tune import TuneConfig
from latlab.report.tune import print_tune
from latlab.services.tune import run_tune

# tune starts the server it changes: latlab serve (--serve-args) or --launch, not a URL.
NOT_TAKEN = frozenset({"bench.url"})


def tune(config: TuneConfig, options: NamedWorkload) -> None:
    """Search a server's batching settings (max sequences, token budget, prefix caching) for
    the most goodput under the SLOs: screen them in the simulator calibrated on one measured
    run, verify the best few with ab on the real server, and say where the two disagree."""
    try:
        config.bench.check_target()
    except ValueError as e:
        raise UsageError(str(e)) from None
    interrupt_on_sigterm()
    err = console(stderr=True)
    result = run_tune(config, err)
    if options.json_output:
        print_json(result.record.model_dump(mode="json") | {"folder": str(result.folder)})
    else:
        print_tune(console(), result.record)
    err.print(f"tune folder: {result.folder} (tune.json; each ab's folder)", highlight=False)
    if result.record.interrupted:
        raise Interrupted("interrupted: what was screened and measured is kept")
