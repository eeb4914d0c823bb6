"""`latlab ab`: two settings, the identical workload against each, alternated A/B/A/B over
rounds so a noisy machine's drift hits both; every metric's change with its confidence
interval and attribution (`latlab compare`'s), and the server counters that explain it.

    latlab ab --a "--model tiny" --b "--model tiny --enable-prefix-caching" --prefix-tokens 512
    latlab ab --a http://127.0.0.1:8000 --b http://127.0.0.1:8001 --rate 4 --duration 30
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from latlab.analysis import analyze
from latlab.analysis.ab import counter_deltas, explain, pool
from latlab.analysis.compare import CompareError, Comparison
from latlab.analysis.compare import compare as compare_runs
from latlab.commands.bench import BenchOptions, run_bench
from latlab.commands.common import Interrupted, RunFailed, UsageError, console, print_json
from latlab.commands.groups import (ArrivalShape, ClientOptions, OutputOptions, SessionOptions,
                                    StopOptions, WorkloadOptions)
from latlab.commands.options import opt
from latlab.load.telemetry.scrape import scrape_once
from latlab.load.target.launch import EngineError, interrupt_on_sigterm, start_engine
from latlab.records.ab import AB_JSON, ABChange, ABRecord, ABRound
from latlab.records.config import BenchConfig
from latlab.records.folder import RunFolder, write_json
from latlab.records.scrape import Scrape
from latlab.report.comparison import print_comparison

SIDES = ("A", "B")


class ABOptions(ClientOptions, WorkloadOptions, SessionOptions, ArrivalShape, StopOptions,
                OutputOptions):
    a: str = opt(..., "Setting A: arguments for an embedded latlab serve, or a server URL "
                      "(http://HOST:PORT).", "--a")
    b: str = opt(..., "Setting B, the same way.", "--b")
    rounds: int = opt(3, "A/B pairs to run, alternating (each a full bench run per side).")
    users: int | None = opt(None, "Closed loop: N users (default: 4 without --rate).")
    rate: float | None = opt(None, "Open loop: requests per second.")
    json_output: bool = opt(False, "Print ab.json to stdout.", "--json")

    def configs(self) -> dict[str, BenchConfig]:
        """Each side's bench config: the same workload and arrivals, its own target."""
        if not 1 <= self.rounds <= 20:
            raise UsageError(f"--rounds {self.rounds}: expected 1 to 20")
        shared = self.model_dump(include=set(BenchOptions.model_fields))
        out = {}
        for side, setting in zip(SIDES, (self.a, self.b)):
            url = setting if setting.startswith(("http://", "https://")) else None
            options = BenchOptions(**shared | {"url": url,
                                               "serve_args": "" if url else setting})
            config = options.bench_config()
            config.name = f"ab-{side}-{self.name or 'run'}"
            config.tags = [*config.tags, f"ab:{side}"]
            out[side] = config
        return out


@dataclass
class ABRuns:
    """What the rounds left: each side's run folders and its /metrics before and after each."""

    folder: Path
    record: ABRecord
    runs: dict[str, list[RunFolder]] = field(default_factory=lambda: {s: [] for s in SIDES})
    scrapes: dict[str, list[tuple[Scrape, Scrape]]] = field(
        default_factory=lambda: {s: [] for s in SIDES})


