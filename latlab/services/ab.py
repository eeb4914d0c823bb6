"""An A/B: two settings, the identical workload against each, alternated A/B/A/B over rounds
so a noisy machine's drift hits both; each metric's change (`latlab compare`'s) and the server
counters that explain it.

    done = run_ab(ABConfig(a="--model tiny", b="--model tiny --enable-prefix-caching"))
    comparison = compare_sides(done, slos=None)
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from latlab.analysis import analyze
from latlab.analysis.ab import counter_deltas, explain, pool
from latlab.analysis.compare import Comparison
from latlab.analysis.compare import compare as compare_runs
from latlab.analysis.noise import from_blocks, from_rounds
from latlab.load.target.launch import remembered_interrupts, target_server
from latlab.load.telemetry.scrape import scrape_once
from latlab.records.ab import AB_JSON, SIDES, ABChange, ABConfig, ABRecord, ABRound
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder, write_json
from latlab.records.scrape import Scrape
from latlab.services.bench import run_bench
from latlab.services.errors import ServiceFailed


@dataclass
class ABRuns:
    """What the rounds left: each side's run folders and its /metrics before and after each."""

    folder: Path
    record: ABRecord
    runs: dict[str, list[RunFolder]] = field(default_factory=lambda: {s: [] for s in SIDES})
    scrapes: dict[str, list[tuple[Scrape, Scrape]]] = field(
        default_factory=lambda: {s: [] for s in SIDES})


def run_ab(config: ABConfig, err: Console | None = None) -> ABRuns:
    """Run the rounds (A B, then B A, and so on: whatever going first or second does to a
    run cancels out) and write ab.json as they go; embedded engines are started once per
    side and kept for every round. Ctrl-C keeps what ran."""
    configs = config.sides()
    out = config.bench.out
    folder = RunFolder.create(out, "ab").path
    done = ABRuns(folder, ABRecord(created=time.time(), a=config.a, b=config.b))
    record = done.record
    with ExitStack() as stack:
        for side, bench in configs.items():
            if bench.url is None:
                if err is not None:
                    err.print(f"starting the server for {side}…", style="dim")
                launched = "server" if bench.launch else "engine"
                engine = stack.enter_context(target_server(
                    bench, folder / f"{launched}-{side}.log",
                    name=f"{side}'s {'server' if bench.launch else 'latlab serve'}"))
                bench.url = engine.url
        pressed = stack.enter_context(remembered_interrupts())
        try:
            for i in range(1, config.rounds + 1):
                for side in SIDES if i % 2 else SIDES[::-1]:  # ABBA: order effects cancel
                    if err is not None:
                        err.print(f"round {i} of {config.rounds}: {side}", style="dim")
                    before = _scrape(configs[side])
                    result = run_bench(configs[side], store=out)
                    after = _scrape(configs[side])
                    if before is not None and after is not None:
                        done.scrapes[side].append((before, after))
                    done.runs[side].append(result.run)
                    s = result.summary
                    record.rounds.append(ABRound(
                        side=side, round=i, run=str(result.run.path),
                        cached_share=s.cache.share if s.cache else None,
                        host_other_cores=(s.client.host.other.mean
                                          if s.client and s.client.host else None)))
                    write_json(folder / AB_JSON, record)
                    if pressed():  # a Ctrl-C Python swallowed during the round: stop now
                        raise KeyboardInterrupt
                    if result.failed:
                        raise ServiceFailed(f"{side}, round {i}: {result.message}")
        except KeyboardInterrupt:
            record.interrupted = True
    return done


def _scrape(config: BenchConfig) -> Scrape | None:
    """The target's /metrics now, or None when it has none."""
    key = config.key()
    try:
        return scrape_once(config.url.rstrip("/") + "/metrics",
                           {"Authorization": f"Bearer {key}"} if key else None)
    except Exception:  # noqa: BLE001 - a server without /metrics has no counters to show
        return None


def compare_sides(done: ABRuns, config: ABConfig) -> Comparison:
    """Pool each side's rounds, compare B against A with the spread of each side's rounds as
    the noise (each round's own drift when a side ran once), and fill the record with the
    changes and the explaining counters (ab.json is written)."""
    record = done.record
    slos = config.bench.slos or None
    analyses = {side: [analyze(run, slos, diagnosis=False) for run in done.runs[side]]
                for side in SIDES}  # compare reads no findings
    noise = from_rounds([analyses[side] for side in SIDES]) or from_blocks(
        [a for side in SIDES for a in analyses[side]])
    comparison = compare_runs(pool(analyses["A"]), pool(analyses["B"]), noise=noise,
                              verdicts=config)
    record.workload_differences = comparison.workload_differences
    record.noise, record.conditions = comparison.noise_source, comparison.conditions
    record.changes = [ABChange(key=c.key, label=c.label, unit=c.unit, a=c.a, b=c.b,
                               ci_low=c.ci[0] if c.ci else None,
                               ci_high=c.ci[1] if c.ci else None,
                               significant=c.significant, noise=c.noise, verdict=c.verdict,
                               why_same=c.why_same if c.verdict == "same" else None)
                      for c in comparison.changes]
    record.counters = {side: explain(counter_deltas(done.scrapes[side])) for side in SIDES}
    write_json(done.folder / AB_JSON, record)
    return comparison
