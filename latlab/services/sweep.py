"""A sweep: bench runs over request rates or concurrencies in one folder, and the answers.

    result = run_sweep(SweepConfig(base=BenchConfig(url=url, duration_s=20,
                                                    slos={"ttft": 500.0})))
    result.record.slo_max.load, result.path / "sweep.json"

Explicit `rates` (open loop) or `concurrencies` (closed loop) run in increasing order.
Without them the plan is automatic: the synchronous point (one user), the saturation probe
(a closed loop of `saturation_users`), then `points` open-loop rates spread evenly from the
synchronous rate (at most half the probe's throughput) up to the probe's throughput, then
×1.5 steps past it — each step only while the stop rule has not fired. A trace (`--trace`)
is swept at its explicit rates: each point replays it at the speed that gives that rate
(the window's mean rate × --trace-speed). Every point is a
complete bench run folder inside the sweep folder; sweep.json is rewritten after each, so
Ctrl-C keeps the points already measured. Without a URL one embedded engine serves them all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from latlab import __version__
from latlab.analysis import capacity
from latlab.analysis.capacity import PointLoad
from latlab.analysis.run_analysis import RunAnalysis
from latlab.analysis.slo_max import slo_max
from latlab.load import BenchError
from latlab.load.target.interrupts import remembered_interrupts
from latlab.load.target.launch import target_server
from latlab.load.workload.traces import survey
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder, write_json
from latlab.records.sweep import (
    SWEEP_JSON,
    Mode,
    Point,
    StopReason,
    SweepConfig,
    SweepRecord,
    SweepStop,
    SweepTarget,
)
from latlab.records.target import redact
from latlab.report.sweep_html import write_sweep_html
from latlab.services.bench import run_bench
from latlab.store import RunStore
from latlab.units import ms

ESCALATION = 1.5
MAX_ESCALATIONS = 3


@dataclass(frozen=True)
class Step:
    """One point of the plan: its folder name's stem, its label, mode and load, and its
    arrivals."""

    name: str
    point: PointLoad
    arrivals: ArrivalConfig


@dataclass
class SweepResult:
    path: Path
    record: SweepRecord

    @property
    def points(self) -> list[Point]:
        return self.record.points

    @property
    def stop_reason(self) -> str:
        return self.record.stop.reason


def run_sweep(config: SweepConfig, *, console: Console | None = None, progress: bool = False,
              command: Sequence[str] = ()) -> SweepResult:
    """Run the sweep to its stop rule, Ctrl-C or a failure, writing sweep.json after every
    point and the HTML report at the end. Raises `BenchError` when the target cannot be
    used (after writing what was measured)."""
    console = console or Console(stderr=True)
    folder = RunFolder.create(config.base.out, f"sweep-{config.base.name}").path
    sweep = Sweep(config, folder, list(command))

    def measure(bench: BenchConfig) -> RunAnalysis:
        result = run_bench(bench.model_copy(update={"url": url}), console=console,
                           progress=progress, command=sweep.command, store=config.base.out)
        if result.analysis is None:
            raise BenchError(f"could not analyse the point {result.run.path}")
        sweep.target.model = result.analysis.config.target.model
        return result.analysis

    with sweep.recording(config.base.out), ExitStack() as stack:
        url = config.base.url
        if url is None:
            console.print("starting the server for the whole sweep: " + (
                config.base.launch or "the embedded engine (latlab serve)") + "…",
                style="dim", markup=False, highlight=False)
            engine = stack.enter_context(target_server(
                config.base, folder / ("server.log" if config.base.launch else "engine.log")))
            url = engine.url
            sweep.target.url, sweep.target.engine_ready_s = url, engine.ready_s
        sweep.run(measure, console)
    return SweepResult(folder, sweep.record())


def plan(config: SweepConfig, points: list[Point]) -> Iterator[Step]:
    """The steps of the sweep; an automatic plan reads the points measured so far."""
    seed = config.base.workload.seed
    replayed = config.base.arrivals if config.base.arrivals.process == "trace" else None
    speed = trace_speed_per_rate(replayed, config.base.requests) if replayed is not None else None

    def rate(r: float) -> Step:
        if replayed is None:
            return Step(f"rate-{r:.3g}", PointLoad(f"{r:.3g} req/s", "rate", r),
                        config.arrivals(r, seed))
        return Step(f"rate-{r:.3g}", PointLoad(f"{r:.3g} req/s (trace ×{r * speed:.3g})",
                                               "rate", r),
                    replayed.model_copy(update={"trace_speed": r * speed}))

    def users(n: int, mode: Mode = "concurrency") -> Step:
        label = {"synchronous": "sync (1 user)", "throughput": f"probe ({n} users)"}
        return Step(f"{mode}-{n}", PointLoad(label.get(mode, f"{n} users"), mode,
                                             None if mode == "synchronous" else float(n)),
                    ArrivalConfig(process="closed", users=n, seed=seed))

    if config.rates is not None:
        yield from (rate(r) for r in sorted(set(config.rates)))
        return
    if config.concurrencies is not None:
        yield from (users(n) for n in sorted(set(config.concurrencies)))
        return
    yield users(1, "synchronous")
    yield users(config.saturation_users, "throughput")
    sync, probe = points[0].achieved, points[-1].achieved
    if probe <= 0:
        raise BenchError(f"the saturation probe completed no request "
                         f"({points[-1].run}): nothing to spread rates over")
    low = min(sync, probe / 2) if sync > 0 else probe / 2
    for r in np.linspace(low, probe, config.points + 1)[1:]:
        yield rate(float(r))
    for k in range(1, MAX_ESCALATIONS + 1):
        yield rate(probe * ESCALATION ** k)


def trace_speed_per_rate(arrivals: ArrivalConfig, requests: int | None) -> float:
    """The trace's speed per request/s: one over the window's mean rate at speed 1."""
    window = survey(arrivals.model_copy(update={"trace_speed": 1.0}), None, requests)
    if window.requests < 2 or window.span_s <= 0:
        raise BenchError(f"--trace {arrivals.trace}: its window has no rate to sweep "
                         f"({window.requests} requests over {window.span_s:g} s)")
    return window.span_s / window.requests


class Sweep:
    """A sweep folder's state: its points and stop, written to sweep.json after each point.
    `latlab sweep` measures the points (`run_sweep`); `latlab predict --sweep` simulates
    them: `run_point` takes the function that runs one."""

    def __init__(self, config: SweepConfig, folder: Path, command: list[str],
                 target: SweepTarget | None = None,
                 definitions: dict[str, str] | None = None) -> None:
        self.config = config
        self.folder = folder
        self.command = redact(command)
        self.created = time.time()
        self.points: list[Point] = []
        self.target = target or SweepTarget(
            url=config.base.url, model=config.base.model,
            embedded=config.base.url is None and config.base.launch is None,
            launch=config.base.launch,
            serve_args=redact(config.base.serve_args))
        self.definitions = definitions or {}
        self.stopped = SweepStop(reason="running", message="")

    def run_point(self, step: Step, run: Callable[[BenchConfig], RunAnalysis],
                  console: Console) -> Point:
        """Run `step` through `run` (its bench config → the point's analysis)."""
        base, arrivals = self.config.base, step.arrivals
        workers = (base.workers if arrivals.open_loop or base.workers == "auto"
                   else min(base.workers, arrivals.users))
        bench = BenchConfig(**{**dict(base), "out": self.folder, "arrivals": arrivals,
                               "name": f"p{len(self.points):02d}-{step.name}",
                               "workers": workers,
                               "tags": [*base.tags, f"sweep:{self.folder.name}"]})
        console.print(f"[bold]point {len(self.points) + 1}[/]: {step.point.label}")
        point = capacity.measure(run(bench), step.point, self.judging())
        if self.config.price_per_hour:
            point.cost = capacity.cost(self.config.price_per_hour, point.achieved,
                                       point.output_tokens_per_s)
        self.points.append(point)
        console.print(f"  achieved {point.achieved:.3g} req/s · p{self.config.percentile:g} E2E "
                      f"from schedule {ms(point.latency)} · errors "
                      f"{100 * point.error_rate:.1f}% · {Path(point.run).name}", style="dim")
        self.write()
        return point

    @contextmanager
    def recording(self, store: Path) -> Iterator[Sweep]:
        """Whatever happens inside: Ctrl-C stops the sweep as interrupted (the points so far
        kept), an error as failed (and goes on up); sweep.json and sweep.html are written and
        the folder registered in `store`'s run store."""
        try:
            yield self
        except KeyboardInterrupt:
            self.stop("interrupted", "interrupted (Ctrl-C): the points finished so far are kept")
        except BaseException as e:
            self.stop("failed", str(e))
            raise
        finally:
            self.finish()
            with RunStore(store) as runs:
                runs.register_sweep(self.folder)

    def run(self, run: Callable[[BenchConfig], RunAnalysis], console: Console) -> None:
        """Every step of the plan (`plan`) until the stop rule fires."""
        config = self.config
        with remembered_interrupts() as pressed:
            for step in plan(config, self.points):
                point = self.run_point(step, run, console)
                if pressed():  # a Ctrl-C Python swallowed during the point: stop now
                    raise KeyboardInterrupt
                if self.stop_after(point):
                    return
        if config.rates is not None or config.concurrencies is not None:
            self.stop("all_points", "every load given was run")
        else:
            self.stop("escalation_limit", f"not clearly saturated after {MAX_ESCALATIONS} "
                      f"steps of ×{ESCALATION} past the probe's throughput")

    def judging(self, ci: bool = True) -> capacity.Judging:
        return capacity.Judging(self.config.base.slos, self.config.percentile, ci)

    def stop_after(self, point: Point) -> StopReason | None:
        """Whether the sweep ends after `point` (and why)."""
        if point.interrupted:
            self.stop("interrupted", "interrupted (Ctrl-C): the points finished so far are kept")
            return "interrupted"
        if point.mode == "throughput":
            return None
        if message := capacity.too_many_errors(point, self.config.max_error_rate):
            self.stop("error_rate", message)
            return "error_rate"
        earlier = [p for p in self.points[:-1] if p.mode != "throughput"]
        if earlier and (message := capacity.saturation(earlier[-1], point)):
            self.stop("saturated", message)
            return "saturated"
        return None

    def stop(self, reason: StopReason, message: str) -> None:
        if self.stopped.reason == "running":
            self.stopped = SweepStop(reason=reason, message=message)

    def record(self) -> SweepRecord:
        c = self.config
        best = slo_max(self.points, c.base.slos, c.percentile)
        return SweepRecord(
            latlab_version=__version__, created=self.created, command=self.command,
            target=self.target,
            config=c.model_dump(mode="json", exclude={"base"}) | {
                "bench": c.base.model_dump(
                    mode="json", exclude=None if c.base.arrivals.trace else {"arrivals"})},
            percentile=c.percentile, slos=c.base.slos,
            definitions={"capacity": capacity.__doc__ or "", "stop_rule": capacity.STOP_RULE,
                         **self.definitions},
            points=self.points, curve=[p.label for p in capacity.curve(self.points)],
            knee=capacity.knee(self.points), slo_max=best,
            slo_max_cost=(capacity.cost(c.price_per_hour, best.achieved,
                                        best.output_tokens_per_s)
                          if c.price_per_hour and best and best.load is not None else None),
            price_per_hour=c.price_per_hour, stop=self.stopped)

    def write(self) -> None:
        write_json(self.folder / SWEEP_JSON, self.record())

    def finish(self) -> None:
        self.write()
        if self.points:
            write_sweep_html(self.folder, self.record())
