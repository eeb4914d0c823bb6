"""`latlab trace`: options → `TraceConfig` → the window's profile (and its export) → print.

    latlab trace conversation_trace.jsonl                        # characterise it, plot it
    latlab trace big.jsonl --trace-start 600 --duration 120 --export slice.jsonl
    latlab trace runs/20250101-120000-bench --export traffic.jsonl   # a run's traffic, no text
"""

from __future__ import annotations

from pathlib import Path

from latlab.commands.common import console, print_json
from latlab.commands.options import JsonOutput
from latlab.records.settings import OUTPUT, setting
from latlab.records.trace import TraceConfig
from latlab.report.trace import print_trace
from latlab.report.trace_html import write_trace_html
from latlab.services.trace import export_trace, profile_trace

# A trace sets its own arrivals: the load's other settings are not the window's.
NOT_TAKEN = frozenset({"arrivals.process", "arrivals.burstiness", "arrivals.max_concurrency",
                       "arrivals.users", "arrivals.rate", "arrivals.ramp_s", "arrivals.trace"})


class TraceOptions(JsonOutput):
    page: bool = setting(True, "Write the trace's page: rate over time, length histograms.",
                         "--page/--no-page", group=OUTPUT)
    html: Path | None = setting(None, "Where to write it (default: NAME-trace.html in the "
                                "current folder).", group=OUTPUT)


def trace(config: TraceConfig, options: TraceOptions) -> None:
    """Characterise a trace as --trace would replay it (its window, speed and length scale):
    rate over time and burstiness, prompt and output lengths, prefix sharing and reuse,
    sessions, and the synthetic workload closest to it; printed and plotted. --export writes
    the window as Mooncake-style JSONL without text: a slice of a big trace, or a run's
    traffic to share without its prompts."""
    out, err = console(), console(stderr=True)
    profile = profile_trace(config)
    if config.export is not None:
        count = export_trace(config, config.export)
        err.print(f"exported {count:,} requests to {config.export}", highlight=False,
                  markup=False)
    if options.page:
        source = Path(profile.source)
        page = options.html or Path(f"{source.stem or source.name}-trace.html")
        write_trace_html(page, profile)
        err.print(f"trace page: {page}", highlight=False, markup=False)
    if options.json_output:
        print_json(profile.model_dump(mode="json"))
    else:
        print_trace(out, profile)
