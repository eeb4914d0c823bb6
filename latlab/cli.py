"""The `latlab` command. Each subcommand parses options and hands off to its module.

Imports of heavy modules (torch, the engine, plotly) stay inside the commands so that
`latlab --help` and the load generator start fast and never need torch.
"""

from __future__ import annotations

from pathlib import Path

import typer

from latlab import __version__

app = typer.Typer(
    name="latlab",
    help="Measure, explain and predict the end-to-end latency of AI inference services.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"latlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Measure, explain and predict the end-to-end latency of AI inference services."""


@app.command()
def report(
    run_dir: str = typer.Argument(..., metavar="RUN_DIR", help="A run folder from `latlab bench`."),
    out: str = typer.Option(None, "--out", "-o", help="Where to write the HTML report "
                            "(default: RUN_DIR/report.html)."),
    csv: bool = typer.Option(False, "--csv", help="Also write the per-request table to "
                             "RUN_DIR/requests.csv."),
    parquet: bool = typer.Option(False, "--parquet", help="Also write the per-request table "
                                 "to RUN_DIR/requests.parquet."),
    full: bool = typer.Option(False, "--full", help="Print every component, not only the buckets."),
) -> None:
    """Explain a run: where the time goes, the findings, and one self-contained HTML report.

    Works on a partial run (no summary.json: it is recomputed from the records)."""
    from pathlib import Path

    from rich.console import Console

    from latlab.analysis import analyze
    from latlab.report.console import print_budget, print_findings, print_summary
    from latlab.report.export import write_csv, write_parquet
    from latlab.report.html import write_html
    from latlab.rundir import RunDir, RunDirError

    console = Console()
    try:
        analysis = analyze(RunDir.open(run_dir))
    except RunDirError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    print_summary(console, analysis.summary, analysis.run.path)
    console.print()
    print_budget(console, analysis, full=full)
    console.print()
    print_findings(console, analysis)
    written = [write_html(analysis.run, analysis, Path(out) if out else None)]
    if csv:
        written.append(write_csv(analysis))
    if parquet:
        written.append(write_parquet(analysis))
    for path in written:
        console.print(f"wrote {path}")


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def bench(
    url: str | None = typer.Option(None, help="Target server (http://HOST:PORT). Without it the "
                                   "embedded engine (latlab serve) is started for the run."),
    model: str | None = typer.Option(None, help="Model name to request [default: the first the "
                                     "server lists at /v1/models]."),
    api_key: str | None = typer.Option(None, envvar="OPENAI_API_KEY", show_envvar=True,
                                       help="Bearer token for the target."),
    api: str = typer.Option("completions", help="completions or chat."),
    prompt_tokens: str = typer.Option("lognormal:256,128", help="Prompt length distribution: "
                                      "N, fixed:N, uniform:LO,HI, normal:MEAN,STD, "
                                      "lognormal:MEAN,STD (in tokens)."),
    output_tokens: str = typer.Option("lognormal:64,32", help="Output length distribution (held "
                                      "with max_tokens, ignore_eos and min_tokens)."),
    dataset: Path | None = typer.Option(None, help="JSONL (prompt or messages, optional "
                                        "output_tokens, tenant, priority) or ShareGPT JSON."),
    prefix_tokens: int = typer.Option(0, help="A shared system prompt of this many tokens..."),
    prefix_fraction: float = typer.Option(1.0, help="...for this fraction of the requests."),
    tenant: list[str] = typer.Option([], help="Tenant label NAME[:WEIGHT], sent as `user` "
                                     "(repeatable)."),
    priority: list[str] = typer.Option([], help="Priority INT[:WEIGHT], sent as `priority` "
                                       "(repeatable)."),
    tokenizer: str | None = typer.Option(None, help="The target's tokenizer (tokenizer.json or "
                                         "HF folder) [default: latlab's bundled one]."),
    seed: int = typer.Option(0, help="Seed of the workload and the arrivals."),
    users: int | None = typer.Option(None, help=f"Closed loop: N users, each sends when its "
                                     f"last request ends [default: 4 without --rate]."),
    rate: float | None = typer.Option(None, help="Open loop: requests per second."),
    arrival: str | None = typer.Option(None, help="Open-loop arrivals: poisson, gamma or "
                                       "constant [default: poisson]."),
    burstiness: float | None = typer.Option(None, help="Gamma shape: 1 is Poisson, below 1 "
                                            "burstier (CV = 1/sqrt(burstiness))."),
    max_concurrency: int | None = typer.Option(None, help="Cap on requests in flight (open "
                                               "loop); waiting shows as lateness."),
    ramp: float = typer.Option(0.0, help="Seconds to ramp the rate (or users) up from zero."),
    trace: Path | None = typer.Option(None, help="Replay arrival times from JSONL "
                                      "(`timestamp` s or `timestamp_ms` per line)."),
    duration: float | None = typer.Option(None, help="Seconds of load [default: 20 unless "
                                          "--requests]."),
    requests: int | None = typer.Option(None, help="Stop after this many requests."),
    warmup: float | None = typer.Option(None, help="Seconds excluded from statistics at the "
                                        "start [default: 10% of --duration, at most 5]."),
    cooldown: float | None = typer.Option(None, help="Seconds excluded at the end [default: 5% "
                                          "of --duration, at most 2]."),
    timeout: float = typer.Option(300.0, help="Per-request timeout in seconds."),
    workers: int = typer.Option(1, help="Client processes sharing the schedule."),
    ignore_eos: bool = typer.Option(True, help="Send ignore_eos and min_tokens to hold the "
                                    "output length."),
    continuous_usage: bool = typer.Option(True, help="Ask for cumulative usage in every chunk "
                                          "(tokens per event)."),
    slo: list[str] = typer.Option([], help="SLO like ttft=200ms or tpot=50ms (repeatable); "
                                  "sets goodput."),
    serve_args: str = typer.Option("", help="Arguments for the embedded latlab serve."),
    out: Path = typer.Option(Path("runs"), help="Folder for run folders."),
    name: str | None = typer.Option(None, help="Run name (in the folder name)."),
    tag: list[str] = typer.Option([], help="Free-form tag recorded in config.json (repeatable)."),
    json_output: bool = typer.Option(False, "--json", help="Print summary.json to stdout."),
    progress: bool | None = typer.Option(None, "--progress/--no-progress",
                                         help="Live progress [default: on a terminal]."),
    explain: bool = typer.Option(False, "--explain", help="Print the metric formulas and exit."),
) -> None:
    """Run a workload against an OpenAI-compatible server and measure every request."""
    from rich.console import Console

    from latlab.load import command

    if explain:
        command.explain(Console())
        raise typer.Exit()
    try:
        config = command.build_config(
            url=url, model=model, api_key=api_key, api=api, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, dataset=dataset, prefix_tokens=prefix_tokens,
            prefix_fraction=prefix_fraction, tenants=tenant, priorities=priority,
            tokenizer=tokenizer, seed=seed, users=users, rate=rate, arrival=arrival,
            burstiness=burstiness, max_concurrency=max_concurrency, ramp=ramp, trace=trace,
            duration=duration, requests=requests, warmup=warmup, cooldown=cooldown,
            timeout=timeout, workers=workers, ignore_eos=ignore_eos,
            continuous_usage=continuous_usage, slos=slo, serve_args=serve_args, out=out,
            name=name, tags=tag)
        code = command.run_command(config, json_output=json_output, progress=progress)
    except command.OptionError as e:
        typer.echo(f"latlab bench: error: {e}", err=True)
        raise typer.Exit(command.EXIT_BAD_OPTIONS)
    raise typer.Exit(code)


def main() -> None:
    app()
