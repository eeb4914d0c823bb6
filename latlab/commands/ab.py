"""`latlab ab`: options → `ABConfig` → `run_ab` → each metric's change → exit code.

    latlab ab --a "--model tiny" --b "--model tiny --enable-prefix-caching" --prefix-tokens 512
    latlab ab --a http://127.0.0.1:8000 --b http://127.0.0.1:8001 --rate 4 --duration 30
"""

from __future__ import annotations

from latlab.analysis.compare import CompareError
from latlab.commands.common import Interrupted, RunFailed, console, print_json
from latlab.commands.options import NamedWorkload, parse_args
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.records.ab import SIDES, ABConfig, ABRound
from latlab.records.engine import ServeConfig
from latlab.report.comparison import print_comparison
from latlab.services.ab import compare_sides, run_ab

# Each side names its own target with --a/--b.
NOT_TAKEN = frozenset({"bench.url", "bench.serve_args"})


def ab(config: ABConfig, options: NamedWorkload) -> None:
    """A/B two engine settings (or two servers) on the identical workload, alternating them
    over rounds; prints each metric's change, whether it is real, where it came from, and the
    server counters that explain it."""
    interrupt_on_sigterm()
    if config.bench.launch is None:  # a side's latlab serve options, checked before any start
        for side, bench in config.sides().items():
            if bench.url is None:
                parse_args(ServeConfig, bench.serve_args, f"--{side.lower()}")
    err = console(stderr=True)
    done = run_ab(config, err)
    record, folder = done.record, done.folder
    if not all(done.analyses[side] for side in SIDES):
        raise Interrupted("interrupted before both sides ran")
    try:
        comparison = compare_sides(done)
    except CompareError as e:
        raise RunFailed(str(e)) from None
    if options.json_output:
        print_json(record.model_dump(mode="json") | {"folder": str(folder)})
    else:
        out = console()
        defaults = "--launch's defaults" if config.bench.launch else "latlab serve defaults"
        label = {side: f"{setting or defaults}  ({len(done.analyses[side])} runs)"
                 for side, setting in (("A", config.a), ("B", config.b))}
        print_comparison(out, comparison, label["A"], label["B"])
        out.print("rounds: " + " · ".join(_round(r) for r in record.rounds), highlight=False)
        for look in record.looks:
            out.print(f"[dim]look after {look}[/]", highlight=False)
        for side in SIDES:
            shown = " · ".join(f"{k} {_counter(k, v)}" for k, v in record.counters[side].items())
            if shown:
                out.print(f"server counters {side}: {shown}", highlight=False)
    err.print(f"ab folder: {folder} (ab.json; each round is a run folder)", highlight=False)
    if record.interrupted:
        raise Interrupted("interrupted: the rounds that finished are compared and kept")


def _round(r: ABRound) -> str:
    """A round in a few words: its side and number, the cache's share, the host's others."""
    cache = f"cache {100 * r.cached_share:.0f}%" if r.cached_share is not None else "cache ?"
    host = (f", host others {r.host_other_cores:.1f} cores"
            if r.host_other_cores is not None else "")
    return f"{r.side}{r.round or ' warm-up'} {cache}{host}"


def _counter(name: str, value: float) -> str:
    return f"{value:.0f}" if name == "preemptions" else f"{100 * value:.1f}%"
