"""`latlab observe`: options → `ObserveConfig` → `run_observe` → print → exit code."""

from __future__ import annotations

import signal
import sys
import threading

from latlab.commands.common import UsageError, console, print_json
from latlab.commands.options import JsonOutput
from latlab.records.observe import ObserveConfig
from latlab.report.observe import LiveView, print_observed
from latlab.services.observe import run_observe


def observe(config: ObserveConfig, options: JsonOutput) -> None:
    """Explain a service's own traffic from its OpenTelemetry spans: its model server's
    (latlab serve, vLLM, SGLang), its application's (OpenTelemetry's GenAI instrumentation,
    its own spans), joined per trace; each LLM call becomes a record with its components.
    Live: a rolling window of rate, TTFT and E2E, the budget and the findings; Ctrl-C (or
    --duration) ends it and writes a run folder that report, compare, runs and predict
    --replay read, with the traffic as a trace and the workload fitted to it."""
    stop = threading.Event()
    before = {signum: signal.signal(signum, lambda *_: stop.set())
              for signum in (signal.SIGINT, signal.SIGTERM)}
    err = console(stderr=True)
    try:
        with LiveView(err) as view:
            result = run_observe(config, stop=stop, view=view, command=sys.argv)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    if options.json_output:
        print_json(result.summary.to_json() | {"run": str(result.run.path),
                                               "observe": result.record.model_dump(mode="json")})
    else:
        print_observed(console(), result)
    err.print(f"run folder: {result.run.path} (requests.jsonl, windows.jsonl, trace.jsonl, "
              "observe.json)", highlight=False)
    if config.from_file is not None and not result.record.spans:  # live, none may come
        raise UsageError(f"--from {config.from_file}: no span latlab could read in it "
                         "(OTLP/JSON lines, or a span file of latlab's)")
