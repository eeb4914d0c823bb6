"""`latlab coldstart`: options → `ColdstartConfig` → `run_coldstart` → print → exit code."""

from __future__ import annotations

import sys

from latlab.commands.common import EXIT_INTERRUPTED, RunFailed, console, print_json
from latlab.commands.options import ConfigFile
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.records.coldstart import ColdstartConfig
from latlab.report.coldstart import print_coldstart
from latlab.services.coldstart import run_coldstart

# The probes are single requests, one at a time; coldstart starts its own server (--command
# or the embedded engine), so bench's --launch and gateway options would go unused.
NOT_TAKEN = frozenset({"workload.sessions", "launch", "launch_ready", "launch_timeout_s",
                       "server_url"})


def coldstart(config: ColdstartConfig, options: ConfigFile) -> None:
    """Measure cold start: start the server --runs times; time to ready, the first request
    against the warm ones after it, and the next request after idle gaps. Every process it
    starts is stopped, on errors and Ctrl-C too."""
    err = console(stderr=True)
    interrupt_on_sigterm()
    result = run_coldstart(config, console=err, command=sys.argv)
    if options.json_output:
        print_json(result.record.model_dump(mode="json") | {"run": str(result.run.path)})
    else:
        print_coldstart(console(), result.record, result.run.path)
    err.print(f"run folder: {result.run.path} (coldstart.json, requests.jsonl)", highlight=False)
    if result.interrupted:
        raise RunFailed("interrupted (the starts finished so far are kept)",
                        code=EXIT_INTERRUPTED)
