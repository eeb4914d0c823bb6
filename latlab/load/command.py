"""`latlab bench` behind the CLI: options → `BenchConfig`, run, print, exit code.

Every option is checked before any load is sent; a bad one is reported by its name.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import orjson
from pydantic import ValidationError
from rich.console import Console

from latlab.load.arrivals import OPEN_LOOP, ArrivalConfig, ArrivalError
from latlab.load.config import BenchConfig
from latlab.load.datasets import DatasetError
from latlab.load.workload import LengthDistribution, WorkloadConfig, WorkloadError
from latlab.metrics import FORMULAS, parse_slo
from latlab.records.folder import RunFolder
from latlab.store import RunStore

if TYPE_CHECKING:
    from latlab.analysis import RunAnalysis

EXIT_OK, EXIT_FAILED_RUN, EXIT_BAD_OPTIONS, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_DURATION_S = 20.0
DEFAULT_USERS = 4

_OPTIONS = {
    "url": "--url", "duration_s": "--duration", "requests": "--requests", "warmup_s": "--warmup",
    "cooldown_s": "--cooldown", "timeout_s": "--timeout", "workers": "--workers",
    "users": "--users", "rate": "--rate", "burstiness": "--burstiness",
    "max_concurrency": "--max-concurrency", "ramp_s": "--ramp", "trace": "--trace",
    "prefix_tokens": "--prefix-tokens", "prefix_fraction": "--prefix-fraction",
    "tenants": "--tenant", "priorities": "--priority", "dataset": "--dataset",
    "rates": "--rates", "concurrencies": "--concurrencies", "points": "--points",
    "saturation_users": "--saturation-users", "max_error_rate": "--max-error-rate",
    "percentile": "--percentile", "price_per_hour": "--price-per-hour", "runs": "--runs",
    "warm_requests": "--warm-requests", "idle_gaps_s": "--idle-gaps",
    "ready_timeout_s": "--ready-timeout",
}


class OptionError(ValueError):
    """A bad option, named in the message."""


def build_config(*, url: str | None, model: str | None, api_key: str | None, api: str,
                 prompt_tokens: str, output_tokens: str, dataset: Path | None,
                 prefix_tokens: int, prefix_fraction: float, tenants: list[str],
                 priorities: list[str], tokenizer: str | None, seed: int, users: int | None,
                 rate: float | None, arrival: str | None, burstiness: float | None,
                 max_concurrency: int | None, ramp: float, trace: Path | None,
                 duration: float | None, requests: int | None, warmup: float | None,
                 cooldown: float | None, timeout: float, workers: int, ignore_eos: bool,
                 continuous_usage: bool, slos: list[str], serve_args: str, out: Path,
                 name: str | None, tags: list[str]) -> BenchConfig:
    """The `BenchConfig` of the command line; raises `OptionError` naming the bad option."""
    serve = split_serve_args(serve_args)
    if tokenizer is None and url is None:
        tokenizer = engine_tokenizer(serve)
    workload = workload_config(api=api, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                               dataset=dataset, prefix_tokens=prefix_tokens,
                               prefix_fraction=prefix_fraction, tenants=tenants,
                               priorities=priorities, tokenizer=tokenizer, seed=seed)
    try:
        arrivals = ArrivalConfig(users=users or DEFAULT_USERS, rate=rate,
                                 burstiness=burstiness or 1.0, max_concurrency=max_concurrency,
                                 ramp_s=ramp, trace=trace, seed=seed,
                                 process=_process(users, rate, arrival, burstiness, trace))
        if duration is None and requests is None and trace is None:
            duration = DEFAULT_DURATION_S
        if warmup is None:
            warmup = min(0.1 * duration, 5.0) if duration else 0.0
        if cooldown is None:
            cooldown = min(0.05 * duration, 2.0) if duration else 0.0
        slo = dict(_slo(text) for text in slos)
        return BenchConfig(url=url, model=model, api_key=api_key, workload=workload,
                           arrivals=arrivals, duration_s=duration, requests=requests,
                           warmup_s=warmup, cooldown_s=cooldown, timeout_s=timeout,
                           workers=workers, ignore_eos=ignore_eos,
                           continuous_usage=continuous_usage, slos=slo,
                           serve_args=serve, out=out,
                           name=name or ("engine" if url is None else "bench"), tags=tags)
    except ValidationError as e:
        raise OptionError(validation_message(e)) from None


def split_serve_args(serve_args: str) -> list[str]:
    import shlex

    try:
        return shlex.split(serve_args)
    except ValueError as e:
        raise OptionError(f"--serve-args {serve_args!r}: {e}") from None


def workload_config(*, api: str, prompt_tokens: str, output_tokens: str,
                    dataset: Path | None = None, prefix_tokens: int = 0,
                    prefix_fraction: float = 1.0, tenants: Sequence[str] = (),
                    priorities: Sequence[str] = (), tokenizer: str | None = None,
                    seed: int = 0) -> WorkloadConfig:
    """The workload of the command line; raises `OptionError` naming the bad option."""
    if api not in ("completions", "chat"):
        raise OptionError(f"--api {api!r}: expected completions or chat")
    try:
        return WorkloadConfig(
            api=api, prompt_tokens=LengthDistribution.parse(prompt_tokens, "--prompt-tokens"),
            output_tokens=LengthDistribution.parse(output_tokens, "--output-tokens"),
            dataset=dataset, prefix_tokens=prefix_tokens, prefix_fraction=prefix_fraction,
            tenants=_weights(tenants, "--tenant", str), tokenizer=tokenizer, seed=seed,
            priorities=_weights(priorities, "--priority", int))
    except ValidationError as e:
        raise OptionError(validation_message(e)) from None
    except WorkloadError as e:
        raise OptionError(str(e)) from None


def engine_tokenizer(serve_args: list[str]) -> str | None:
    """The embedded engine's checkpoint folder, when it serves one: prompts are then counted
    in that model's tokens."""
    for i, arg in enumerate(serve_args):
        value = serve_args[i + 1] if arg == "--model" and i + 1 < len(serve_args) else (
            arg.removeprefix("--model=") if arg.startswith("--model=") else None)
        if value and (Path(value) / "tokenizer.json").is_file():
            return value
    return None