def run_ab(configs: dict[str, BenchConfig], labels: dict[str, str], rounds: int, out: Path,
           err: Console | None = None) -> ABRuns:
    """Run the rounds (A then B, `rounds` times) and write ab.json as they go; embedded
    engines are started once per side and kept for every round. Ctrl-C keeps what ran."""
    folder = RunFolder.create(out, "ab").path
    done = ABRuns(folder, ABRecord(created=time.time(), a=labels["A"], b=labels["B"]))
    record = done.record
    with ExitStack() as stack:
        for side, config in configs.items():
            if config.url is None:
                if err is not None:
                    err.print(f"starting the embedded engine for {side}…", style="dim")
                try:
                    engine = start_engine(config.serve_args, log_path=folder / f"engine-{side}.log")
                except EngineError as e:
                    raise RunFailed(f"{side}: {e}") from None
                stack.callback(engine.stop)
                config.url = engine.url
        try:
            for i in range(1, rounds + 1):
                for side in SIDES:
                    if err is not None:
                        err.print(f"round {i} of {rounds}: {side}", style="dim")
                    before = _scrape(configs[side])
                    result = run_bench(configs[side], store=out)
                    after = _scrape(configs[side])
                    if before is not None and after is not None:
                        done.scrapes[side].append((before, after))
                    done.runs[side].append(result.run)
                    record.rounds.append(ABRound(side=side, round=i, run=str(result.run.path)))
                    write_json(folder / AB_JSON, record)
                    if result.failed:
                        raise RunFailed(f"{side}, round {i}: {result.message}")
        except KeyboardInterrupt:
            record.interrupted = True
    return done


def _scrape(config: BenchConfig) -> Scrape | None:
    """The target's /metrics now, or None when it has none."""
    key = config.api_key.get_secret_value() if config.api_key else None
    try:
        return scrape_once(config.url.rstrip("/") + "/metrics",
                           {"Authorization": f"Bearer {key}"} if key else None)
    except Exception:  # noqa: BLE001 - a server without /metrics has no counters to show
        return None


def compare_sides(done: ABRuns, slos: dict[str, float] | None) -> Comparison:
    """Pool each side's rounds, compare B against A, and fill the record with the changes
    and the explaining counters."""
    record = done.record
    analyses = {side: [analyze(run, slos, diagnosis=False) for run in done.runs[side]]
                for side in SIDES}  # compare reads no findings
    comparison = compare_runs(pool(analyses["A"]), pool(analyses["B"]))
    record.workload_differences = comparison.workload_differences
    record.changes = [ABChange(key=c.key, label=c.label, unit=c.unit, a=c.a, b=c.b,
                               ci_low=c.ci[0] if c.ci else None,
                               ci_high=c.ci[1] if c.ci else None,
                               significant=c.significant, verdict=c.verdict)
                      for c in comparison.changes]
    record.counters = {side: explain(counter_deltas(done.scrapes[side])) for side in SIDES}
    return comparison


def ab(options: ABOptions) -> None:
    """A/B two engine settings (or two servers) on the identical workload, alternating them
    over rounds; prints each metric's change, whether it is real, where it came from, and the
    server counters that explain it."""
    configs = options.configs()
    interrupt_on_sigterm()
    err = console(stderr=True)
    done = run_ab(configs, {"A": options.a, "B": options.b}, options.rounds, options.out, err)
    record, runs, folder = done.record, done.runs, done.folder
    if not all(runs[side] for side in SIDES):
        raise Interrupted("interrupted before both sides ran")
    try:
        comparison = compare_sides(done, options.slos() if options.slo else None)
    except CompareError as e:
        raise RunFailed(str(e)) from None
    write_json(folder / AB_JSON, record)
    if options.json_output:
        print_json(record.model_dump(mode="json") | {"folder": str(folder)})
    else:
        out = console()
        label = {side: f"{setting or 'latlab serve defaults'}  ({len(runs[side])} runs)"
                 for side, setting in (("A", options.a), ("B", options.b))}
        print_comparison(out, comparison, label["A"], label["B"])
        for side in SIDES:
            shown = " · ".join(f"{k} {_counter(k, v)}" for k, v in record.counters[side].items())
            if shown:
                out.print(f"server counters {side}: {shown}", highlight=False)
    err.print(f"ab folder: {folder} (ab.json; each round is a run folder)", highlight=False)
    if record.interrupted:
        raise Interrupted("interrupted: the rounds that finished are compared and kept")


def _counter(name: str, value: float) -> str:
    return f"{value:.0f}" if name == "preemptions" else f"{100 * value:.1f}%"
