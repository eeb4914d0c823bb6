"""An A/B: two settings, the identical workload against each, alternated A/B/A/B over rounds
so a noisy machine's drift hits both, until the headline metrics are decided; each metric's
change (`latlab compare`'s) and the server counters that explain it.

    done = run_ab(ABConfig(a="--model tiny", b="--model tiny --enable-prefix-caching"))
    comparison = compare_sides(done)
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from latlab.analysis import analyze
from latlab.analysis.ab import Sequential, counter_deltas, explain
from latlab.analysis.compare import Comparison
from latlab.analysis.run_analysis import RunAnalysis
from latlab.load.request.tls import ssl_context
from latlab.load.target.interrupts import remembered_interrupts
from latlab.load.telemetry.scrape import scrape_once
from latlab.records.ab import AB_JSON, SIDES, ABChange, ABConfig, ABRecord, ABRound
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder, write_json
from latlab.records.scrape import Scrape
from latlab.services.ab_servers import SideServers
from latlab.services.bench import run_bench
from latlab.services.errors import ServiceFailed

KEPT = ("each side ran every round on one server process: a lasting difference between the "
        "two processes counts as the setting's")


@dataclass
class ABRuns:
    """What the rounds left: each side's analysed rounds (their run folders), its /metrics
    before and after each, and the looks' verdicts."""

    folder: Path
    record: ABRecord
    sequential: Sequential
    scrapes: dict[str, list[tuple[Scrape, Scrape]]] = field(
        default_factory=lambda: {s: [] for s in SIDES})
    analyses: dict[str, list[RunAnalysis]] = field(
        default_factory=lambda: {s: [] for s in SIDES})
    comparison: Comparison | None = None  # the last look's


def run_ab(config: ABConfig, err: Console | None = None) -> ABRuns:
    """Run the rounds (A B, then B A, and so on: whatever going first or second does to a
    run cancels out) and write ab.json as they go; from `--rounds` on, look after each pair
    and stop once every headline metric is decided, or at `--max-rounds` / `--max-time`;
    first each side's `--warmup-rounds`, left out.
    Servers ab starts run each pair on fresh processes (`--fresh-servers every`), or every
    round on one a side (`never`): the first look says that then a lasting difference
    between the two processes counts as the setting's. Ctrl-C keeps what ran."""
    configs = config.sides()
    out = config.bench.out
    folder = RunFolder.create(out, "ab").path
    done = ABRuns(folder, ABRecord(created=time.time(), a=config.a, b=config.b),
                  Sequential(config, config.most_rounds, config.decide_on))
    record = done.record
    started = time.monotonic()
    with ExitStack() as stack:
        servers = stack.enter_context(SideServers(
            configs, folder, fresh=config.fresh_servers == "every", err=err))
        pressed = stack.enter_context(remembered_interrupts())
        try:
            start = servers.ready_for(1)
            for _ in range(config.warmup_rounds):
                for side in SIDES:
                    if err is not None:
                        err.print(f"warm-up round (not compared): {side}", style="dim")
                    _round(done, configs[side], side, 0, config, start)
                    if pressed():
                        raise KeyboardInterrupt
            for i in range(1, config.most_rounds + 1):
                start = servers.ready_for(i)
                for side in SIDES if i % 2 else SIDES[::-1]:  # ABBA: order effects cancel
                    if err is not None:
                        err.print(f"round {i} (of {config.rounds}, at most "
                                  f"{config.most_rounds}): {side}", style="dim")
                    _round(done, configs[side], side, i, config, start)
                    if pressed():  # a Ctrl-C Python swallowed during the round: stop now
                        raise KeyboardInterrupt
                if i < config.rounds:
                    continue
                out_of_time = time.monotonic() - started > config.max_time
                done.comparison = done.sequential.look(done.analyses["A"], done.analyses["B"],
                                                       final=out_of_time)
                open_ = Sequential.undecided(done.comparison, config.decide_on)
                look = f"round {i}: {Sequential.look_line(done.comparison, config.decide_on)}"
                if servers.kept and not record.looks:
                    look += f" ({KEPT})"
                record.looks.append(look)
                write_json(folder / AB_JSON, record)
                if err is not None:
                    err.print(look, style="dim", highlight=False)
                if not open_:
                    break
                if out_of_time and i < config.most_rounds:
                    record.looks.append(f"stopped after round {i}: --max-time "
                                        f"{config.max_time:g} s reached")
                    break
        except KeyboardInterrupt:
            record.interrupted = True
    return done


def _round(done: ABRuns, bench: BenchConfig, side: str, i: int, config: ABConfig,
           start: int | None) -> None:
    """One side's run of round `i` on its server's start `start` (None: a URL), its scrapes
    and its analysis, written to ab.json."""
    before = _scrape(bench)
    result = run_bench(bench, store=config.bench.out)
    after = _scrape(bench)
    if before is not None and after is not None and i:
        done.scrapes[side].append((before, after))
    s = result.summary
    done.record.rounds.append(ABRound(
        side=side, round=i, run=str(result.run.path), server_start=start,
        cached_share=s.cache.share if s.cache else None,
        host_other_cores=(s.client.host.other.mean if s.client and s.client.host else None)))
    write_json(done.folder / AB_JSON, done.record)
    if s.stop_reason == "interrupted":  # Ctrl-C the bench caught: its round is kept, not
        raise KeyboardInterrupt         # compared, and the finished rounds are
    if result.failed and i:  # a cold server's warm-up may fail: that is what it is for
        raise ServiceFailed(f"{side}, round {i}: {result.message}")
    if i:
        done.analyses[side].append(analyze(result.run, config.bench.slos or None,
                                           diagnosis=False))


def _scrape(config: BenchConfig) -> Scrape | None:
    """The target's /metrics now (the engine's behind a gateway, as bench scrapes it), or
    None when it has none."""
    key = None if config.server_url else config.key()  # a gateway's key stays with it
    try:
        tls = ssl_context(str(config.ca_cert) if config.ca_cert else None, config.insecure)
        return scrape_once((config.server_url or config.url).rstrip("/") + "/metrics",
                           {"Authorization": f"Bearer {key}"} if key else None, tls)
    except Exception:  # noqa: BLE001 - a server without /metrics has no counters to show
        return None


def compare_sides(done: ABRuns) -> Comparison:
    """The last look's comparison (a look over the rounds that ran when Ctrl-C came before
    one), with the record filled: the changes, the explaining counters (ab.json written)."""
    record, sequential = done.record, done.sequential
    rounds = min(len(done.analyses[side]) for side in SIDES)
    if done.comparison is None or sequential.previous != rounds:
        done.comparison = sequential.look(done.analyses["A"], done.analyses["B"])
    comparison = done.comparison
    record.workload_differences = comparison.workload_differences
    record.evidence, record.conditions = comparison.evidence, comparison.conditions
    record.changes = [ABChange(key=c.key, label=c.label, unit=c.unit, a=c.a, b=c.b,
                               low=c.interval.low if c.interval else None,
                               high=c.interval.high if c.interval else None,
                               confidence=c.interval.confidence if c.interval else None,
                               verdict=c.verdict, why=c.why,
                               decided_at=sequential.decided_at(c.key))
                      for c in comparison.changes]
    record.counters = {side: explain(counter_deltas(done.scrapes[side])) for side in SIDES}
    write_json(done.folder / AB_JSON, record)
    return comparison
