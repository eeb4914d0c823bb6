"""The `latlab` command. Each subcommand parses options and hands off to its module.

Imports of heavy modules (torch, the engine, plotly) stay inside the commands so that
`latlab --help` and the load generator start fast and never need torch.
"""

from __future__ import annotations

from pathlib import Path

import typer

from latlab import __version__
from latlab.load import options

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
    from latlab.records.folder import RunFolder, RunFolderError

    console = Console()
    try:
        analysis = analyze(RunFolder.open(run_dir))
    except RunFolderError as e:
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
    url: options.Url = None,
    model: options.Model = None,
    api_key: options.ApiKey = None,
    api: options.Api = "completions",
    prompt_tokens: options.PromptTokens = "lognormal:256,128",
    output_tokens: options.OutputTokens = "lognormal:64,32",
    dataset: options.Dataset = None,
    prefix_tokens: options.PrefixTokens = 0,
    prefix_fraction: options.PrefixFraction = 1.0,
    tenant: options.Tenant = [],
    priority: options.Priority = [],
    tokenizer: options.Tokenizer = None,
    seed: options.Seed = 0,
    users: int | None = typer.Option(None, help="Closed loop: N users, each sends when its "
                                     "last request ends (default: 4 without --rate)."),
    rate: float | None = typer.Option(None, help="Open loop: requests per second."),
    arrival: options.Arrival = None,
    burstiness: options.Burstiness = None,
    max_concurrency: options.MaxConcurrency = None,
    ramp: float = typer.Option(0.0, help="Seconds to ramp the rate (or users) up from zero."),
    trace: Path | None = typer.Option(None, help="Replay arrival times from JSONL "
                                      "(`timestamp` s or `timestamp_ms` per line)."),
    duration: options.Duration = None,
    requests: options.Requests = None,
    warmup: options.Warmup = None,
    cooldown: options.Cooldown = None,
    timeout: options.Timeout = 300.0,
    workers: options.Workers = 1,
    ignore_eos: options.IgnoreEos = True,
    continuous_usage: options.ContinuousUsage = True,
    slo: options.Slo = [],
    serve_args: options.ServeArgs = "",
    out: options.Out = Path("runs"),
    name: options.Name = None,
    tag: options.Tag = [],
    json_output: bool = typer.Option(False, "--json", help="Print summary.json to stdout."),
    progress: options.Progress = None,
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


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def sweep(
    rates: str | None = typer.Option(None, help="Open-loop request rates to run, e.g. 1,2,4 "
                                     "(default: automatic)."),
    concurrencies: str | None = typer.Option(None, help="Closed-loop user counts to run "
                                             "instead, e.g. 1,4,16."),
    points: int = typer.Option(6, help="Automatic plan: rates spread between the synchronous "
                               "rate and the saturation throughput."),
    saturation_users: int = typer.Option(64, help="Automatic plan: users of the closed-loop "
                                         "probe that finds the saturation throughput."),
    max_error_rate: float = typer.Option(0.05, help="Stop once a point's error rate exceeds "
                                         "this fraction."),
    percentile: float = typer.Option(99.0, help="The percentile the SLOs and the knee are "
                                     "judged at."),
    price_per_hour: float | None = typer.Option(None, help="What the server costs per hour: "
                                                "adds cost per million output tokens and per "
                                                "thousand requests."),
    url: options.Url = None,
    model: options.Model = None,
    api_key: options.ApiKey = None,
    api: options.Api = "completions",
    prompt_tokens: options.PromptTokens = "lognormal:256,128",
    output_tokens: options.OutputTokens = "lognormal:64,32",
    dataset: options.Dataset = None,
    prefix_tokens: options.PrefixTokens = 0,
    prefix_fraction: options.PrefixFraction = 1.0,
    tenant: options.Tenant = [],
    priority: options.Priority = [],
    tokenizer: options.Tokenizer = None,
    seed: options.Seed = 0,
    arrival: options.Arrival = None,
    burstiness: options.Burstiness = None,
    max_concurrency: options.MaxConcurrency = None,
    duration: options.Duration = None,
    requests: options.Requests = None,
    warmup: options.Warmup = None,
    cooldown: options.Cooldown = None,
    timeout: options.Timeout = 300.0,
    workers: options.Workers = 1,
    ignore_eos: options.IgnoreEos = True,
    continuous_usage: options.ContinuousUsage = True,
    slo: options.Slo = [],
    serve_args: options.ServeArgs = "",
    out: options.Out = Path("runs"),
    name: options.Name = None,
    tag: options.Tag = [],
    json_output: bool = typer.Option(False, "--json", help="Print sweep.json to stdout."),
    progress: options.Progress = None,
) -> None:
    """Find the load a server takes: bench runs over rates (or concurrencies), the
    throughput–latency curve, its knee, the highest rate within the SLOs, and its cost.

    Each point is a bench run (--duration, --requests, the workload options); without --url
    one embedded engine (--serve-args) serves the whole sweep."""
    import sys

    import orjson
    from pydantic import ValidationError
    from rich.console import Console

    from latlab.load import command
    from latlab.load.arrivals import ArrivalError
    from latlab.load.config import BenchError
    from latlab.load.datasets import DatasetError
    from latlab.load.sweep import SweepConfig, run_sweep
    from latlab.load.target import interrupt_on_sigterm
    from latlab.load.workload import WorkloadError
    from latlab.report.capacity import print_sweep

    err = Console(stderr=True)
    try:
        base = command.build_config(
            url=url, model=model, api_key=api_key, api=api, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, dataset=dataset, prefix_tokens=prefix_tokens,
            prefix_fraction=prefix_fraction, tenants=tenant, priorities=priority,
            tokenizer=tokenizer, seed=seed, users=1, rate=None, arrival=None, burstiness=None,
            max_concurrency=max_concurrency, ramp=0.0, trace=None, duration=duration,
            requests=requests, warmup=warmup, cooldown=cooldown, timeout=timeout,
            workers=workers, ignore_eos=ignore_eos, continuous_usage=continuous_usage,
            slos=slo, serve_args=serve_args, out=out, name=name, tags=tag)
        config = SweepConfig(
            base=base, rates=options.parse_numbers(rates, "--rates"),
            concurrencies=options.parse_numbers(concurrencies, "--concurrencies", int),
            points=points, saturation_users=saturation_users, max_error_rate=max_error_rate,
            percentile=percentile, price_per_hour=price_per_hour, burstiness=burstiness or 1.0,
            arrival=arrival or ("gamma" if burstiness is not None else "poisson"))
    except (command.OptionError, ValidationError) as e:
        message = command.validation_message(e) if isinstance(e, ValidationError) else e
        typer.echo(f"latlab sweep: error: {message}", err=True)
        raise typer.Exit(command.EXIT_BAD_OPTIONS)
    interrupt_on_sigterm()
    try:
        result = run_sweep(config, console=err, command=sys.argv,
                           progress=err.is_terminal if progress is None else progress)
    except (WorkloadError, ArrivalError, DatasetError) as e:
        err.print(f"latlab sweep: error: {e}", markup=False, highlight=False)
        raise typer.Exit(command.EXIT_BAD_OPTIONS)
    except BenchError as e:
        err.print(f"latlab sweep: {e}", style="bold red", markup=False, highlight=False)
        raise typer.Exit(command.EXIT_FAILED_RUN)
    if json_output:
        sys.stdout.write(orjson.dumps(result.data | {"folder": str(result.path)},
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_sweep(Console(), result.data, result.path)
    err.print(f"sweep folder: {result.path} (sweep.json, sweep.html)", highlight=False)
    if result.stop_reason == "interrupted":
        raise typer.Exit(command.EXIT_INTERRUPTED)
    raise typer.Exit(command.EXIT_OK if result.points else command.EXIT_FAILED_RUN)


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def coldstart(
    runs: int = typer.Option(3, help="How many times to start the server."),
    command: str | None = typer.Option(None, "--command", help="The server command to start "
                                       "(default: the embedded engine, with --serve-args)."),
    url: str | None = typer.Option(None, help="Where --command's server answers requests "
                                   "(http://HOST:PORT)."),
    ready_url: str | None = typer.Option(None, help="Polled until it answers 200 (default: "
                                         "--url + /v1/models)."),
    warm_requests: int = typer.Option(5, help="Requests after the first; their median is the "
                                      "warm baseline."),
    idle_gaps: str = typer.Option("1s,5s", help="Idle gaps to probe, e.g. 1s,5s,30s (empty: "
                                  "none)."),
    ready_timeout: float = typer.Option(300.0, help="Seconds to wait for the server to be "
                                        "ready."),
    serve_args: options.ServeArgs = "",
    model: options.Model = None,
    api_key: options.ApiKey = None,
    api: options.Api = "completions",
    prompt_tokens: options.PromptTokens = "128",
    output_tokens: options.OutputTokens = "32",
    dataset: options.Dataset = None,
    tokenizer: options.Tokenizer = None,
    seed: options.Seed = 0,
    timeout: options.Timeout = 300.0,
    ignore_eos: options.IgnoreEos = True,
    continuous_usage: options.ContinuousUsage = True,
    out: options.Out = Path("runs"),
    name: options.Name = None,
    tag: options.Tag = [],
    json_output: bool = typer.Option(False, "--json", help="Print coldstart.json to stdout."),
) -> None:
    """Measure cold start: start the server --runs times; time to ready, the first request
    against the warm ones after it, and the next request after idle gaps. Every process it
    starts is stopped, on errors and Ctrl-C too."""
    import shlex
    import sys

    import orjson
    from pydantic import ValidationError
    from rich.console import Console

    from latlab.load import command as bench_command
    from latlab.load.coldstart import ColdstartConfig, run_coldstart
    from latlab.load.config import BenchError
    from latlab.load.datasets import DatasetError
    from latlab.load.target import interrupt_on_sigterm
    from latlab.load.workload import WorkloadError
    from latlab.report.capacity import print_coldstart

    err = Console(stderr=True)
    try:
        server = shlex.split(command) if command else []
        serve = bench_command.split_serve_args(serve_args)
        if tokenizer is None and not server:
            tokenizer = bench_command.engine_tokenizer(serve)
        config = ColdstartConfig(
            runs=runs, command=server, url=url, ready_url=ready_url, serve_args=serve,
            model=model, api_key=api_key, warm_requests=warm_requests,
            idle_gaps_s=options.parse_seconds(idle_gaps, "--idle-gaps"),
            ready_timeout_s=ready_timeout, timeout_s=timeout, ignore_eos=ignore_eos,
            continuous_usage=continuous_usage, out=out, tags=tag,
            name=name or (Path(server[0]).name if server else "engine"),
            workload=bench_command.workload_config(
                api=api, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                dataset=dataset, tokenizer=tokenizer, seed=seed))
    except (bench_command.OptionError, ValidationError) as e:
        message = bench_command.validation_message(e) if isinstance(e, ValidationError) else e
        typer.echo(f"latlab coldstart: error: {message}", err=True)
        raise typer.Exit(bench_command.EXIT_BAD_OPTIONS)
    interrupt_on_sigterm()
    try:
        result = run_coldstart(config, console=err, command=sys.argv)
    except (WorkloadError, DatasetError) as e:
        err.print(f"latlab coldstart: error: {e}", markup=False, highlight=False)
        raise typer.Exit(bench_command.EXIT_BAD_OPTIONS)
    except BenchError as e:
        err.print(f"latlab coldstart: {e}", style="bold red", markup=False, highlight=False)
        raise typer.Exit(bench_command.EXIT_FAILED_RUN)
    if json_output:
        sys.stdout.write(orjson.dumps(result.data | {"run": str(result.run.path)},
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_coldstart(Console(), result.data, result.run.path)
    err.print(f"run folder: {result.run.path} (coldstart.json, requests.jsonl)", highlight=False)
    if result.interrupted:
        err.print("latlab coldstart: interrupted (the starts finished so far are kept)",
                  style="yellow")
        raise typer.Exit(bench_command.EXIT_INTERRUPTED)


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def serve(
    model: str = typer.Option("default", help="A preset (tiny, default: random weights) or a "
                              "Hugging Face checkpoint folder (Llama, Mistral, Qwen2)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8000, help="Port to bind."),
    api_key: str | None = typer.Option(None, help="Require `Authorization: Bearer KEY` on /v1 "
                                       "(seen in `ps`: prefer LATLAB_API_KEY or "
                                       "--api-key-file)."),
    api_key_file: Path | None = typer.Option(None, help="Read the API key from this file's "
                                             "first line."),
    allow_origin: list[str] = typer.Option([], help="Let web pages at this origin call the "
                                           "API (CORS); repeat for more, `*` for any."),
    served_model_name: str | None = typer.Option(None, help="Model id in the API "
                                                 "[default: --model]."),
    max_model_len: int | None = typer.Option(None, help="Context length (prompt + output "
                                             "tokens) [default: the model's, at most 2048]."),
    max_num_seqs: int = typer.Option(32, help="Most sequences in a running batch."),
    max_num_batched_tokens: int = typer.Option(512, help="Token budget of one engine step."),
    block_size: int = typer.Option(16, help="Tokens per KV-cache block."),
    num_kv_blocks: int | None = typer.Option(None, help="KV-cache blocks [default: as many "
                                             "as --kv-cache-mib holds]."),
    kv_cache_mib: int = typer.Option(256, help="KV-cache memory when --num-kv-blocks is unset."),
    batching: str = typer.Option("continuous", help="continuous (iteration-level) or static "
                                 "(a batch admits nobody until it has finished)."),
    chunked_prefill: bool = typer.Option(True, help="Cut long prompts into chunks that fit "
                                         "the step budget."),
    max_waiting: int = typer.Option(256, help="Waiting-queue limit; beyond it requests get 429."),
    threads: int = typer.Option(1, help="Torch intra-op threads."),
    seed: int = typer.Option(0, help="Seed of the preset weights and of unseeded sampling."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    warmup: bool = typer.Option(True, help="Warm up before reporting ready."),
    otel_file: Path | None = typer.Option(None, help="Append an OpenTelemetry span per "
                                          "request (stages as events) to this JSON-lines file."),
) -> None:
    """Serve a model through an OpenAI-compatible API (latlab's reference engine, on CPU)."""
    from latlab.engine.config import ConfigError, EngineConfig
    from latlab.engine.loader import ModelLoadError
    from latlab.server.auth import read_api_key
    from latlab.server.openai_serving import ServerSettings
    from latlab.server.serve import run_server

    config = EngineConfig(
        model=model, max_model_len=max_model_len, block_size=block_size,
        num_kv_blocks=num_kv_blocks, kv_cache_mib=kv_cache_mib, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=chunked_prefill,
        batching=batching, max_waiting=max_waiting, threads=threads, seed=seed, dtype=dtype,
        warmup=warmup)
    try:
        settings = ServerSettings(served_model_name=served_model_name or model,
                                  api_key=read_api_key(api_key, api_key_file),
                                  allow_origins=tuple(allow_origin), otel_file=otel_file)
        run_server(config, settings, host=host, port=port)
    except (ConfigError, ModelLoadError) as e:
        typer.echo(f"latlab serve: error: {e}", err=True)
        raise typer.Exit(2) from None


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def compare(
    runs: list[str] = typer.Argument(..., metavar="RUN_A RUN_B [RUN...]", help="Run folders or "
                                     "run ids (see `latlab runs`); each is compared with the first."),
    fail_if: list[str] = typer.Option([], "--fail-if", help="Regression gate like "
                                      "'p99_ttft>+10%' or 'output_tokens_per_s<-5%' (repeatable); "
                                      "exit code 1 when one trips."),
    require_significance: bool = typer.Option(False, help="Let a gate trip only when its change "
                                              "is significant (95% CI excludes zero)."),
    allow_different_workloads: bool = typer.Option(False, help="Compare runs whose workloads "
                                                   "differ."),
    runs_dir: Path = typer.Option(Path("runs"), help="Runs folder holding the run store."),
    full: bool = typer.Option(False, "--full", help="Show mean and p90 too, not only p50 and p99."),
) -> None:
    """Compare runs side by side: each metric's change, its confidence, and which component
    of the latency budget it came from."""
    from rich.console import Console

    from latlab.analysis import analyze
    from latlab.analysis.compare import CompareError
    from latlab.analysis.compare import compare as compare_runs
    from latlab.analysis.gate import Gate, GateError
    from latlab.report.comparison import print_comparison
    from latlab.records.folder import RunFolder, RunFolderError
    from latlab.store import resolve_run

    console = Console()
    if len(runs) < 2:
        typer.echo("latlab compare: error: give at least two runs", err=True)
        raise typer.Exit(2)
    try:
        gates = [Gate.parse(text) for text in fail_if]
        analyses = [analyze(RunFolder.open(resolve_run(ref, runs_dir))) for ref in runs]
        tripped = []
        for ref, analysis in zip(runs[1:], analyses[1:]):
            comparison = compare_runs(analyses[0], analysis)
            if comparison.workload_differences and not allow_different_workloads:
                raise RunFolderError(f"{runs[0]} and {ref} ran different workloads ("
                                  + "; ".join(comparison.workload_differences)
                                  + "); pass --allow-different-workloads to compare anyway")
            print_comparison(console, comparison, str(analyses[0].run.path),
                             str(analysis.run.path), full=full)
            tripped += [m for g in gates if (m := g.check(comparison, require_significance))]
    except (RunFolderError, GateError, CompareError) as e:
        typer.echo(f"latlab compare: error: {e}", err=True)
        raise typer.Exit(2) from None
    for message in tripped:
        console.print(f"[red]regression:[/] {message}")
    if gates and not tripped:
        console.print(f"[green]all {len(gates)} gates passed[/]")
    raise typer.Exit(1 if tripped else 0)


@app.command("runs", context_settings={"help_option_names": ["-h", "--help"]})
def list_runs(
    runs_dir: Path = typer.Option(Path("runs"), help="Runs folder holding the run store."),
    target: str | None = typer.Option(None, help="Only runs whose target URL contains this."),
    model: str | None = typer.Option(None, help="Only runs whose model contains this."),
    tag: str | None = typer.Option(None, help="Only runs with this tag."),
    kind: str | None = typer.Option(None, help="bench, sweep or coldstart."),
    limit: int = typer.Option(30, min=1, help="Show at most this many, newest first."),
    rescan: bool = typer.Option(False, help="First register run folders the store misses."),
) -> None:
    """List past runs with their key numbers; `latlab compare` takes their ids."""
    from rich.console import Console

    from latlab.report.comparison import print_runs
    from latlab.store import RunStore

    with RunStore(runs_dir) as store:
        if rescan:
            store.rescan()
        print_runs(Console(), store.list(target=target, model=model, tag=tag, kind=kind,
                                         limit=limit))


tokenizer_app = typer.Typer(help="The tokenizer latlab's engine uses.", no_args_is_help=True)
app.add_typer(tokenizer_app, name="tokenizer")


@tokenizer_app.command("export")
def tokenizer_export(
    folder: Path = typer.Argument(..., help="Where to write the Hugging Face tokenizer folder."),
    model: str = typer.Option("default", help="A preset or a checkpoint folder, as in serve."),
) -> None:
    """Write the tokenizer as a Hugging Face folder, so other tools count tokens the same way."""
    from latlab.engine.config import PRESETS
    from latlab.tokenizer import Tokenizer, TokenizerError

    try:
        tokenizer = Tokenizer.load(None if model in PRESETS else model)
    except TokenizerError as e:
        typer.echo(f"latlab tokenizer export: error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {tokenizer.save_pretrained(folder)}")


model_app = typer.Typer(help="The models latlab's engine serves.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("export")
def model_export(
    folder: Path = typer.Argument(..., help="Where to write the checkpoint folder."),
    model: str = typer.Option("default", help="The preset to export."),
    seed: int = typer.Option(0, help="Seed of the random weights (as `latlab serve --seed`)."),
) -> None:
    """Write a preset as a Hugging Face Llama checkpoint (config.json, model.safetensors,
    tokenizer), so other engines can serve the very same model."""
    import torch

    from latlab.engine.config import PRESETS
    from latlab.engine.loader import load_model, save_checkpoint

    if model not in PRESETS:
        typer.echo(f"latlab model export: error: --model must be one of {', '.join(PRESETS)}",
                   err=True)
        raise typer.Exit(2)
    typer.echo(f"wrote {save_checkpoint(load_model(model, torch.float32, seed), folder)}")


def main() -> None:
    app()
