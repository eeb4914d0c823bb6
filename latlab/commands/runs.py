"""`latlab runs`: the runs stored under a runs folder, newest first, with their key numbers."""

from __future__ import annotations

from pathlib import Path

from latlab.commands.common import UsageError, console
from latlab.commands.options import Options
from latlab.records.settings import setting
from latlab.report.comparison import print_runs
from latlab.store import KINDS, RunStore


class RunsOptions(Options):
    runs_dir: Path = setting(Path("runs"), "Runs folder holding the run store.")
    target: str | None = setting(None, "Only runs whose target URL contains this.")
    model: str | None = setting(None, "Only runs whose model contains this.")
    tag: str | None = setting(None, "Only runs with this tag.")
    kind: str | None = setting(None, "bench, sweep, coldstart, predict or observed.")
    limit: int = setting(30, "Show at most this many, newest first.")
    rescan: bool = setting(False, "First register run folders the store misses.")


def runs(options: RunsOptions) -> None:
    """List past runs with their key numbers; `latlab compare` takes their ids."""
    if options.kind is not None and options.kind not in KINDS:
        raise UsageError(f"--kind {options.kind!r}: expected one of {', '.join(KINDS)}")
    if options.limit < 1:
        raise UsageError(f"--limit {options.limit}: show at least one run")
    if options.runs_dir.exists() and not options.runs_dir.is_dir():
        raise UsageError(f"--runs-dir {options.runs_dir}: not a folder")
    if not options.runs_dir.exists():  # nothing stored, and listing creates nothing
        print_runs(console(), [], filtered=False)
        return
    with RunStore(options.runs_dir) as store:
        if options.rescan:
            store.rescan()
        print_runs(console(), store.list(target=options.target, model=options.model,
                                         tag=options.tag, kind=options.kind,
                                         limit=options.limit),
                   filtered=any((options.target, options.model, options.tag, options.kind)))