def _process(users: int | None, rate: float | None, arrival: str | None,
             burstiness: float | None, trace: Path | None) -> str:
    if arrival is not None and arrival not in OPEN_LOOP:
        raise OptionError(f"--arrival {arrival!r}: expected one of {', '.join(OPEN_LOOP)}")
    if trace is not None:
        if rate is not None or users is not None:
            raise OptionError("--trace replays its own timestamps: drop --rate/--users")
        return "trace"
    if rate is not None:
        if users is not None:
            raise OptionError("--users (closed loop) and --rate (open loop) exclude each other; "
                              "cap an open loop with --max-concurrency")
        return arrival or ("gamma" if burstiness is not None else "poisson")
    if arrival is not None or burstiness is not None:
        raise OptionError("--arrival and --burstiness shape an open loop: give --rate")
    return "closed"


def _weights(items: Sequence[str], option: str, kind: type) -> dict[Any, float]:
    weights: dict[Any, float] = {}
    for item in items:
        label, _, weight = item.rpartition(":") if ":" in item else (item, "", "1")
        try:
            weights[kind(label)] = float(weight)
        except ValueError:
            raise OptionError(f"{option} {item!r}: expected LABEL[:WEIGHT]"
                              + (" with an integer LABEL" if kind is int else "")) from None
    return weights


def _slo(text: str) -> tuple[str, float]:
    try:
        return parse_slo(text)
    except ValueError as e:
        raise OptionError(f"--slo: {e}") from None


def validation_message(e: ValidationError) -> str:
    first = e.errors()[0]
    field = next((str(part) for part in reversed(first["loc"]) if str(part) in _OPTIONS), None)
    message = first["msg"].removeprefix("Value error, ")
    if field is None:
        return message
    value = first.get("input")
    shown = f" {value!r}" if isinstance(value, (int, float, str)) else ""
    return f"{_OPTIONS[field]}{shown}: {message}"


def explain(console: Console) -> None:
    from rich.table import Table

    table = Table(title="latlab metric definitions (all latencies in ms)", title_justify="left")
    table.add_column("metric")
    table.add_column("definition")
    for name, formula in FORMULAS.items():
        table.add_row(name, formula)
    console.print(table)


def run_command(config: BenchConfig, *, json_output: bool, progress: bool | None) -> int:
    """Run the bench, print the summary (or its JSON) and return the exit code."""
    from latlab.load.runner import BenchError, run_bench
    from latlab.report.console import print_summary

    out = Console()
    err = Console(stderr=True)
    show_progress = err.is_terminal if progress is None else progress
    try:
        result = run_bench(config, console=err, progress=show_progress, command=sys.argv)
    except (WorkloadError, ArrivalError, DatasetError) as e:
        err.print(f"latlab bench: error: {e}", markup=False, highlight=False)
        return EXIT_BAD_OPTIONS
    except BenchError as e:
        err.print(f"latlab bench: {e}", style="bold red", markup=False, highlight=False)
        return EXIT_FAILED_RUN
    except KeyboardInterrupt:
        err.print("latlab bench: interrupted (records written so far are kept)", style="yellow")
        return EXIT_INTERRUPTED
    with RunStore(config.out) as store:
        store.register(result.run.path, "bench", result.run.read_config(), result.summary)
    analysis = _explain(result.run, err)
    if json_output:
        findings = [f.to_json() for f in analysis.findings] if analysis else None
        sys.stdout.write(orjson.dumps(result.summary | {"run": str(result.run.path),
                                                        "findings": findings},
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_summary(out, result.summary, result.run.path)
        if analysis is not None:
            from latlab.report.console import print_budget, print_findings

            out.print()
            print_budget(out, analysis)
            out.print()
            print_findings(out, analysis, unevaluated=False)
            out.print(f"report: {analysis.run.report_path}")
    if result.message:
        err.print(f"latlab bench: {result.message}", style="bold red" if result.failed else "yellow",
                  markup=False, highlight=False)
    return EXIT_FAILED_RUN if result.failed else EXIT_OK


def _explain(run: RunFolder, err: Console) -> RunAnalysis | None:
    """Decompose and diagnose the finished run and write its report.html. The run folder is
    complete already: a failure here loses nothing and `latlab report` can redo it."""
    from latlab.analysis import analyze
    from latlab.report.html import write_html

    try:
        analysis = analyze(run)
        write_html(run, analysis)
    except Exception as e:  # noqa: BLE001 - the measurement is safe on disk; say what failed
        err.print(f"latlab bench: could not explain the run ({type(e).__name__}: {e}); "
                  f"try `latlab report {run.path}`", style="yellow", markup=False)
        return None
    return analysis
