"""What `latlab tune` prints: the setting to use with its measured effect, every candidate
screened (predicted goodput and its gain's interval, or one real run's for a setting the
simulation has not seen), what ab measured of the verified ones, and where the simulation and
the measurement disagree."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from latlab.records.tune import Candidate, TuneRecord

SHOWN = 12  # candidates in the table, best predicted first


def print_tune(out: Console, r: TuneRecord) -> None:
    slos = ", ".join(f"{k} ≤ {v:g}" for k, v in r.slos.items())
    start = r.start or "(the defaults)"
    out.print(Text.assemble(("latlab tune", "bold"), f" of {r.server or 'the server'}: "
                            f"goodput under {slos}; started from {start} "
                            f"({_rate(r.start_goodput)} measured, {_rate(r.start_predicted)} "
                            "simulated)"), highlight=False)
    best = next((c for c in r.candidates if c.args == r.best), None)
    if best is not None:
        gain = (best.measured - best.measured_start) / best.measured_start \
            if best.measured_start else None
        out.print(Text.assemble(("use: ", "bold green"), (best.args, "bold"),
                                f" — goodput {_rate(best.measured_start)} → "
                                f"{_rate(best.measured)}"
                                + (f" ({100 * gain:+.0f}%)" if gain is not None else "")
                                + " measured with ab"), highlight=False)
    elif not r.start_goodput and not any(c.predicted > 0 for c in r.candidates):
        out.print(Text("no request met the SLOs, at the start or in screening: nothing to rank "
                       "(a longer --duration, or SLOs the server can meet)", style="bold"))
    elif not any(c.change > 0 for c in r.candidates):
        out.print(Text("no setting gained goodput in screening: keep the start", style="bold"))
    elif not any(c.verdict is not None for c in r.candidates):
        out.print(Text("no setting was measured (--verify 0, or the budget ran out): the "
                       "predictions below are untested", style="bold"))
    else:
        unsure = [c for c in r.candidates if c.verdict == "can't tell"]
        out.print(Text("no setting measured better than the start: keep it"
                       + (f" (ab could not tell for {len(unsure)}: more --rounds would)"
                          if unsure else ""), style="bold"))
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for i, column in enumerate(("setting", "screened req/s", "gain (90% interval)",
                                "measured start → it", "ab", "")):
        table.add_column(column, justify="left" if i in (0, 5) else "right")
    for c in r.candidates[:SHOWN]:
        if c.screened == "run":
            screened, gain = f"{c.predicted:.2f} (run)", f"{c.change:+.2f} (one run)"
        else:
            screened = f"{c.predicted:.2f}"
            gain = (f"{c.change:+.2f} ({c.change_lo:+.2f}…{c.change_hi:+.2f})"
                    if c.change_lo is not None and c.change_hi is not None
                    else f"{c.change:+.2f} (no interval)")
        table.add_row(c.args, screened, gain, _measured(c), c.verdict or "–", _agreement(c))
    out.print(table)
    if len(r.candidates) > SHOWN:
        out.print(f"  … {len(r.candidates) - SHOWN} more in tune.json", style="dim")
    unseen = [c for c in r.candidates if c.screened == "run"]
    if unseen:
        out.print(f"  (run): not simulated — {unseen[0].unseen}; measured in one run of the "
                  "workload instead, against the measured start", style="dim", highlight=False,
                  markup=False)
    for note in r.notes:
        out.print(f"  note: {note}", style="dim", highlight=False, markup=False)
    out.print(f"screened {len(r.candidates)} settings, verified "
              f"{sum(c.verdict is not None for c in r.candidates)} in {r.wall_s:.0f} s",
              style="dim")


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} req/s"


def _measured(c: Candidate) -> str:
    if c.measured is None:
        return "–"
    return f"{c.measured_start or 0:.2f} → {c.measured:.2f}"


def _agreement(c: Candidate) -> Text:
    if c.agrees is None:
        return Text("")
    if c.agrees:
        return Text("as predicted", style="green")
    gain = (c.measured or 0) - (c.measured_start or 0)
    side = "more" if gain > (c.change_hi or 0.0) else "less"
    return Text(f"simulation disagrees: measured {gain:+.2f} req/s, {side} than predicted",
                style="yellow")
